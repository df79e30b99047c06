"""The console's Actions page without a filter and its Journal page's verify over a large
journal, the old way and the new, interleaved in one run (each the median of ``--rounds``):

* actions: ``pages.actions_page`` folding every record (before) and from a kept
  ``SessionSummary`` (after; its first fold is timed apart, once) -- same counts and rows;
* metrics since a time (``/v1/metrics?since=``): ``metrics(iter_actions(since=...))``
  (before) and the kept summary's tallies of the records accepted since (after);
* the newest page with its total (``/v1/actions`` without a filter, MCP): counted in the
  database (before) and the kept summary's count (after);
* verify: ``JournalReader.verify()`` (before, every request) and ``verify_since`` from an
  intact report of the rows up to ``--appended`` rows before the head (after: what a request
  reads once that many rows were appended since the last) -- the same report.

    .venv/bin/python tests/benchmarks/console_pages.py --journal PATH [--rounds R]
        [--parts actions,metrics,total,verify]

``PATH``: a journal built by ``tests/benchmarks/actions_view.py --build-only`` (a copy: the
reader is read-only, but keep the original aside).  A script, not a test.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from affidavit.console import pages  # noqa: E402
from affidavit.journal import JournalReader, SessionSummary, VerifyReport  # noqa: E402
from affidavit.views import metrics, metrics_key, metrics_of  # noqa: E402


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def shape(page: dict[str, Any]) -> tuple[Any, ...]:
    return page["total"], page["matrix"], [r["invocation_id"] for r in page["rows"]]


def base_before(j: JournalReader, whole: VerifyReport, appended: int) -> VerifyReport:
    """``whole`` as a verify would have reported it ``appended`` rows ago (at a checkpoint)."""
    cps = [cp for cp in j.tables.checkpoints() if cp.seq <= whole.count - appended]
    cp = cps[-1]
    return dataclasses.replace(whole, count=cp.seq, head_hash=cp.hash, signed_seq=cp.seq,
                               signed_at=cp.at)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--journal", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--appended", type=int, default=1000)
    parser.add_argument("--parts", default="actions,metrics,total,verify")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    with JournalReader.open(args.journal) as j:
        print(f"journal: {j.head()[0]:,} events")
        summary = SessionSummary(metrics_key)
        first, _ = timed(lambda: pages.actions_page(j, pages.ActionFilters(), summary))
        print(f"actions page: the kept summary's first fold {first * 1000:.0f} ms (once)")
        if "actions" in parts:
            actions(j, summary, args.rounds)
        if "metrics" in parts:
            since(j, summary, args.rounds)
        if "total" in parts:
            total(j, summary, args.rounds)
        if "verify" in parts:
            verify(j, args.rounds, args.appended)


def total(j: JournalReader, summary: SessionSummary, rounds: int) -> None:
    old_t, new_t, same = [], [], True
    for _ in range(rounds):
        now = time.time()
        o, old = timed(functools.partial(j.newest_actions, 100, now=now))
        n, new = timed(functools.partial(j.newest_actions, 100, now=now, summary=summary))
        old_t.append(o)
        new_t.append(n)
        same = same and old[1] == new[1] and old[0] == new[0]
    o, n = statistics.median(old_t), statistics.median(new_t)
    print(f"newest 100 with the total ({old[1]}): before {o * 1000:9.1f} ms  "
          f"after {n * 1000:8.1f} ms  x{o / n:7.1f}  {'same' if same else 'DIFFER'}")  # fmt: skip


def actions(j: JournalReader, summary: SessionSummary, rounds: int) -> None:
    old_t, new_t, same = [], [], True
    for _ in range(rounds):
        o, old = timed(lambda: pages.actions_page(j, pages.ActionFilters()))
        n, new = timed(lambda: pages.actions_page(j, pages.ActionFilters(), summary))
        old_t.append(o)
        new_t.append(n)
        same = same and shape(old) == shape(new)
    o, n = statistics.median(old_t), statistics.median(new_t)
    print(f"actions page, no filter: before {o * 1000:9.1f} ms  after {n * 1000:8.1f} ms  "
          f"x{o / n:7.1f}  {'same' if same else 'DIFFER'}")  # fmt: skip


def since(j: JournalReader, summary: SessionSummary, rounds: int) -> None:
    head = j.head()[0]
    [one] = j.tables.event_rows(1, 1)
    [last] = j.tables.event_rows(head, head)
    at = (one[1] + last[1]) / 2  # (half way through the journal's time)
    old_t, new_t, same = [], [], True
    for _ in range(rounds):
        o, old = timed(lambda: metrics(j.iter_actions(since=at)))
        n, new = timed(lambda: metrics_of(j.summarized_tallies(summary, at)[0]))
        old_t.append(o)
        new_t.append(n)
        same = same and old == new
    o, n = statistics.median(old_t), statistics.median(new_t)
    print(f"metrics since a time ({old['invocations']} of them): before {o * 1000:9.1f} ms  "
          f"after {n * 1000:8.1f} ms  x{o / n:7.1f}  {'same' if same else 'DIFFER'}")  # fmt: skip


def verify(j: JournalReader, rounds: int, appended: int) -> None:
    old_t, new_t, same = [], [], True
    for _ in range(rounds):
        o, whole = timed(j.verify)
        base = base_before(j, whole, appended)
        n, ext = timed(functools.partial(j.verify_since, base))
        old_t.append(o)
        new_t.append(n)
        key = ("ok", "count", "first_bad_seq", "head_hash", "signed_seq")
        same = same and ext is not None and all(getattr(ext, k) == getattr(whole, k) for k in key)
    o, n = statistics.median(old_t), statistics.median(new_t)
    verdict = "same" if same else "DIFFER"
    print(f"journal page verify ({appended} rows since): before {o * 1000:9.1f} ms  "
          f"after {n * 1000:8.1f} ms  x{o / n:7.1f}  {verdict}")  # fmt: skip


if __name__ == "__main__":
    main()
