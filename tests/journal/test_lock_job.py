"""An owner holding the writer lock for one job (``affidavit journal migrate``:
``WriterLock.acquire(job=True)``) says so in the lock: a writer it refuses -- embedded, or a
daemon starting -- is told the journal is busy with that job and to wait for it, never to ask
a daemon on its socket (there is none).  A description without the mark -- a daemon's, and
every one an earlier affidavit wrote -- still reads as a daemon's."""

from __future__ import annotations

from pathlib import Path

import pytest

from affidavit.journal import Journal, JournalLocked
from affidavit.journal.lock import JOB, WriterLock, lock_path

JOB_HOLDER = "affidavit journal migrate (pid 4242, copying it to a shared journal)"
DAEMON = "affidavit serve (pid 1) on /run/affidavit/affidavit.sock"


@pytest.mark.parametrize("owner", [None, DAEMON], ids=["embedded", "daemon"])
async def test_a_writer_refused_by_a_job_is_told_to_wait_for_it_not_to_ask_a_daemon(
    tmp_path: Path, owner: str | None
) -> None:
    db = tmp_path / "j.db"
    held = WriterLock.acquire(db, JOB_HOLDER, job=True)
    try:
        assert lock_path(db).read_text() == JOB + JOB_HOLDER
        with pytest.raises(JournalLocked) as info:
            async with Journal.open(db, owner=owner):
                pass
    finally:
        held.release()
    assert (info.value.owner, info.value.job) == (JOB_HOLDER, True)
    assert str(info.value) == (
        f"journal {db} is busy: {JOB_HOLDER} holds it for that one job; wait for it to "
        "finish, then try again"
    )
    async with Journal.open(db, owner=owner):  # the job done, the writer opens it
        pass


async def test_a_lock_text_without_the_mark_still_names_a_daemon(tmp_path: Path) -> None:
    """An earlier affidavit's daemon wrote its description alone: read as before."""
    db = tmp_path / "j.db"
    held = WriterLock.acquire(db, DAEMON)
    try:
        assert lock_path(db).read_text() == DAEMON
        with pytest.raises(JournalLocked) as info:
            async with Journal.open(db):
                pass
    finally:
        held.release()
    assert (info.value.owner, info.value.job) == (DAEMON, False)
    assert "ask the daemon on its socket" in str(info.value)
