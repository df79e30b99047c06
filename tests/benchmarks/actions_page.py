"""The daemon's ``GET /v1/actions`` answer over a large journal, the old way and the new, in one
run: the body its route makes (``daemon.app``'s ``actions``), from the streamed view cut to a
page (``Newest(limit).take(iter_actions(...))``, before) and from ``views.actions_page``
(now), each the median of ``--rounds``; the bodies must be the same bytes.  Two more columns:
``readable``, ``actions_page`` with a caller's filter (``readable=``, every target readable
here) and no summary, as MCP's list reads it -- streamed, like the first; and ``kept``, the
same with the daemon's kept summary (``summary=``, folded once before the rounds), as the
daemon's ``/v1/actions`` (and MCP's list) reads it.

Then the case of issue 15's list regression, "a caller's page with an invocation on a removed
target": one invocation on a target the caller may not read appended to a copy of the journal
(``--removed``, default on), and the caller's page over it streamed and filtered (``streamed``:
what ``actions_page`` did as soon as such an invocation was there, before) beside the page from
the kept summary (``kept``: its count per target and the page's rows), same bytes.

    .venv/bin/python tests/benchmarks/actions_page.py --journal PATH [--rounds R]

Last, the case where a removed target holds most of the history (``--hidden``, default on):
eleven invocations on a target ``fresh`` appended to another copy, and a caller that reads only
``fresh`` -- the step ``SessionSummary.readable_page`` takes under the summary's lock, as it
scanned back from the newest through every invocation until ``limit`` readable ones were found
(``scan``: that loop, reproduced here over the same kept state) beside the page it makes now
from each target's own list (``merged``), and the whole caller's page (``actions_page``).

``PATH``: a journal built by ``tests/benchmarks/actions_view.py --build-only --journal PATH
--events 1000000``.  A script, not a test.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import trio  # noqa: E402

from affidavit.journal import Journal, JournalReader, SessionSummary  # noqa: E402
from affidavit.statemachine import Event  # noqa: E402
from affidavit.views import Newest, actions_page, record_json_encoder  # noqa: E402
from tests.journal.helpers import happy  # noqa: E402

QUERIES: tuple[tuple[int, dict[str, Any]], ...] = (
    (1000, {}),
    (100, {}),
    (1000, {"session": "s3"}),
    (1000, {"outcome": "unknown"}),
)


REMOVED_QUERIES: tuple[tuple[int, dict[str, Any]], ...] = (
    (1000, {}),
    (100, {}),
    (1000, {"session": "s3"}),
)


def _every(_record: Any) -> bool:
    return True


def _configured(target: str | None) -> bool:
    """A caller's ``readable`` once the target ``removed`` left the configuration."""
    return target != "removed"


async def _append_removed(path: Path) -> None:
    """One invocation on the target ``removed``, in session ``s3``, appended to ``path``."""
    await _append_on(path, "removed", ["act_bench_removed"])


async def _append_on(path: Path, target: str, iids: list[str]) -> None:
    """An invocation on ``target`` for each of ``iids``, in session ``s3``, appended."""
    async with Journal.open(path) as j:
        for iid in iids:
            run = happy(iid, "s3")
            first = run[0]
            op = {**first.attrs["operation"], "target": target}
            run[0] = Event(first.kind, first.invocation_id, {**first.attrs, "operation": op})
            for ev in run:
                await j.append(ev, barrier=True)


def _copy(journal: Path, copy: Path) -> None:
    """``journal`` copied to ``copy`` with its keys (the journal records them)."""
    src, dst = sqlite3.connect(journal), sqlite3.connect(copy)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()
    for key in (".key", ".signing.key"):
        mine = journal.with_name(journal.name + key)
        if mine.exists():
            shutil.copy2(mine, copy.with_name(copy.name + key))


def private(run: Any, journal: Path, rounds: int) -> None:
    """``run(journal, rounds)`` with the copies it makes as private as the journal must be."""
    mask = os.umask(0o077)
    try:
        run(journal, rounds)
    finally:
        os.umask(mask)


def _fresh(target: str | None) -> bool:
    """A caller's ``readable`` once every target but ``fresh`` left the configuration."""
    return target == "fresh"


def _scan(summary: SessionSummary, limit: int) -> list[str]:
    """The page as ``readable_page`` found it before: back from the newest invocation until
    ``limit`` readable ones were found (the kept state read as it was then)."""
    shown = []
    for inv in reversed(summary._state.invs.values()):
        if _fresh(inv.target):
            shown.append(inv.iid)
            if len(shown) == limit:
                break
    shown.reverse()
    return shown


