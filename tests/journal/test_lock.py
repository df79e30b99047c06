"""The writer lock (journal/lock.py): embedded writers share a journal, an owner (the daemon)
holds it alone, readers are never stopped, and a killed owner leaves no lock behind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import trio

from affidavit.journal import Journal, JournalLocked, JournalReader

OWNER = "affidavit serve (pid 1) on /run/affidavit/affidavit.sock"


async def test_embedded_writers_share_a_journal(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    async with Journal.open(db), Journal.open(db):
        pass


async def test_an_owner_is_refused_while_an_embedded_writer_has_the_journal_open(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    async with Journal.open(db):
        with pytest.raises(JournalLocked) as info:
            async with Journal.open(db, owner=OWNER):
                pass
    assert "is open in another process" in str(info.value)
    async with Journal.open(db, owner=OWNER):  # once it closed, the owner may open it
        pass


async def test_a_writer_is_refused_while_the_owner_holds_the_journal_and_told_where_to_go(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    async with Journal.open(db, owner=OWNER):
        with pytest.raises(JournalLocked) as info:
            async with Journal.open(db):
                pass
        with JournalReader.open(db) as reader:  # a reader is never stopped
            assert reader.list_actions() == []
    assert info.value.owner == OWNER
    assert str(info.value) == (
        f"journal {db} is owned by {OWNER}: ask the daemon on its socket "
        "(--socket or $AFFIDAVIT_SOCKET) instead of opening the journal"
    )
    async with Journal.open(db):  # the owner gone, writers are welcome again
        pass


HOLD = """
import sys, time
from pathlib import Path
from affidavit.journal.lock import WriterLock
WriterLock.acquire(Path(sys.argv[1]), owner="a daemon that will be killed")
print("held", flush=True)
time.sleep(60)
"""


async def test_a_killed_owner_leaves_no_lock_behind(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(db)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"held\n"
        with pytest.raises(JournalLocked, match="a daemon that will be killed"):
            async with Journal.open(db):
                pass
    finally:
        proc.kill()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
    with trio.fail_after(10):
        async with Journal.open(db):
            pass


CHURN = """
import sys, time
from pathlib import Path
from affidavit.journal import JournalLocked
from affidavit.journal.lock import WriterLock
refused, end = 0, time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    try:
        WriterLock.acquire(Path(sys.argv[1])).release()
    except JournalLocked:
        refused += 1
print(refused)
"""


def test_embedded_writers_opening_and_closing_at_once_never_refuse_each_other(
    tmp_path: Path,
) -> None:
    """Two processes take and drop the shared lock as fast as they can for a second.  Before,
    a shared holder took the lock exclusive for an instant on its way out (to clear a
    description only an owner writes), and the other, opening then, was refused as if a daemon
    owned the journal (seen as a flaky `affidavit call` exiting 2 beside another)."""
    db = tmp_path / "j.db"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHURN, str(db), "1.0"], stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    refused = [int(p.communicate(timeout=60)[0]) for p in procs]
    assert refused == [0, 0]


async def test_a_killed_owners_description_is_cleared_by_the_next_writer(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    Path(f"{db}.lock").write_text(OWNER)  # what a SIGKILLed owner leaves
    async with Journal.open(db):
        assert Path(f"{db}.lock").read_text() == ""
    async with Journal.open(db, owner=OWNER):
        assert Path(f"{db}.lock").read_text() == OWNER
    assert Path(f"{db}.lock").read_text() == ""  # an owner clears its own on the way out
