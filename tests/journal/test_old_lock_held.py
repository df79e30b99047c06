"""``<link>.lock`` -- where an earlier affidavit locked a journal opened through a link -- is
held, when it is there, for as long as the lock itself, in the lock's own mode.

It was probed: taken and let go at once.  An earlier writer starting in that instant was
refused though no one would hold the journal (the reviewer's probe2.py: 461 in 3000 starts of a
daemon), and a daemon of that version started after the new writer took ``<link>.lock``
unopposed -- two writers, each holding a lock of its own.  Flocks here are taken in this
process on descriptors of their own, as another process's would conflict."""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

import pytest
import trio

from affidavit.journal import Journal, JournalLocked
from affidavit.journal.lock import WriterLock


def _open_and_close(db: Path) -> None:
    async def run() -> None:
        async with Journal.open(db):
            pass

    trio.run(run)


@pytest.fixture
def linked(tmp_path: Path) -> Path:
    """A link ``links/j.db`` to the journal ``data/j.db``, with an earlier version's leftover
    ``links/j.db.lock`` beside it (nobody holding it)."""
    (tmp_path / "data").mkdir()
    (tmp_path / "links").mkdir()
    _open_and_close(tmp_path / "data" / "j.db")
    link = tmp_path / "links" / "j.db"
    link.symlink_to(tmp_path / "data" / "j.db")
    Path(f"{link}.lock").write_bytes(b"")
    return link


def _old_style(path: Path, mode: int) -> str | None:
    """What an earlier affidavit starting now would get on ``path``: ``None`` when it takes
    the lock (let go at once), else the text it would name as the holder."""
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 4096, 0).decode()
    finally:
        os.close(fd)
    return None


def test_an_earlier_broker_started_after_a_new_daemon_is_refused(linked: Path) -> None:
    old = Path(f"{linked}.lock")
    daemon = WriterLock.acquire(linked, owner="affidavit serve on /run/new.sock")
    try:
        assert _old_style(old, fcntl.LOCK_EX) == "affidavit serve on /run/new.sock"
        assert _old_style(old, fcntl.LOCK_SH) == "affidavit serve on /run/new.sock"
    finally:
        daemon.release()
    assert _old_style(old, fcntl.LOCK_EX) is None and old.read_bytes() == b""


def test_an_earlier_daemon_started_after_a_new_embedded_writer_is_refused(linked: Path) -> None:
    """Shared, as the writer's own lock: an earlier embedded writer shares the journal still
    (SQLite serialises them), an earlier daemon, which must be alone, is kept out."""
    old = Path(f"{linked}.lock")
    old.write_bytes(b"affidavit serve on /run/killed.sock")  # a SIGKILLed daemon's leftover
    writer = WriterLock.acquire(linked)
    try:
        assert _old_style(old, fcntl.LOCK_EX) is not None
        assert _old_style(old, fcntl.LOCK_SH) is None
        assert old.read_bytes() == b""  # held shared, no owner is alive: its words cleared
    finally:
        writer.release()
    assert _old_style(old, fcntl.LOCK_EX) is None


def test_a_daemon_that_cannot_start_never_refuses_an_earlier_writer(linked: Path) -> None:
    """The probe2 shape, bounded: an earlier embedded writer starts over and over on
    ``<link>.lock`` while a new daemon tries to start 300 times, refused each time (a new
    embedded writer holds the journal).  The daemon took ``<link>.lock`` exclusive for an
    instant before finding the journal held, refusing the earlier writer in that instant;
    now it touches it only once it holds the journal's own lock."""
    old = Path(f"{linked}.lock")
    stop = threading.Event()
    tries = {"taken": 0, "refused": 0}

    def earlier_writer() -> None:
        for _ in range(2_000_000):  # (bounded; stopped once the daemon's tries are done)
            if stop.is_set():
                return
            outcome = "taken" if _old_style(old, fcntl.LOCK_SH) is None else "refused"
            tries[outcome] += 1

    embedded = WriterLock.acquire(linked)
    thread = threading.Thread(target=earlier_writer, daemon=True)
    thread.start()
    try:
        for _ in range(300):
            with pytest.raises(JournalLocked):
                WriterLock.acquire(linked, owner="a new daemon")
    finally:
        stop.set()
        thread.join(timeout=60)
        embedded.release()
    assert not thread.is_alive()
    assert tries["taken"] > 0 and tries["refused"] == 0, tries


def test_an_earlier_daemon_holding_it_refuses_without_a_description(linked: Path) -> None:
    """Refused shared, the holder is exclusive -- an owner -- and says nothing: the words
    name no one and say it is a daemon; refused exclusive, the holder may be either."""
    old = Path(f"{linked}.lock")
    fd = os.open(old, os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(JournalLocked) as shared:
            WriterLock.acquire(linked)
        assert shared.value.owner is None
        assert f"an owner (a daemon) holds its lock {old}" in str(shared.value)
        with pytest.raises(JournalLocked) as owner:
            WriterLock.acquire(linked, owner="a new daemon")
        assert f"another process holds its lock {old}" in str(owner.value)
    finally:
        os.close(fd)
    _open_and_close(linked)  # let go: opened again, the journal's own lock free too


def test_a_fifo_there_neither_blocks_nor_is_written(linked: Path) -> None:
    old = Path(f"{linked}.lock")
    old.unlink()
    os.mkfifo(old)
    WriterLock.acquire(linked, owner="a new daemon").release()
    _open_and_close(linked)


def test_none_there_none_made(linked: Path) -> None:
    old = Path(f"{linked}.lock")
    old.unlink()
    held = WriterLock.acquire(linked, owner="a new daemon")
    held.release()
    assert not old.exists()
