"""Journal append throughput: group commit vs raw SQLite, measured side by side on one disk.

    .venv/bin/python tests/benchmarks/journal_append.py [--dir DIR] [--seconds S]

Prints barrier appends per second from 1 task and from 64 concurrent trio tasks, next to raw
``sqlite3`` single-row ``synchronous=FULL`` commits and raw 100-row batched commits, plus the time
to project a 100k-event journal from disk.  Targets (issue 3): 64 tasks >= 20x one task, and
within 3x of the raw batched rate; projection of 100k events under 1 s.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import tempfile
import time
from pathlib import Path

import trio

from affidavit.journal import Journal, JournalReader
from affidavit.statemachine import Event, EvidenceSource
from affidavit.statemachine import EventKind as E


def _happy(iid: str) -> list[Event]:
    return [
        Event(
            E.ACTION_ACCEPTED,
            iid,
            {
                "operation": {"target": "api", "protocol": "http", "fingerprint": "sha256:0f"},
                "session": f"s{hash(iid) % 8}",
            },
        ),
        Event(E.PREFLIGHT_VALIDATED, iid, {"config_hash": "sha256:cf"}),
        Event(E.CREDENTIAL_AUTHORIZED, iid, {"credential": "api-token", "version": "3"}),
        Event(E.DISPATCH_STARTED, iid, {"attempt": 1, "generation": 0}),
        Event(E.REQUEST_SENT, iid),
        Event(E.REMOTE_RESPONSE_STARTED, iid, {"status": 200}),
        Event(
            E.REMOTE_RESPONSE_COMPLETE,
            iid,
            {"outcome": "committed", "status": 200},
            source=EvidenceSource.REMOTE_RESPONSE,
        ),
    ]


async def _journal_rate(path: Path, tasks: int, seconds: float) -> float:
    count = 0
    async with Journal.open(path) as j:

        async def worker(w: int) -> None:
            nonlocal count
            n = 0
            deadline = trio.current_time() + seconds
            while trio.current_time() < deadline:
                for ev in _happy(f"w{w}-{n}"):
                    await j.append(ev, barrier=True)
                    count += 1
                n += 1

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for w in range(tasks):
                nursery.start_soon(worker, w)
        elapsed = time.perf_counter() - start
    return count / elapsed


def _raw_conn(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE t (seq INTEGER PRIMARY KEY, iid TEXT, kind TEXT, attrs TEXT)")
    return conn


def _raw_rate(path: Path, batch: int, seconds: float) -> float:
    conn = _raw_conn(path)
    row = ("w0-0", "DISPATCH_STARTED", '{"attempt":1,"generation":0}')
    count = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany("INSERT INTO t (iid, kind, attrs) VALUES (?,?,?)", [row] * batch)
        conn.execute("COMMIT")
        count += batch
    elapsed = time.perf_counter() - start
    conn.close()
    return count / elapsed


async def _fill(path: Path, events: int) -> None:
    async with Journal.open(path) as j:
        per = len(_happy("x"))

        async def worker(w: int, n: int) -> None:
            for i in range(n):
                for ev in _happy(f"f{w}-{i}"):
                    await j.append(ev, barrier=False)

        invocations = events // per
        async with trio.open_nursery() as nursery:
            for w in range(64):
                nursery.start_soon(worker, w, invocations // 64)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", default=None, help="directory on the disk to measure (default: tmp)")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--events", type=int, default=100_000)
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="affidavit-bench-", dir=args.dir))
    s = args.seconds
    one = trio.run(_journal_rate, base / "one.db", 1, s)
    many = trio.run(_journal_rate, base / "many.db", 64, s)
    raw1 = _raw_rate(base / "raw1.db", 1, s)
    raw100 = _raw_rate(base / "raw100.db", 100, s)

    big = base / "big.db"
    t0 = time.perf_counter()
    trio.run(_fill, big, args.events)
    fill = time.perf_counter() - t0
    with JournalReader.open(big) as r:
        t0 = time.perf_counter()
        records = r.list_actions()
        project = time.perf_counter() - t0
        t0 = time.perf_counter()
        report = r.verify()
        verify = time.perf_counter() - t0

    print(f"disk: {base} ({os.statvfs(base).f_bsize}-byte blocks)")
    print(f"{'journal barrier appends, 1 task':44} {one:12,.0f} /s")
    print(f"{'journal barrier appends, 64 tasks':44} {many:12,.0f} /s")
    print(f"{'raw sqlite3 FULL commit, 1 row each':44} {raw1:12,.0f} /s")
    print(f"{'raw sqlite3 FULL commit, 100 rows each':44} {raw100:12,.0f} /s")
    print(f"64 tasks / 1 task          = {many / one:6.1f}x   (target >= 20x)")
    print(f"raw 100-row batch / 64 tasks = {raw100 / many:6.1f}x   (target <= 3x)")
    print(f"journal 1 task / raw 1 row   = {one / raw1:6.2f}x")
    print(
        f"projection of {report.count:,} events ({len(records):,} actions) from disk: "
        f"{project:.2f} s (target < 1 s); verify: {verify:.2f} s; fill: {fill:.1f} s"
    )


if __name__ == "__main__":
    main()
