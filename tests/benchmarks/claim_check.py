"""What the writer's claim check costs (``journal/txn``'s ``_attrs_naming``, run for a claim
alone: ``statemachine.refuse_reclaiming`` refuses a claim naming a call a row of the record
already names), side by side with the same record's other rows, from one run.

    python tests/benchmarks/claim_check.py [--rows 100,10000] [--repeat 21]

For each size: an interrupted invocation whose record holds ``rows`` closed reconciliation
queries (one RECONCILE_INCONCLUSIVE row each), then ``repeat`` times a claim of a new query
(``open``, no code: the scan runs) and the row closing it (no scan); the medians of each
append and their ratio.  The scan's cost grows with the record; the close's stays flat.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

from affidavit.journal import Journal
from affidavit.statemachine import Event, EvidenceSource
from affidavit.statemachine import EventKind as E

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "journal"))
from helpers import interrupted

IID = "act_bench"


def _row(query: str, **attrs: object) -> Event:
    return Event(
        E.RECONCILE_INCONCLUSIVE,
        IID,
        {"query_invocation": query, **attrs},
        source=EvidenceSource.REMOTE_QUERY,
        observer="bench",
        observer_seq=1,
    )


async def _measure(rows: int, repeat: int) -> tuple[float, float]:
    closed = {"code": "REMOTE_OUTCOME_UNKNOWN", "reason": "read"}
    with tempfile.TemporaryDirectory() as d:
        async with Journal.open(Path(d) / "j.db") as j:
            for event in interrupted(IID):
                await j.append(event)
            await j.post_many([(_row(f"act_q{n}", **closed), None) for n in range(rows)])
            claims, closes = [], []
            for n in range(repeat):
                start = time.perf_counter()
                await j.append(_row(f"act_new{n}", code=None, reason="asking", open=True))
                claimed = time.perf_counter()
                await j.append(_row(f"act_new{n}", **closed))
                claims.append(claimed - start)
                closes.append(time.perf_counter() - claimed)
    return statistics.median(claims), statistics.median(closes)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="100,10000")
    parser.add_argument("--repeat", type=int, default=21)
    args = parser.parse_args()
    print(f"{'rows':>8} {'claim ms':>9} {'close ms':>9} {'ratio':>6}")
    for rows in (int(r) for r in args.rows.split(",")):
        claim, close = trio.run(_measure, rows, args.repeat)
        print(f"{rows:>8} {claim * 1e3:>9.2f} {close * 1e3:>9.2f} {claim / close:>6.1f}")


if __name__ == "__main__":
    main()
