"""The daemon's ``GET /v1/actions`` answer over a large journal, the old way and the new, in one
run: the body its route makes (``daemon.app``'s ``actions``), from the streamed view cut to a
page (``Newest(limit).take(iter_actions(...))``, before) and from ``views.actions_page``
(now), each the median of ``--rounds``; the bodies must be the same bytes.  Two more columns:
``readable``, ``actions_page`` with a caller's filter (``readable=``, every target readable
here) and no summary, as MCP's list reads it -- streamed, like the first; and ``kept``, the
same with the daemon's kept summary (``summary=``, folded once before the rounds), as the
daemon's ``/v1/actions`` reads it -- the page alone while no invocation is hidden.

    .venv/bin/python tests/benchmarks/actions_page.py --journal PATH [--rounds R]

``PATH``: a journal built by ``tests/benchmarks/actions_view.py --build-only --journal PATH
--events 1000000``.  A script, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from affidavit.journal import JournalReader, SessionSummary  # noqa: E402
from affidavit.views import Newest, actions_page, record_json_encoder  # noqa: E402

QUERIES: tuple[tuple[int, dict[str, Any]], ...] = (
    (1000, {}),
    (100, {}),
    (1000, {"session": "s3"}),
    (1000, {"outcome": "unknown"}),
)


def _every(_record: Any) -> bool:
    return True


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
    args = parser.parse_args()
    with JournalReader.open(args.journal) as j:
        events = j.head()[0]
        print(f"journal: {events:,} events")
        summary = SessionSummary()
        t = time.perf_counter()
        j.newest_readable(0, summary, _every)  # the daemon's kept summary, folded once
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


if __name__ == "__main__":
    main()
