"""What the writer's claim check costs (``journal/txn``'s ``_attrs_naming``, run for a claim
alone: ``statemachine.refuse_reclaiming`` refuses a claim naming a call a row of the record
already names), side by side with the same record's other rows, from one run.

    python tests/benchmarks/claim_check.py [--rows 100,10000,100000] [--repeat 21]
        [--ab OLD_CHECKOUT]

For each size: an interrupted invocation whose record holds ``rows`` closed reconciliation
queries (one RECONCILE_INCONCLUSIVE row each), then ``repeat`` times a claim of a new query
(``open``, no code: the check runs) and the row closing it (no check); the medians of each
append and their ratio.  The check seeks ``linked_calls`` (schema 11): the claim's cost stays
flat in the record's length, as the close's does.

``--ab DIR`` measures the same in a checkout from before (e.g. ``git archive`` of the commit
before the change, unpacked in DIR: its check scanned the record's rows holding the call's
text), each size in a process of its own per checkout, alternating which goes first, and
prints both claims and their ratio side by side.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
if "--src" in sys.argv:  # an --ab child: the journal of another checkout, before importing it
    import http_overhead

    http_overhead._use_source(Path(sys.argv[sys.argv.index("--src") + 1]))

import trio

from affidavit.journal import Journal
from affidavit.statemachine import Event

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "journal"))
from helpers import interrupted, query_row

IID = "act_bench"
_POSTED = 5000
"""Rows posted per batch while the record is filled."""


def _row(query: str, **attrs: object) -> Event:
    return query_row(IID, query, **attrs)


async def _measure(rows: int, repeat: int) -> tuple[float, float]:
    closed = {"code": "REMOTE_OUTCOME_UNKNOWN", "reason": "read"}
    with tempfile.TemporaryDirectory() as d:
        async with Journal.open(Path(d) / "j.db") as j:
            for event in interrupted(IID):
                await j.append(event)
            for start in range(0, rows, _POSTED):
                batch = range(start, min(rows, start + _POSTED))
                posted = await j.post_many([(_row(f"act_q{n}", **closed), None) for n in batch])
                await posted.wait()
            claims, closes = [], []
            for n in range(repeat):
                start = time.perf_counter()
                await j.append(_row(f"act_new{n}", code=None, reason="asking", open=True))
                claimed = time.perf_counter()
                await j.append(_row(f"act_new{n}", **closed))
                claims.append(claimed - start)
                closes.append(time.perf_counter() - claimed)
    return statistics.median(claims), statistics.median(closes)


def _child(rows: int, repeat: int, src: str | None) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--child", str(rows), "--repeat", str(repeat)]
    if src is not None:
        cmd += ["--src", src]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def _ab(sizes: list[int], repeat: int, old: str) -> None:
    label = Path(old).name
    print(f"{'rows':>8} {'claim ms':>9} {'@' + label:>12} {'old/new':>8} "
          f"{'close ms':>9} {'@' + label:>12}")  # fmt: skip
    for i, rows in enumerate(sizes):
        order = [None, old] if i % 2 == 0 else [old, None]
        got = {src: _child(rows, repeat, src) for src in order}
        new, was = got[None], got[old]
        print(f"{rows:>8} {new['claim'] * 1e3:>9.2f} {was['claim'] * 1e3:>12.2f} "
              f"{was['claim'] / new['claim']:>8.1f} {new['close'] * 1e3:>9.2f} "
              f"{was['close'] * 1e3:>12.2f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="100,10000,100000")
    parser.add_argument("--repeat", type=int, default=21)
    parser.add_argument("--ab", metavar="OLD_CHECKOUT", help="also measure checkout OLD (A/B)")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--src", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        claim, close = trio.run(_measure, args.child, args.repeat)
        print(json.dumps({"claim": claim, "close": close}))
        return
    sizes = [int(r) for r in args.rows.split(",")]
    if args.ab:
        _ab(sizes, args.repeat, args.ab)
        return
    print(f"{'rows':>8} {'claim ms':>9} {'close ms':>9} {'ratio':>6}")
    for rows in sizes:
        claim, close = trio.run(_measure, rows, args.repeat)
        print(f"{rows:>8} {claim * 1e3:>9.2f} {close * 1e3:>9.2f} {claim / close:>6.1f}")


if __name__ == "__main__":
    main()
