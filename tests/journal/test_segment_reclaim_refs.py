"""An interrupted attempt whose long result went to a segment, then reclaimed (carried from the
closing notes: "``drop_unmarked_chunks`` leaves ``result_segments`` rows").  On SQLite a
segment's chunks become reference rows only in the transaction that writes the marker
(``segments.py``, ``SegmentWriter.prepare``), so an attempt interrupted before its marker leaves
no reference row and no chunk row: nothing for the reclaim's transaction to drop (the record is
not even its candidate), and only unnamed bytes, which the compaction returns.  A later attempt
of the same invocation commits and reads back its own bytes only."""

from __future__ import annotations

import hashlib
from pathlib import Path

import trio

from affidavit.journal import Journal, JournalReader
from affidavit.statemachine import Event
from affidavit.statemachine import EventKind as E

from . import segkit as kit
from .helpers import happy, sql

IID = "inv-cut"


def _rows(db: Path) -> dict[str, int]:
    """The invocation's rows in every table that holds a result's chunks or names them."""
    return {
        table: sql(db, f"SELECT count(*) FROM {table} WHERE invocation_id = '{IID}'")[0][0]
        for table in ("result_segments", "result_chunks", "result_audit", "chunk_owners")
    }


async def test_an_interrupted_spilled_attempt_leaves_no_row_and_its_bytes_are_compacted(
    tmp_path: Path,
) -> None:
    db = tmp_path / "j.db"
    async with Journal.open(db) as j:
        await kit.interrupt(j, IID, 40)  # ~2.5 MiB written to a segment, never committed
    assert kit.segments(db) and kit.allocated(db) > 40 * kit.CHUNK
    assert _rows(db) == dict.fromkeys(_rows(db), 0)

    retry = kit.body(35, 77)
    async with Journal.open(db) as j:
        done = await j.reclaim(segments=True)
        assert done.dropped == [] and done.kept == []  # not a candidate: it stored no row
        assert done.compacted is not None and done.compacted.removed == 1
        assert kit.segments(db) == []
        # A later attempt of the same invocation: its own bytes, in a new segment.
        await j.acquire_lease(IID, "worker-1", 60.0)
        await j.append(Event(E.DISPATCH_STARTED, IID, {"attempt": 2}), barrier=True)
        for ev in happy(IID)[4:]:  # sent, response started, complete
            await j.append(ev, barrier=True)
        writer = await kit.put_all(j, IID, retry)
        with trio.fail_after(kit.LIMIT):
            await j.commit_result(
                Event(E.RESULT_COMMITTED, IID),
                summary={"status": 200},
                expect={"body": hashlib.sha256(retry).hexdigest()},
                writer=writer,
            )
    assert _rows(db)["result_segments"] == 35 and _rows(db)["chunk_owners"] == 0
    async with Journal.open(db) as j:
        again = await j.reclaim(segments=True)
        assert again.compacted is not None and again.compacted.removed == 0
    with JournalReader.open(db) as r:
        report = r.verify()
        assert report.ok, report
        res = r.read_result(IID)
        assert res is not None and res.streams == {"body": retry}
