"""Reclaiming the chunks of a result that never committed (``journal/reclaim.py``), on every
backend: a real child process stores a result's chunks and is killed with SIGKILL mid-body, before
its RESULT_COMMITTED.  Its chunk rows stay, named by no committed record.  While the record is
open they are kept (a result may still commit); once it is closed, ``reclaim_chunks`` drops them
-- and only them: a committed result's chunks are untouched, nothing is appended, the journal
still verifies and the record reads as before."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import trio

from affidavit.journal import SigningKey, reclaim, tables
from affidavit.statemachine import Event, EventKind

from ..helpers import happy
from .conftest import Place
from .test_crash import TIMEOUT, _kill, _read_until, _spawn

CHUNKS = "SELECT count(*) FROM {table} WHERE invocation_id = '{iid}'"


def _count(place: Place, iid: str) -> tuple[int, int]:
    return (
        int(place.rows(CHUNKS.format(table="result_chunks", iid=iid))[0][0]),
        int(place.rows(CHUNKS.format(table="result_audit", iid=iid))[0][0]),
    )


def _verify(place: Place) -> int:
    public = SigningKey.load(place.signing_key).public_raw
    with place.reader() as r:
        report = r.verify(public_key=public)
    assert report.ok, report
    assert report.count is not None
    return report.count


def test_a_crash_mid_body_leaves_chunks_that_reclaim_drops_once_the_record_is_closed(
    place: Place,
) -> None:
    proc = _spawn(place, "midbody", place.location)
    try:
        _read_until(proc, lambda ls: ls[-1] == "mid-body", TIMEOUT)
    finally:
        _kill(proc)
    assert _count(place, "inv-1") == (2, 0)

    async def main() -> tuple[list[str], list[str]]:
        async with place.open() as j:
            # A committed result of another invocation, which no reclaim may touch.
            for ev in happy("inv-2"):
                await j.append(ev, barrier=True)
            await j.put_result_chunk("inv-2", "body", 0, b"kept")
            await j.commit_result(Event(EventKind.RESULT_COMMITTED, "inv-2"), summary={})
            # Open (response_started: its attempt may still be reading here or on another
            # broker, and commit): kept.
            kept = await j.reclaim_chunks()
            # Closed as recovery closes it: dispatched, no complete result -- unknown.
            closing = {"code": "REMOTE_OUTCOME_UNKNOWN", "generation": 0}
            await j.append(Event(EventKind.ATTEMPT_INTERRUPTED, "inv-1", closing), barrier=True)
            return kept, await j.reclaim_chunks()

    before = _verify(place)
    with place.reader() as r:
        assert r.record("inv-1") is not None
    kept, dropped = trio.run(main)
    assert kept == []
    assert dropped == ["inv-1"]
    assert _count(place, "inv-1") == (0, 0)
    # Nothing appended by the reclaim: the rows are the test's own writes (inv-2's five events
    # and RESULT_COMMITTED, inv-1's ATTEMPT_INTERRUPTED), and the chain still verifies.
    assert _verify(place) == before + len(happy("inv-2")) + 2
    with place.reader() as r:
        rec = r.record("inv-1")
        assert rec is not None and rec.state == "interrupted" and rec.outcome.value == "unknown"
        assert r.read_result("inv-1") is None
        stored = r.read_result("inv-2")
        assert stored is not None and stored.streams == {"body": b"kept"}

    # Idempotent: nothing left to drop.
    async def again() -> list[str]:
        async with place.open() as j:
            return await j.reclaim_chunks()

    assert trio.run(again) == []


def test_a_reclaim_of_many_records_holds_the_chain_head_one_batch_at_a_time(
    place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each transaction holds the chain head, which another broker's write waits for at most
    ``[journal] reconnect``: thousands of closed records' chunks (a caller cancelling calls
    mid-body between two restarts) are checked and dropped ``reclaim.BATCH`` at a time, never
    in one transaction.  (``BATCH`` lowered to 3 here; seven records.)"""
    monkeypatch.setattr(reclaim, "BATCH", 3)
    sizes: list[int] = []
    real_op = reclaim.reclaim_op

    def counted(candidates: Sequence[str], **kw: Any) -> Any:
        sizes.append(len(candidates))
        return real_op(candidates, **kw)

    monkeypatch.setattr(reclaim, "reclaim_op", counted)
    closing = {"code": "REMOTE_OUTCOME_UNKNOWN", "generation": 0}
    iids = [f"inv-{n}" for n in range(7)]

    async def main() -> list[str]:
        async with place.open() as j:
            for iid in iids:
                for ev in happy(iid)[:-1]:  # through REMOTE_RESPONSE_STARTED
                    await j.append(ev, barrier=True)
                await j.put_result_chunk(iid, "body", 0, b"part", generation=0)
                await j.append(Event(EventKind.ATTEMPT_INTERRUPTED, iid, closing), barrier=True)
            return await j.reclaim_chunks()

    assert sorted(trio.run(main)) == iids
    assert sizes == [3, 3, 1]
    assert [_count(place, iid) for iid in iids] == [(0, 0)] * 7
    _verify(place)


def test_a_start_up_reclaim_measures_nothing_under_the_chain_head(
    place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``reclaim_chunks`` (a daemon's start-up) throws the sizes away: it does not read them
    (``Tables.chunk_sizes``, two reads per dropped record) in the transactions that hold the
    chain head.  The command line's ``reclaim(measure=True)`` does, and gets them."""
    measured: list[str] = []
    real_sizes = tables.Tables.chunk_sizes

    def spied(self: tables.Tables, iid: str) -> tuple[int, int, int]:
        measured.append(iid)
        return real_sizes(self, iid)

    monkeypatch.setattr(tables.Tables, "chunk_sizes", spied)
    closing = {"code": "REMOTE_OUTCOME_UNKNOWN", "generation": 0}

    async def interrupted(j: Any, iid: str) -> None:
        for ev in happy(iid)[:-1]:  # through REMOTE_RESPONSE_STARTED
            await j.append(ev, barrier=True)
        await j.put_result_chunk(iid, "body", 0, b"part", generation=0)
        await j.append(Event(EventKind.ATTEMPT_INTERRUPTED, iid, closing), barrier=True)

    async def main() -> tuple[list[str], reclaim.Reclamation]:
        async with place.open() as j:
            await interrupted(j, "inv-a")
            started = await j.reclaim_chunks()
            await interrupted(j, "inv-b")
            return started, await j.reclaim(measure=True)

    started, asked = trio.run(main)
    assert started == ["inv-a"]
    assert asked.dropped == ["inv-b"] and measured == ["inv-b"]
    assert [(r.invocation_id, r.chunks) for r in asked.measured] == [("inv-b", 1)]
    _verify(place)
