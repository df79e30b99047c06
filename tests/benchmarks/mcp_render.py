"""The MCP text block of a large non-envelope answer, the old way and the new, in one run: a
reconcile_query answer whose query body is ``--mib`` Mi "é" rendered by dumping the whole answer
(``json.dumps``, ASCII escapes, sorted keys) and cutting it at ``PREVIEW`` (before), beside
``affidavit.mcp.render.render`` (now), which cuts every string before dumping.  Peak traced
memory and time of each, and their ratios.  Then a get_record answer of ``--events`` events:
``json.dumps`` of it (what any whole walk costs at least) beside ``render``, which stops walking
once its budget is spent.

    .venv/bin/python tests/benchmarks/mcp_render.py [--mib 64] [--events 100000]

A script, not a test.
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from affidavit.mcp.render import PREVIEW, render


def _before(answer: dict[str, Any]) -> str:
    return json.dumps(answer, sort_keys=True, separators=(",", ":"))[:PREVIEW]


def _measure(fn: Callable[[dict[str, Any]], str], answer: dict[str, Any]) -> tuple[int, float]:
    tracemalloc.start()
    start = time.perf_counter()
    try:
        fn(answer)
        took = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak, took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--events", type=int, default=100_000)
    args = parser.parse_args()
    mib = args.mib
    error = {"code": "X", "phase": "remote", "outcome": "unknown", "retry": "reconcile"}
    answer = {
        "reconciled": False,
        "envelope": {"invocation_id": "i-1", "error": error},
        "query": {"invocation_id": "q-1", "result": {"status": 200, "body": "é" * (mib << 20)}},
    }
    (old_peak, old_s), (new_peak, new_s) = _measure(_before, answer), _measure(render, answer)
    print(f"{mib} Mi 'é' body      before        now     ratio")
    print(f"peak (MB)   {old_peak / 1e6:12.1f} {new_peak / 1e6:10.3f} {old_peak / new_peak:9.0f}x")
    print(f"time (s)    {old_s:12.3f} {new_s:10.5f} {old_s / new_s:9.0f}x")
    record = {"invocation_id": "i-2", "state": "succeeded", "outcome": "committed"}
    events = [{"kind": "E", "attrs": {"n": n, "outcome": "committed"}} for n in range(args.events)]
    answer = {"events": events, "record": record}
    (old_peak, old_s), (new_peak, new_s) = _measure(json.dumps, answer), _measure(render, answer)
    print(f"{args.events} events  json.dumps     render     ratio")
    print(f"peak (MB)   {old_peak / 1e6:12.1f} {new_peak / 1e6:10.3f} {old_peak / new_peak:9.0f}x")
    print(f"time (s)    {old_s:12.3f} {new_s:10.5f} {old_s / new_s:9.0f}x")


if __name__ == "__main__":
    main()
