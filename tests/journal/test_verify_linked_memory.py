"""``verify``'s check of ``linked_calls`` holds one row's keys at a time, not the journal's: it
reads the table by seq beside the events (``journal.verify_linked``).  Before, two sets of
every (invocation, key, seq) entry -- ~260 B each -- were built, and the expected one even for a
journal without the table: a 300,000-row journal of queries took 195 MB to verify, 34 MB before
the table existed."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import trio

from affidavit.journal import Journal, JournalReader
from affidavit.statemachine import Event, EvidenceSource
from affidavit.statemachine import EventKind as E

from .helpers import interrupted
from .segkit import LIMIT

IID = "act_x1"
ROWS = 20_000
"""Rows naming a query: ~10 MB of entries in the sets of before."""


def _query(n: int) -> Event:
    return Event(
        E.RECONCILE_INCONCLUSIVE,
        IID,
        {"query_invocation": f"act_q{n}", "code": "REMOTE_OUTCOME_UNKNOWN", "reason": "read"},
        source=EvidenceSource.REMOTE_QUERY,
        observer="obs",
        observer_seq=1,
    )


def test_verify_s_memory_does_not_grow_with_the_rows_naming_a_call(tmp_path: Path) -> None:
    db = tmp_path / "j.db"

    async def build() -> None:
        with trio.fail_after(LIMIT * 4):
            async with Journal.open(db) as j:
                for event in interrupted(IID):
                    await j.append(event)
                for start in range(0, ROWS, 5000):
                    batch = [(_query(n), None) for n in range(start, start + 5000)]
                    await (await j.post_many(batch)).wait()

    trio.run(build)
    with JournalReader.open(db) as r:
        tracemalloc.start()
        try:
            report = r.verify()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert report.ok, report
    assert report.count == ROWS + len(interrupted(IID))
    assert peak < 1_000_000, f"verify's peak {peak / 1e6:.1f} MB for {ROWS} rows naming a call"
