"""Strict JSON reading (``affidavit.strictjson``) vs ``json.loads``, side by side in one run, over
~5 MB bodies: what a batch response or a reconciliation answer costs to read strictly.

    .venv/bin/python tests/benchmarks/strict_bodies.py [--repeat R]

Bodies: ``ints`` (a 207-like list of 100,000 results, integers and strings), ``floats`` (the same
with a float per result: the finite-float hook runs per float) and ``dup`` (``ints`` with one
result naming a field twice, at the end).  Columns: ``json.loads`` (no check at all), strict
with no path (``root`` None: what ``selectors.json_body`` asks -- it only needs to know the body
is unreadable) and strict with the duplicate's path (what the request body's refusal names: a
second parse, only when a duplicate is found).  A script, not a test: it prints figures and
asserts nothing about time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import contextlib

from affidavit.strictjson import DuplicateField, loads_bytes


def _bodies() -> dict[str, bytes]:
    ints = [{"id": i, "status": 200, "note": "applied"} for i in range(100_000)]
    floats = [{**r, "took": r["id"] * 0.5} for r in ints]
    plain = json.dumps({"results": ints}).encode()
    dup = plain[:-2] + b', {"id": 1, "status": 200, "status": 400}]}'
    return {"ints": plain, "floats": json.dumps({"results": floats}).encode(), "dup": dup}


def _timed(read: Callable[[], Any], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        with contextlib.suppress(DuplicateField):
            read()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"{'body':8} {'MB':>5} {'json.loads':>11} {'strict':>9} {'ratio':>6} {'w/ path':>9}")
    for name, body in _bodies().items():
        plain = _timed(lambda b=body: json.loads(b), args.repeat)
        strict = _timed(lambda b=body: loads_bytes(b, None), args.repeat)
        path = _timed(lambda b=body: loads_bytes(b, "body"), args.repeat)
        print(
            f"{name:8} {len(body) / 1e6:5.1f} {plain:10.3f}s {strict:8.3f}s "
            f"{strict / plain:5.2f}x {path:8.3f}s"
        )


if __name__ == "__main__":
    main()
