"""Segment compaction beside a broker of an earlier affidavit (``journal/compact.py``), and the
index it reads a segment's rows through (schema 7).

A broker from before the per-segment lock writes its segment unlocked: to a compaction, its
bytes in flight look like an interrupted attempt's, and a file no row names yet would be
removed under it.  A journal such a broker may still write -- upgraded by an embedded writer,
which cannot tell who else holds the journal -- is not compacted; one made at schema 7, or
opened since by its daemon (the writer lock held exclusive: no other writer of any version),
records ``segment_locks`` and is."""

from __future__ import annotations

import ctypes
import errno
import os
import sqlite3
from pathlib import Path

import pytest
import trio

from affidavit.journal import Journal, JournalReader
from affidavit.journal import compact as compact_mod
from affidavit.journal.segment_tables import SEGMENT_LOCKS, SEGMENT_REFS
from affidavit.journal.sqlite import SCHEMA_VERSION

from . import segkit as kit

OLDER = (
    f"DELETE FROM meta WHERE name = '{SEGMENT_LOCKS}'",
    "DROP INDEX IF EXISTS result_segments_segment",
    "UPDATE meta SET value = '6' WHERE name = 'schema'",
)
"""What tells a journal of schema 6 (the release before) from one of schema 7."""


async def _reclaim(db: Path, owner: str | None = None) -> compact_mod.Compaction:
    async with Journal.open(db, owner=owner) as j:
        with trio.fail_after(kit.LIMIT):
            done = await j.reclaim(segments=True)
    assert done.compacted is not None
    return done.compacted


def _on_disk(db: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (os.stat(p).st_size, os.stat(p).st_blocks) for p in kit.segments(db)}


def _meta(db: Path, name: str) -> list[tuple[str]]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchall()
    conn.close()
    return rows


async def test_a_journal_an_earlier_broker_may_still_write_is_not_compacted(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    await kit.build(db)
    kit.tamper(db, *OLDER)
    # The earlier broker's segment: bytes written (unlocked), its commit about to name them.
    theirs = Path(f"{db}.results") / ("cd" * 16 + ".seg")
    theirs.write_bytes(os.urandom(3 * kit.CHUNK))
    before = _on_disk(db)

    got = await _reclaim(db)  # an embedded writer: the upgrade to schema 7 proves nothing
    assert _on_disk(db) == before
    assert (got.segments, got.removed, got.bytes) == (0, 0, 0)
    assert got.refused == compact_mod.UNPROVEN
    assert _meta(db, "schema") == [(str(SCHEMA_VERSION),)] and _meta(db, SEGMENT_LOCKS) == []
    kit.check(db)

    # Its daemon starts: the writer lock exclusive, no writer of any version is left.
    theirs.unlink()  # (the earlier broker stopped; its bytes were never named)
    got = await _reclaim(db, owner="test daemon")
    assert got.refused is None and got.removed == 1 and got.bytes > 0
    assert _meta(db, SEGMENT_LOCKS) == [(str(SCHEMA_VERSION),)]
    assert len(kit.segments(db)) == 1
    kit.check(db)

    again = await _reclaim(db)  # proven for good: an embedded writer compacts now
    assert again.refused is None and again.segments == 1
    kit.check(db)


async def test_a_journal_made_here_records_that_no_earlier_broker_wrote_it(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    async with Journal.open(db):
        pass
    assert _meta(db, SEGMENT_LOCKS) == [(str(SCHEMA_VERSION),)]


async def test_a_segments_rows_are_read_through_the_index_an_upgrade_builds(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    await kit.build(db)
    kit.tamper(db, *OLDER)
    async with Journal.open(db):  # a writer opening the schema-6 journal builds the index
        pass
    with sqlite3.connect(db) as conn:
        plan = conn.execute("EXPLAIN QUERY PLAN " + SEGMENT_REFS.format("?,?"), ("a", "b"))
        details = " ".join(str(row[-1]) for row in plan)
    conn.close()
    assert "USING INDEX result_segments_segment" in details, details
    assert "SCAN result_segments" not in details, details


async def test_a_dry_run_counts_holes_only_where_they_can_be_punched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a filesystem that cannot punch holes (``fallocate`` answers EOPNOTSUPP), the gaps
    between committed chunks stay: the dry run counts what the run then returns -- whole files
    and tails -- not the gaps too, and both say so."""
    db = tmp_path / "j.db"
    await kit.build(db)

    def cannot(fd: int, mode: int, offset: int, length: int) -> int:
        ctypes.set_errno(errno.EOPNOTSUPP)
        return -1

    monkeypatch.setattr(compact_mod, "_punch_fn", lambda: cannot)
    before = kit.allocated(db)
    crashed = Path(f"{db}.results") / ".punch-probe-0123456789abcdef"  # a probe a crash left
    crashed.write_bytes(b"x")
    dry = await _dry_run(db)
    assert kit.allocated(db) == before
    assert all(p.suffix == ".seg" for p in kit.segments(db))  # the probes' files are gone
    done = await _reclaim(db)
    assert before - kit.allocated(db) == done.bytes and done.removed == 1
    assert done.bytes * 0.95 <= dry.bytes <= done.bytes * 1.05, (dry.bytes, done.bytes)
    assert not dry.holes and not done.holes
    kit.check(db)


async def _dry_run(db: Path) -> compact_mod.Compaction:
    async with Journal.open(db) as j:
        with trio.fail_after(kit.LIMIT):
            done = await j.reclaim(dry_run=True, segments=True)
    assert done.compacted is not None
    return done.compacted


@pytest.mark.parametrize("directory", [False, True], ids=["no-segment-directory", "empty"])
async def test_a_journal_without_segment_files_is_not_refused(
    tmp_path: Path, directory: bool
) -> None:
    """Nothing to compact is nothing to refuse: an upgraded journal that never stored a long
    result (no segment directory, or an empty one) is reported compacted with nothing -- not
    ``UNPROVEN`` (``journal reclaim`` exited 2 for every such journal) -- and no segment file
    is there for the compaction to take."""
    db = tmp_path / "j.db"
    async with Journal.open(db):
        pass
    kit.tamper(db, *OLDER)
    if directory:
        Path(f"{db}.results").mkdir(mode=0o700)
    got = await _reclaim(db)
    assert got.refused is None
    assert (got.segments, got.removed, got.busy, got.bytes) == (0, 0, 0, 0)
    assert _meta(db, SEGMENT_LOCKS) == []  # still unproven: a later segment file is refused
    with JournalReader.open(db) as r:
        assert r.verify().ok
