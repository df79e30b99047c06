"""Reclaim spares a segment written after the journal's newest row (``journal/compact.py``).

A ``-wal`` lost after a checkpoint drops every commit since; the segment files those commits
named are the only sealed copies of their bytes left.  No compaction -- a daemon's start-up
reclaim included -- removes or cuts a segment last written after the newest row.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from affidavit.journal import Journal
from affidavit.journal import compact as compact_mod

from .helpers import happy, sql


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
