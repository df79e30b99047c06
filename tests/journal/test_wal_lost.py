"""A SQLite journal whose ``-wal`` was lost is never made anew beside its old keys.

A writer SIGKILLed with DISPATCH_STARTED durable only in its ``-wal`` (no checkpoint yet: the
schema is there too); the ``-wal`` and ``-shm`` then lost (removed, a backup that copied the
main file alone).  ``verify`` said JOURNAL_UNREADABLE, but the next writer's open made the schema
anew and signed with the key files still beside it: ``verify`` then said "intact: 0 events", a
same-key call sent the POST again, and start-up compaction would delete the sealed segment files
no row named any more.  Now the open is refused (``JournalLost``, ``JOURNAL_LOST`` on the command
line, one line naming the files and what to do), nothing is created; a journal made anew there
takes moving those files away first, and a new journal's first open is unchanged.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from affidavit.journal import Journal, JournalError, JournalLost
from affidavit.journal.sealing import BrokerKey
from affidavit.journal.signing import SigningKey
from tests.broker.helpers import TOKEN_ENV, http_target, run_cli, write_config

from .helpers import happy

CHILD = Path(__file__).parent / "child.py"
LIMIT = 60.0  # seconds: the child's whole run is bounded by it


def _tables(db: Path) -> list[str]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    finally:
        conn.close()


def _killed_with_dispatch_in_the_wal(db: Path) -> None:
    """The crash child appends the happy path one barrier at a time; killed once
    DISPATCH_STARTED is durable (in the ``-wal``)."""
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), "crash", str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        while True:
            line = proc.stdout.readline()
            assert line, f"child exited early: {proc.stderr.read() if proc.stderr else ''}"
            if line.split()[-1] == "DISPATCH_STARTED":
                break
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=LIMIT)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def lost(tmp_path: Path) -> Path:
    """A journal killed mid-call, its ``-wal`` and ``-shm`` then lost."""
    db = tmp_path / "j.db"
    _killed_with_dispatch_in_the_wal(db)
    assert Path(f"{db}-wal").stat().st_size > 0
    os.unlink(f"{db}-wal")
    os.unlink(f"{db}-shm")
    assert "events" not in _tables(db)  # the schema went with the -wal
    return db


async def test_a_journal_whose_wal_was_lost_is_refused_not_made_anew(lost: Path) -> None:
    key = Path(f"{lost}.key").read_bytes()
    with pytest.raises(JournalLost) as refused:
        async with Journal.open(lost):
            pass
    msg = str(refused.value)
    assert refused.value.code == "JOURNAL_LOST"
    assert f"{lost}.key" in msg and f"{lost}.signing.key" in msg and "-wal" in msg
    assert "move them away" in msg
    assert "events" not in _tables(lost)  # nothing was created
    assert Path(f"{lost}.key").read_bytes() == key
    public = refused.value.public
    assert public is not None and str(lost.parent) not in public  # a caller sees no path


def test_the_command_line_answers_journal_lost_in_one_line(lost: Path) -> None:
    """An embedded ``affidavit call`` (as ``serve``, every writer's open): refused before any
    request is made -- the target's port is never reached."""
    cfg = write_config(
        lost.parent, {"api": http_target("http://127.0.0.1:9")}, journal={"path": str(lost)}
    )
    action = lost.parent / "action.json"
    action.write_text(json.dumps({"target": "api", "method": "POST", "path": "/x", "body": "a"}))
    out = run_cli("call", "--config", str(cfg), str(action), env={TOKEN_ENV: "t0ken"})
    err = out.stderr.decode()
    assert out.returncode == 2, err
    assert "JOURNAL_LOST" in err and f"{lost}.key" in err
    assert "Traceback" not in err
    assert "events" not in _tables(lost)


async def test_segment_files_beside_a_file_with_no_schema_are_refused_too(tmp_path: Path) -> None:
    """A journal whose key files are configured elsewhere still leaves its long results'
    segment files beside it: those alone refuse a new schema in a file SQLite wrote before
    (WAL mode is in its header from the first open: a lost -wal leaves at least that)."""
    db = tmp_path / "j.db"
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.close()
    assert db.stat().st_size >= 4096
    segments = Path(f"{db}.results")
    segments.mkdir(mode=0o700)
    (segments / "seg-1").write_bytes(b"sealed")
    with pytest.raises(JournalLost, match=r"j\.db\.results"):
        async with Journal.open(db, key_file=tmp_path / "k", signing_key=tmp_path / "s"):
            pass
    assert (segments / "seg-1").read_bytes() == b"sealed"


async def test_a_new_journal_is_made_once_the_old_files_are_moved_away(lost: Path) -> None:
    old = lost.parent / "old"
    old.mkdir()
    for suffix in (".key", ".signing.key"):
        os.rename(f"{lost}{suffix}", old / f"j.db{suffix}")
    async with Journal.open(lost) as j:
        await j.append(happy("inv-2")[0])
        assert j.verify().ok


async def test_a_new_journal_and_its_reopening_are_unchanged(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    async with Journal.open(db) as j:
        await j.append(happy("inv-1")[0])
    async with Journal.open(db) as j:
        assert [e.kind for e in j.events("inv-1")] == [happy("inv-1")[0].kind]


async def test_a_failed_first_open_leaves_no_key_file_and_the_retry_opens(tmp_path: Path) -> None:
    """The first open made ``<path>.key`` and then failed (its signing key's directory is not
    there): the rollback takes the key file it made with it -- nothing recorded its id -- so
    the corrected open is a first open, not a journal whose -wal was lost."""
    db = tmp_path / "j.db"
    with pytest.raises(JournalError, match="signing key"):
        async with Journal.open(db, signing_key=tmp_path / "nodir" / "s.key"):
            pass
    assert not Path(f"{db}.key").exists()
    async with Journal.open(db) as j:
        await j.append(happy("inv-1")[0])
        assert j.verify().ok


async def test_a_failed_first_open_leaves_a_key_file_put_in_place_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rollback removes only the file it created: one another journal sharing the key path
    put there meanwhile (renamed over it) is that journal's key, and stays."""
    db = tmp_path / "j.db"
    theirs = tmp_path / "theirs.key"
    BrokerKey.create(theirs)
    kept = theirs.read_bytes()

    def replaced_then_fail(path: Path, made: object = None) -> SigningKey:
        os.replace(theirs, f"{db}.key")  # (the sealing key this open made, replaced)
        raise JournalError("cannot create signing key file: injected")

    monkeypatch.setattr(SigningKey, "create", replaced_then_fail)
    with pytest.raises(JournalError, match="injected"):
        async with Journal.open(db):
            pass
    assert Path(f"{db}.key").read_bytes() == kept


async def test_key_files_placed_before_the_first_open_are_used(tmp_path: Path) -> None:
    """Key files an operator made at the default paths before the journal's first start are
    the journal's keys ("created 0600 if absent"): not refused as a lost journal's."""
    db = tmp_path / "j.db"
    key = BrokerKey.create(Path(f"{db}.key"))
    signer = SigningKey.create(Path(f"{db}.signing.key"))
    async with Journal.open(db) as j:
        await j.append(happy("inv-1")[0])
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        meta = dict(conn.execute("SELECT name, value FROM meta").fetchall())
    finally:
        conn.close()
    assert meta["key_id"] == key.key_id and meta["signing_key_id"] == signer.key_id
