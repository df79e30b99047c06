"""An idle view reader (``ViewReaders``) reads what a new reader would, and is not kept forever.

A reader checked the journal only when it connected -- the file at the path, its schema not
newer than this broker knows -- so an idle one taken again read on with what it found then: a
shared journal another (newer) broker upgraded was read as the schema this one knows, where a
new reader is refused; a SQLite file replaced under the path was read as the file it had open,
where a new reader reads the new one.  And idle readers stayed open for the process's life: on
PostgreSQL idle sessions, on SQLite open descriptors keeping a replaced or removed file alive.
Now a reader taken again is checked first (``JournalReader.fresh``; at most once per
``fresh_for``), and one idle longer than ``idle_for`` is closed on the pool's next take,
give-back or ``prune``."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.readers import ViewReaders
from affidavit.journal import Journal, JournalError, JournalReader
from affidavit.journal.postgres import SCHEMA_VERSION as PG_SCHEMA
from affidavit.journal.sqlite import SCHEMA_VERSION
from tests.journal.helpers import happy
from tests.postgres import Cluster


async def _journal(location: Any, tmp: Path, invocations: int = 1) -> None:
    async with Journal.open(location, key_file=tmp / "k.key", signing_key=tmp / "k.sk") as j:
        for n in range(invocations):
            for ev in happy(f"act_{n}"):
                await j.append(ev)


def _closed(reader: JournalReader) -> bool:
    try:
        reader._rconn.execute("SELECT 1")
    except sqlite3.ProgrammingError:
        return True
    return False


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_reader_of_a_file_replaced_under_the_path_is_not_taken_again(
    tmp_path: Path,
) -> None:
    path, other = tmp_path / "j.db", tmp_path / "other" / "j.db"
    other.parent.mkdir()
    await _journal(path, tmp_path, 1)
    await _journal(other, tmp_path / "other", 3)
    clock = _Clock()
    readers = ViewReaders(path, tmp_path / "k.key", clock=clock)
    first = readers.take()
    seen = first.head()
    readers.give_back(first, 2)
    os.replace(other, path)  # (the file a new reader opens now)
    # Checked at most once a second (``fresh_for``): within it, as a reader opened then.
    assert readers.take() is first
    readers.give_back(first, 2)
    clock.now += 1.0
    again = readers.take()
    assert again is not first and _closed(first)
    with JournalReader.open(path, key_file=tmp_path / "k.key") as new:
        assert again.head() == new.head() != seen


async def test_a_reader_of_a_removed_file_says_no_journal_as_a_new_one(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    await _journal(path, tmp_path)
    readers = ViewReaders(path, tmp_path / "k.key", fresh_for=0.0)
    readers.give_back(readers.take(), 2)
    path.unlink()
    with pytest.raises(JournalError, match="no journal at"):
        readers.take()
    assert readers.idle() == 0


async def test_a_reader_of_a_journal_upgraded_since_is_refused_as_a_new_one(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    await _journal(path, tmp_path)
    readers = ViewReaders(path, tmp_path / "k.key", fresh_for=0.0)
    first = readers.take()
    readers.give_back(first, 2)
    conn = sqlite3.connect(path, isolation_level=None)
    try:  # a newer broker's upgrade: a table of its own, its schema recorded
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("CREATE TABLE newer_things (x INTEGER)")
        conn.execute("UPDATE meta SET value = ? WHERE name = 'schema'", (str(SCHEMA_VERSION + 1),))
        conn.execute("COMMIT")
    finally:
        conn.close()
    with pytest.raises(JournalError, match="newer affidavit"):
        readers.take()
    assert _closed(first) and readers.idle() == 0


async def test_readers_idle_too_long_are_closed_on_the_next_take_give_back_or_prune(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    await _journal(path, tmp_path)
    clock = _Clock()
    readers = ViewReaders(path, tmp_path / "k.key", idle_for=30.0, clock=clock)
    a, b = readers.take(), readers.take()
    readers.give_back(a, 4)
    clock.now += 20
    readers.give_back(b, 4)
    clock.now += 15  # a idle 35 s, b 15 s
    assert readers.prune() == 1 and _closed(a) and not _closed(b)
    assert readers.take() is b  # (within its bound: taken again)
    readers.give_back(b, 4)
    clock.now += 31
    c = readers.take()  # b idle too long: closed, a new one opened
    assert c is not b and _closed(b) and readers.opened == 3
    d = readers.take()
    readers.give_back(c, 4)
    clock.now += 31
    readers.give_back(d, 4)  # c closed on this give-back, d kept
    assert _closed(c) and not _closed(d) and readers.idle() == 1
    readers.close()


def _schema(pg: Cluster, database: str, value: int) -> None:
    pg.sql("UPDATE meta SET value = %s WHERE name = 'schema'", database, (str(value),))


async def test_a_reader_of_a_shared_journal_upgraded_since_is_refused_as_a_new_one(
    tmp_path: Path, pg: Cluster, pg_url: str
) -> None:
    await _journal(pg_url, tmp_path)
    database = pg_url.rsplit("/", 1)[1]
    readers = ViewReaders(pg_url, tmp_path / "k.key", fresh_for=0.0)
    first = readers.take()
    readers.give_back(first, 2)
    assert readers.take() is first  # unchanged: taken again
    readers.give_back(first, 2)
    _schema(pg, database, PG_SCHEMA + 1)  # another broker, newer, upgraded it
    try:
        with pytest.raises(JournalError, match="newer affidavit"):
            readers.take()
        assert first._rconn.closed and readers.idle() == 0
    finally:
        _schema(pg, database, PG_SCHEMA)
    readers.close()


async def test_a_view_reader_waits_a_bounded_time_for_a_lock_the_database_holds(
    tmp_path: Path, pg: Cluster, pg_url: str
) -> None:
    """``lock_wait``: a read that meets a lock another session holds is declined once the
    bound passes (``ReadFailed``), not held as long as the lock is."""
    import psycopg

    from affidavit.journal import ReadFailed

    await _journal(pg_url, tmp_path)
    readers = ViewReaders(pg_url, tmp_path / "k.key", lock_wait=0.2)
    with psycopg.connect(pg_url) as holder:  # (one transaction until the block ends)
        holder.execute("LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
        reader = readers.take()
        with trio.fail_after(30), pytest.raises(ReadFailed, match="lock timeout"):
            await trio.to_thread.run_sync(reader.events, "act_0")
        reader.close()
