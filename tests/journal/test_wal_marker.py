"""A ``-wal`` lost *after* a checkpoint is refused too (``journal/opened.py``).

The main file then still holds the schema and the rows up to the checkpoint: a shorter journal
that verifies, and before, a daemon's start-up reclaim deleted the segment files of the commits
lost.  ``<journal>.open``, made by a writer's open and removed only once SQLite itself removed
the ``-wal``, tells: found without its ``-wal``, a writer's open and a read are refused
``JOURNAL_LOST``.  A journal is "killed, then its ``-wal`` lost" here by copying its files as
they are on disk while it is open, idle (what a SIGKILL leaves), without the ``-wal``.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from affidavit.journal import Journal, JournalLost
from affidavit.journal import compact as compact_mod
from affidavit.journal.backend import open_backend
from affidavit.journal.reader import JournalReader

from .helpers import happy, sql


def _marker(db: Path) -> Path:
    return Path(f"{db}.open")


def _left_without_wal(db: Path, to: Path) -> Path:
    """The journal's files as on disk now, but the ``-wal`` and ``-shm``: copied to ``to``."""
    to.mkdir()
    for suffix in ("", ".key", ".signing.key", ".open"):
        shutil.copy2(f"{db}{suffix}", to / f"j.db{suffix}")
    return to / "j.db"


async def test_a_wal_lost_after_a_checkpoint_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    async with Journal.open(db) as j:
        for event in happy("inv-1"):
            await j.append(event)
        assert _marker(db).exists()
        sql(db, "PRAGMA wal_checkpoint(PASSIVE)")  # inv-1 now in the main file
        for event in happy("inv-2"):
            await j.append(event)  # in the -wal alone
        lost = _left_without_wal(db, tmp_path / "copy")
    with pytest.raises(JournalLost) as refused:
        async with Journal.open(lost):
            pass
    msg = str(refused.value)
    assert refused.value.code == "JOURNAL_LOST"
    assert f"{lost}-wal" in msg and f"{lost}.open" in msg and "restore the -wal" in msg
    public = refused.value.public
    assert public is not None and str(tmp_path) not in public
    with pytest.raises(JournalLost):  # any writer connection, under the marker's lock
        open_backend(lost).connect("writer")
    with pytest.raises(JournalLost):  # a read: verify would say intact, shorter
        JournalReader(lost, readonly=True)
    with pytest.raises(JournalLost):  # and the read made no -wal that hides the loss
        async with Journal.open(lost):
            pass
    # What the refusal saw: the schema and inv-1 survived, inv-2 did not.
    assert sql(lost, "SELECT DISTINCT invocation_id FROM events") == [("inv-1",)]


async def test_the_way_out_is_to_remove_the_marker_knowingly(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    async with Journal.open(db) as j:
        await j.append(happy("inv-1")[0])
        sql(db, "PRAGMA wal_checkpoint(PASSIVE)")
        lost = _left_without_wal(db, tmp_path / "copy")
    os.unlink(_marker(lost))
    async with Journal.open(lost) as j:
        assert j.verify().ok
    assert not _marker(lost).exists()


async def test_a_normal_close_removes_the_marker_and_the_reopen_is_unchanged(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    async with Journal.open(db) as j:
        await j.append(happy("inv-1")[0])
    assert not _marker(db).exists() and not Path(f"{db}-wal").exists()
    async with Journal.open(db) as j:
        assert [e.invocation_id for e in j.events("inv-1")] == ["inv-1"]
    JournalReader(db, readonly=True).close()


async def test_one_of_two_embedded_writers_closing_leaves_the_others_marker(
    tmp_path: Path,
) -> None:
    """The first to close leaves the ``-wal`` to the other (SQLite removes it at the last
    close only), and the marker with it: the other's journal is still protected, and a third
    writer opening meanwhile is not refused."""
    db = tmp_path / "j.db"
    async with Journal.open(db) as a:
        await a.append(happy("inv-1")[0])
        async with Journal.open(db) as b:
            async with Journal.open(db):
                pass
            assert _marker(db).exists() and Path(f"{db}-wal").exists()
            await b.append(happy("inv-2")[0])
        assert _marker(db).exists() and Path(f"{db}-wal").exists()
        await a.append(happy("inv-1")[1])
    assert not _marker(db).exists() and not Path(f"{db}-wal").exists()
    async with Journal.open(db) as j:
        assert j.verify().ok


def test_compaction_spares_a_segment_written_after_the_newest_row(tmp_path: Path) -> None:
    """Bytes written after the journal's newest row may be named by commits a lost ``-wal``
    took: no compaction removes (or cuts) such a segment; an older one no row names goes."""
    directory = tmp_path / "j.db.results"
    directory.mkdir()
    segment = directory / ("ab" * 16 + ".seg")
    segment.write_bytes(b"sealed bytes")
    written = segment.stat().st_mtime

    def no_refs(names: Sequence[str]) -> Iterator[tuple[Any, Any, Any]]:
        return iter(())

    done = compact_mod.compact(directory, no_refs, proven=True, spare_after=written - 60)
    assert (done.spared, done.removed) == (1, 0) and segment.exists()
    done = compact_mod.compact(directory, no_refs, proven=True, spare_after=time.time() + 60)
    assert (done.spared, done.removed) == (0, 1) and not segment.exists()


def test_sqlite_only_removes_the_wal_at_the_last_close(tmp_path: Path) -> None:
    """What the marker's removal rests on (SQLite's WAL close): a second connection keeps it."""
    db = tmp_path / "j.db"
    first = sqlite3.connect(db, isolation_level=None)
    first.execute("PRAGMA journal_mode=WAL")
    first.execute("CREATE TABLE t (x)")
    second = sqlite3.connect(db, isolation_level=None)
    second.execute("SELECT * FROM t").fetchall()
    first.close()
    assert Path(f"{db}-wal").exists()
    second.close()
    assert not Path(f"{db}-wal").exists()


async def test_the_journals_reclaim_judges_segments_by_its_newest_row(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    async with Journal.open(db) as j:
        await j.append(happy("inv-1")[0])
        newest = sql(db, "SELECT max(at) FROM events")[0][0]
        directory = Path(f"{db}.results")
        directory.mkdir(exist_ok=True)
        segment = directory / ("cd" * 16 + ".seg")
        segment.write_bytes(b"sealed bytes")
        os.utime(segment, (newest + 5, newest + 5))
        done = await j.reclaim(segments=True)
        assert done.compacted is not None and done.compacted.spared == 1 and segment.exists()
        os.utime(segment, (newest - 5, newest - 5))
        done = await j.reclaim(segments=True)
        assert done.compacted is not None and done.compacted.removed == 1
        assert not segment.exists()
