"""SQLite: the WAL is copied into the database file beside the writer, never inside its COMMIT
(issue 15: an automatic checkpoint in the middle of a 50 MiB result stalled it ~0.4 s)."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.journal import Journal, JournalReader, sqlite_wal

from .helpers import happy

THREAD = "affidavit-journal-checkpoint"


def _threads() -> list[str]:
    return [t.name for t in threading.enumerate()]


async def test_the_wal_is_checkpointed_beside_the_writer(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with Journal.open(path) as j:
        assert j.write_connection.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        for ev in happy("inv-1"):
            await j.append(ev, barrier=True)
        size = path.stat().st_size
        for i in range(80):  # 5 MiB, one commit each: the database file only grows by copies
            await j.put_result_chunk("inv-1", "body", i, os.urandom(64 * 1024))
        deadline = time.monotonic() + 10
        while path.stat().st_size < size + (4 << 20) and time.monotonic() < deadline:
            await trio.sleep(0.01)
        assert path.stat().st_size >= size + (4 << 20)
        assert THREAD in _threads()
    assert THREAD not in _threads()  # closing the journal stops it
    with JournalReader.open(path) as r:
        assert r.verify().ok


async def test_a_checkpointer_that_cannot_start_does_not_fail_a_committed_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Waking the checkpoint thread runs after COMMIT: if it raises (no thread to be had), the
    writes are durable all the same and must be answered so, not as failed."""
    path = tmp_path / "j.db"

    def no_thread(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    async with Journal.open(path) as j:
        monkeypatch.setattr(sqlite_wal, "CHECKPOINT_COMMITS", 1)
        monkeypatch.setattr(threading.Thread, "start", no_thread)
        stored = [await j.append(ev, barrier=True) for ev in happy("inv-1")]
        monkeypatch.undo()
        assert [e.seq for e in stored] == list(range(1, len(stored) + 1))
        assert THREAD not in _threads()
    with JournalReader.open(path) as r:
        assert len(r.events("inv-1")) == len(stored)
        assert r.verify().ok


async def test_a_size_the_checkpointer_cannot_read_does_not_fail_the_transaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database's size is read inside the writer's transaction, before ``COMMIT``: a read
    that fails is upkeep lost, not the transaction -- its rows commit and are answered so."""
    path = tmp_path / "j.db"

    def unreadable(conn: object) -> int:
        raise sqlite3.OperationalError("disk I/O error")

    async with Journal.open(path) as j:
        monkeypatch.setattr(sqlite_wal._Checkpointer, "pages", staticmethod(unreadable))
        stored = [await j.append(ev, barrier=True) for ev in happy("inv-1")]
        monkeypatch.undo()
        assert [e.seq for e in stored] == list(range(1, len(stored) + 1))
    with JournalReader.open(path) as r:
        assert len(r.events("inv-1")) == len(stored)
        assert r.verify().ok


def _wal_restarts(path: Path) -> int:
    """The WAL header's checkpoint sequence number: SQLite adds one each time it writes the WAL
    from its start again."""
    with open(f"{path}-wal", "rb") as f:
        return int.from_bytes(f.read(16)[12:16], "big")


async def test_the_wal_starts_over_while_writes_keep_coming(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite reuses the WAL only when a write transaction begins with every frame copied.  A
    writer that never pauses always commits while the checkpoint thread copies, so before the
    writer caught up itself the WAL grew by every page written for as long as writes came
    (~80 KB a broker call, without bound).  Here 16 tasks append without a pause: the WAL
    must start over again and again and stay a small part of all that was written."""
    monkeypatch.setattr(sqlite_wal, "CHECKPOINT_COMMITS", 16)
    path = tmp_path / "j.db"
    rounds = 0
    async with Journal.open(path) as j:
        start = _wal_restarts(path)
        written = 0

        async def appender(n: int) -> None:
            nonlocal written
            for i in range(40):
                for ev in happy(f"inv-{n}-{i}"):
                    await j.append(ev, barrier=True)
                    written += 1

        async with trio.open_nursery() as nursery:
            for n in range(16):
                nursery.start_soon(appender, n)
        rounds = _wal_restarts(path) - start
        wal = os.path.getsize(f"{path}-wal")
        pages = j.write_connection.execute("PRAGMA page_count").fetchone()[0]
    assert written == 16 * 40 * 7
    assert rounds >= 5, f"the WAL started over {rounds} times"
    # The WAL file keeps the size of its longest cycle (here ~1 database's worth of pages);
    # without the catch-up it held every frame of the run: 0 restarts, ~13 databases' worth.
    assert wal < 3 * pages * 4096, (wal, pages)
    with JournalReader.open(path) as r:
        assert r.verify().ok


async def test_the_writer_starts_no_read_transaction_after_its_commit(tmp_path: Path) -> None:
    """The checkpoint trigger needs the database's size after each commit.  Read with a
    ``PRAGMA page_count`` after ``COMMIT``, it began a read transaction of its own every time
    (four more ``fcntl`` locks on the -shm file, issue 15); it is read inside the transaction,
    before ``COMMIT``.  Between one ``COMMIT`` and the next ``BEGIN`` the writer's connection
    runs only its durability switch or the checkpoint catch-up."""
    path = tmp_path / "j.db"
    seen: list[str] = []
    async with Journal.open(path) as j:
        j.write_connection.set_trace_callback(seen.append)
        for i in range(3):
            for k, ev in enumerate(happy(f"inv-{i}")):
                await j.append(ev, barrier=k % 2 == 0)
        j.write_connection.set_trace_callback(None)
    commits = [n for n, stmt in enumerate(seen) if stmt == "COMMIT"]
    assert len(commits) == 3 * len(happy("inv-0"))
    for n in commits:
        before = seen[n - 1]
        assert before == "PRAGMA page_count", seen[max(0, n - 3) : n + 1]
        after = seen[n + 1 : n + 2]
        assert after == [] or after[0].startswith(
            ("BEGIN", "PRAGMA synchronous", "PRAGMA wal_checkpoint")
        ), seen[n : n + 3]
    with JournalReader.open(path) as r:
        assert r.verify().ok


def test_the_checkpoint_thread_drops_a_connection_to_a_file_put_there_as_it_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thread opens its connection by the path: checked before the open and again after
    (a file put in the writer's place in between would be checkpointed with the writer's WAL,
    named by the path too), it closes what it opened when the second check says another file."""
    path = tmp_path / "j.db"
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("CREATE TABLE t (x)")
    answers = [True, False]  # the writer's file before the open; another one after
    asked = []

    def writes_path() -> bool:
        asked.append(1)
        return answers[len(asked) - 1] if len(asked) <= len(answers) else False

    opened: list[sqlite3.Connection] = []
    real = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = real(*args, **kwargs)
        opened.append(conn)
        return conn

    monkeypatch.setattr(sqlite_wal.sqlite3, "connect", connect)
    cp = sqlite_wal._Checkpointer(path, writes_path)
    cp._thread = threading.Thread(target=cp._main, daemon=True)
    cp._thread.start()
    cp._wake.set()
    for _ in range(500):  # bounded: 5 s
        if len(asked) >= 2:
            break
        time.sleep(0.01)
    cp.close()
    assert len(asked) == 2 and len(opened) == 1
    with pytest.raises(sqlite3.ProgrammingError):  # closed, never used
        opened[0].execute("SELECT 1")
    writer.close()
