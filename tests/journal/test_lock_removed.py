"""A writer lock removed or replaced keeps no second owner unaware beside a live one.

``<journal>.lock`` is a flock: the file a holder locked.  Deleted while a daemon ran, the next
owner's start created a new file at the path, locked it, and its recovery closed the daemon's
live call ATTEMPT_INTERRUPTED while the daemon went on writing.  Now every writer transaction
checks that the lock it holds is still the file at the path (one ``stat`` beside the journal
file's), and refuses with ``JournalReplaced`` (JOURNAL_REPLACED, nothing written) once it is
not; and a writer that takes the lock checks the same after its flock -- a lock replaced between
its open and its flock is taken again (a bounded number of times), never held while another
file keeps the path.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.journal import Journal, JournalError, JournalLocked, JournalReplaced
from affidavit.journal import lock as lock_module
from affidavit.journal.lock import WriterLock, lock_path

from .helpers import happy

OWNER = "affidavit serve (pid 1) on /run/affidavit/affidavit.sock"


@pytest.mark.parametrize("how", ["removed", "replaced"])
async def test_an_owner_whose_lock_was_removed_writes_nothing_more(
    tmp_path: Path, how: str
) -> None:
    db = tmp_path / "j.db"
    first, second = happy("inv-1")[:2]
    async with Journal.open(db, owner=OWNER) as j:
        await j.append(first)
        path = lock_path(db)
        os.unlink(path)
        if how == "replaced":
            path.write_bytes(b"")  # another process's new lock, there now
        with pytest.raises(JournalReplaced) as refused:
            await j.append(second)
        assert str(path) in str(refused.value) and "JOURNAL_REPLACED" in str(refused.value)
        assert [e.kind for e in j.events("inv-1")] == [first.kind]  # nothing written


async def test_an_embedded_writer_whose_lock_was_removed_writes_nothing_more(
    tmp_path: Path,
) -> None:
    """A shared holder too: a daemon may have taken the new lock file exclusive since."""
    db = tmp_path / "j.db"
    async with Journal.open(db) as j:
        os.unlink(lock_path(db))
        with pytest.raises(JournalReplaced):
            await j.append(happy("inv-1")[0])


def _flock_after(act: Callable[[Path], None], path: Path, times: int) -> Callable[..., None]:
    """``fcntl.flock`` that first runs ``act`` on the lock's path, the first ``times`` calls:
    another process removing (or replacing) it between this writer's open and its flock."""
    real = fcntl.flock
    calls = {"n": 0}

    def flock(fd: int, op: int) -> None:
        calls["n"] += 1
        if calls["n"] <= times:
            act(path)
        real(fd, op)

    return flock


def _replace(path: Path) -> None:
    os.unlink(path)
    path.write_bytes(b"")


async def test_a_lock_replaced_while_it_is_taken_is_taken_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "j.db"
    path = lock_path(db)
    monkeypatch.setattr(lock_module.fcntl, "flock", _flock_after(_replace, path, 1))
    held = WriterLock.acquire(db, owner=OWNER)
    monkeypatch.undo()
    try:
        assert held.in_place()  # the file at the path, not the one it first opened
        with pytest.raises(JournalLocked):  # so it keeps a second owner out
            WriterLock.acquire(db, owner="a second daemon")
    finally:
        held.release()


async def test_a_lock_removed_each_time_it_is_taken_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "j.db"
    path = lock_path(db)
    monkeypatch.setattr(lock_module.fcntl, "flock", _flock_after(os.unlink, path, 1_000))
    with pytest.raises(JournalError, match="replaced or removed each time"):
        WriterLock.acquire(db, owner=OWNER)


@pytest.mark.parametrize("what", ["lock", "file"])
async def test_a_lock_or_file_replaced_while_waiting_for_the_write_lock_writes_nothing(
    tmp_path: Path, what: str
) -> None:
    """The check is made again under SQLite's write lock: a lock (or journal file) replaced
    after the check before ``BEGIN IMMEDIATE`` and before that transaction got the write lock
    -- while another connection held it -- is seen before anything is written."""
    db = tmp_path / "j.db"
    first, second = happy("inv-1")[:2]
    async with Journal.open(db, owner=OWNER) as j:
        await j.append(first)
        backend: Any = j.backend
        checked = threading.Event()
        check = backend._require_lock

        def noted(failed: type[JournalError]) -> None:
            check(failed)
            checked.set()

        backend._require_lock = noted
        blocker = sqlite3.connect(db, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # the write lock, held
        try:
            async with trio.open_nursery() as nursery:

                async def append() -> None:
                    with pytest.raises(JournalReplaced):
                        await j.append(second)

                nursery.start_soon(append)
                # The check before BEGIN IMMEDIATE is the sign that the append now waits for the
                # lock.  Bounded here: the thread's wait cannot be cancelled, and without that
                # check the append would wait for the blocker, which waits for the sign.
                if not await trio.to_thread.run_sync(checked.wait, 10):
                    blocker.execute("ROLLBACK")
                    pytest.fail("no writer-lock check before BEGIN IMMEDIATE within 10 s")
                if what == "lock":
                    os.unlink(lock_path(db))
                else:
                    (tmp_path / "other").write_bytes(b"")
                    os.rename(tmp_path / "other", db)
                blocker.execute("ROLLBACK")
        finally:
            blocker.close()
        assert [e.kind for e in j.events("inv-1")] == [first.kind]  # nothing written


async def test_a_held_lock_files_times_are_kept_fresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An age-based cleaner of a temporary directory (systemd-tmpfiles) removes a file whose
    times have not moved for days: a held lock's are touched every ``FRESH_EVERY`` seconds
    (60; shortened here), and no longer once it is let go."""
    monkeypatch.setattr(lock_module, "FRESH_EVERY", 0.02)
    db = tmp_path / "j.db"
    path = lock_path(db)
    async with Journal.open(db, owner=OWNER):
        os.utime(path, (1_000_000, 1_000_000))  # days old
        with trio.fail_after(10):
            while path.stat().st_mtime == 1_000_000:
                await trio.sleep(0.01)
        assert path.stat().st_atime > 1_000_000
    os.utime(path, (1_000_000, 1_000_000))
    await trio.sleep(0.1)
    assert path.stat().st_mtime == 1_000_000  # let go: not touched any more