def hidden_history(journal: Path, rounds: int) -> None:
    """The page step with most of the history on targets the caller may not read."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "j.db"
        _copy(journal, copy)
        trio.run(_append_on, copy, "fresh", [f"act_bench_fresh_{i:02d}" for i in range(11)])
        with JournalReader.open(copy) as j:
            summary = SessionSummary()
            actions_page(j, 0, readable=_fresh, summary=summary)  # folded once
            hidden = len(summary._state.invs) - 11
            print(f"eleven invocations readable, {hidden:,} on a removed target")
            for limit in (1000, 100, 10):
                scan_t: list[float] = []
                merged_t: list[float] = []
                page_t: list[float] = []
                for _ in range(rounds):
                    t = time.perf_counter()
                    old = _scan(summary, limit)
                    scan_t.append(time.perf_counter() - t)
                    with j.snapshot():
                        t = time.perf_counter()
                        page = summary.readable_page(j.tables, time.time(), _fresh, limit)
                        merged_t.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    actions_page(j, limit, readable=_fresh, summary=summary)
                    page_t.append(time.perf_counter() - t)
                same = "same ids" if old == [iid for iid, _, _ in page.shown] else "DIFFER"
                o, n = statistics.median(scan_t), statistics.median(merged_t)
                w = statistics.median(page_t)
                print(
                    f"limit={limit:<5} scan {o * 1000:9.2f} ms  merged {n * 1000:8.3f} ms  "
                    f"x{o / n:8.1f}  whole page {w * 1000:7.2f} ms  {same}"
                )


def _removed_target(journal: Path, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "j.db"
        _copy(journal, copy)
        trio.run(_append_removed, copy)
        with JournalReader.open(copy) as j:
            summary = SessionSummary()
            t = time.perf_counter()
            actions_page(j, 0, readable=_configured, summary=summary)
            print(
                "one invocation on a removed target; summary folded once in "
                f"{(time.perf_counter() - t) * 1000:.0f} ms"
            )
            for limit, filters in REMOVED_QUERIES:
                old_t: list[float] = []
                new_t: list[float] = []
                bodies: set[bytes] = set()
                for _ in range(rounds):
                    now = time.time()
                    t = time.perf_counter()
                    rows = (r for r in j.iter_actions(now=now, **filters) if _configured(r.target))
                    old = body(Newest(limit).take(rows), limit)
                    old_t.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    page = actions_page(
                        j, limit, now=now, readable=_configured, summary=summary, **filters
                    )
                    new = body(page, limit)
                    new_t.append(time.perf_counter() - t)
                    bodies |= {old, new}
                o, n = statistics.median(old_t), statistics.median(new_t)
                same = "same bytes" if len(bodies) == 1 else "DIFFER"
                print(
                    f"limit={limit:<5} {filters!s:24} streamed {o * 1000:9.1f} ms  "
                    f"kept {n * 1000:8.1f} ms  x{o / n:7.1f}  {same}"
                )


def body(page: Newest, limit: int) -> bytes:
    texts = ",".join(map(record_json_encoder(), page.records))
    return (
        f'{{"actions":[{texts}],"limit":{limit},"total":{page.total},'
        f'"truncated":{"true" if page.truncated else "false"}}}\n'
    ).encode()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--journal", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--removed",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also the caller's page with an invocation on a removed target",
    )
    parser.add_argument(
        "--hidden",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also the page step with most of the history on a removed target",
    )
    args = parser.parse_args()
    with JournalReader.open(args.journal) as j:
        events = j.head()[0]
        print(f"journal: {events:,} events")
        summary = SessionSummary()
        t = time.perf_counter()
        actions_page(j, 0, readable=_every, summary=summary)  # the kept summary, folded once
        print(f"summary folded once in {(time.perf_counter() - t) * 1000:.0f} ms")
        for limit, filters in QUERIES:
            old_t: list[float] = []
            new_t: list[float] = []
            kept_t: list[float] = []
            summ_t: list[float] = []
            bodies: set[bytes] = set()
            for _ in range(args.rounds):
                now = time.time()
                t = time.perf_counter()  # the same clock for both: hints computed for ``now``
                old = body(Newest(limit).take(j.iter_actions(now=now, **filters)), limit)
                old_t.append(time.perf_counter() - t)
                t = time.perf_counter()
                page = actions_page(j, limit, now=now, **filters)
                new = body(page, limit)
                new_t.append(time.perf_counter() - t)
                t = time.perf_counter()
                kept = body(actions_page(j, limit, now=now, readable=_every, **filters), limit)
                kept_t.append(time.perf_counter() - t)
                t = time.perf_counter()
                page = actions_page(j, limit, now=now, readable=_every, summary=summary, **filters)
                summ = body(page, limit)
                summ_t.append(time.perf_counter() - t)
                bodies |= {old, new, kept, summ}
            o, n = statistics.median(old_t), statistics.median(new_t)
            k, m = statistics.median(kept_t), statistics.median(summ_t)
            same = "same bytes" if len(bodies) == 1 else "DIFFER"
            print(
                f"limit={limit:<5} {filters!s:24} before {o * 1000:9.1f} ms  "
                f"after {n * 1000:8.1f} ms  x{o / n:6.1f}  readable {k * 1000:9.1f} ms "
                f"x{k / n:6.1f} of after  kept {m * 1000:8.1f} ms x{m / n:5.1f}  {same}"
            )

    if args.removed:
        private(_removed_target, args.journal, args.rounds)
    if args.hidden:
        private(hidden_history, args.journal, args.rounds)


if __name__ == "__main__":
    main()
