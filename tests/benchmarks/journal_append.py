"""Journal append throughput: group commit vs raw SQLite, measured side by side on one disk.

    .venv/bin/python tests/benchmarks/journal_append.py [--dir DIR] [--seconds S] [--runs R]
        [--events N] [--ids engine|worker] [--profile FILE] [--tune-gc]
        [--ab OLD_CHECKOUT [--src NEW_CHECKOUT]]

Prints barrier appends per second from 1 task and from 64 concurrent trio tasks, next to raw
``sqlite3`` single-row ``synchronous=FULL`` commits and raw 100-row batched commits, plus the time
to project a 100k-event journal from disk, and what the signed checkpoint each transaction
writes costs next to the writer's CPU per transaction.  Targets (issue 3, kept by issue 15): 64
tasks >= 20x one task, and within 3x of the raw batched rate; projection of 100k events under 1 s.

Every column of one run uses the same directory (``--dir``, default: the system temp dir), so
the same disk.  The disk is noisy (fsync ~0.1-4 ms here), so the four rates are measured
``--runs`` times, interleaved, and the table shows medians (min-max); the ratios are of medians.
``--dir /dev/shm`` takes fsync out and shows the CPU-bound ceiling.

``--ids engine`` (default) names invocations the way the engine does (``act_`` + a
time-sortable ULID, ``affidavit.engine.new_invocation_id``), so the ``(invocation_id, seq)``
index sees production's locality; ``--ids worker`` is the older ``w<task>-<n>`` naming, which
keeps 64 index leaves hot at once.

``--tune-gc`` tunes the cyclic collector as ``affidavit serve`` tunes its own process
(``affidavit.engine.tune_collector``: start-up frozen, a young collection every 20,000
allocations) before the rates are measured; by default it is CPython's (700).  The journal is a
library: its rates are shown both ways, the collector being the embedding process's choice.

``--profile FILE`` runs the 64-task phase once more under cProfile: the trio thread's stats go
to FILE, the journal writer thread's (cProfile sees one thread at a time) to FILE.writer, and
the top entries of both are printed.

``--ab DIR`` races the journal imported from another checkout (e.g. the commit before a change)
against this one: each rate is measured in a process of its own, the two checkouts alternating
within every run, and both group-commit ratios are printed (then nothing else is measured), with
the p50 latency of one task's append and each checkout's hand-off alone: a barrier write whose
transaction does nothing, queued and answered from one task (the writer thread's work replaced).
``--src DIR`` measures that checkout in place of this one (two commits while the worktree changes).
Each side's cycle -- the time from one transaction to the next -- is split into the transaction
(its ``COMMIT``, the WAL write and fsync, shown apart) and the loop's turn (waking the writers,
building and queueing their next rows, the hand-off): at 64 tasks every writer waits in the same
transaction, so the three add up, and the split says which a change shortened.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import itertools
import json
import os
import pstats
import secrets
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).parent))
if "--src" in sys.argv:  # an --ab child: the journal of another checkout, before importing it
    import http_overhead

    http_overhead._use_source(Path(sys.argv[sys.argv.index("--src") + 1]))

from affidavit.journal import Batch, Journal, JournalReader, SigningKey
from affidavit.statemachine import Event, EvidenceSource
from affidavit.statemachine import EventKind as E

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def engine_id(_w: int, _n: int) -> str:
    """Same shape as ``affidavit.engine.new_invocation_id`` (48-bit ms time + 80 random bits,
    Crockford base32), without importing the engine."""
    value = (int(time.time() * 1000) << 80) | int.from_bytes(secrets.token_bytes(10), "big")
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "act_" + "".join(reversed(chars))


def worker_id(w: int, n: int) -> str:
    return f"w{w}-{n}"


IDS: dict[str, Callable[[int, int], str]] = {"engine": engine_id, "worker": worker_id}


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


@dataclass
class WriterStats:
    """Counts the writer's transactions through ``Journal.around_transaction`` (one call is one
    SQLite transaction), its CPU time (``time.thread_time`` in the writer thread), the wall time
    of its transactions (``wall``) and of their ``COMMIT`` alone (``commit``: from
    ``Journal.before_commit`` to the transaction's end -- the WAL write and, for a barrier, its
    fsync).  A group commit's cycle is the transaction's wall time plus the loop's turn (waking
    the writers, building and queueing their next rows): these split it."""

    txns: int = 0
    requests: int = 0
    cpu: float = 0.0
    wall: float = 0.0
    commit: float = 0.0
    profile: cProfile.Profile | None = None
    _commit_at: float = 0.0

    def install(self, journal: Journal) -> None:
        @contextlib.contextmanager
        def counted(batch: Batch) -> Iterator[None]:
            self.txns += 1
            self.requests += batch.writes
            c0, w0 = time.thread_time(), time.perf_counter()
            self._commit_at = 0.0
            if self.profile is not None:
                self.profile.enable()
            try:
                yield
            finally:
                if self.profile is not None:
                    self.profile.disable()
                end = time.perf_counter()
                self.cpu += time.thread_time() - c0
                self.wall += end - w0
                if self._commit_at:
                    self.commit += end - self._commit_at

        def commit_starts(_batch: Batch) -> None:
            self._commit_at = time.perf_counter()

        journal.around_transaction = counted
        journal.before_commit = commit_starts

    def per_txn_ms(self) -> tuple[float, float]:
        """Mean wall time of a transaction and of its ``COMMIT``, milliseconds."""
        n = max(self.txns, 1)
        return self.wall / n * 1e3, self.commit / n * 1e3


async def _journal_rate(
    path: Path,
    tasks: int,
    seconds: float,
    ids: Callable[[int, int], str],
    stats: WriterStats,
    profile: cProfile.Profile | None = None,
    latencies: list[float] | None = None,
) -> float:
    count = 0
    async with Journal.open(path) as j:
        stats.install(j)

        async def worker(w: int) -> None:
            nonlocal count
            n = 0
            deadline = trio.current_time() + seconds
            while trio.current_time() < deadline:
                for ev in _happy(ids(w, n)):
                    if latencies is None:
                        await j.append(ev, barrier=True)
                    else:
                        t0 = time.perf_counter()
                        await j.append(ev, barrier=True)
                        latencies.append(time.perf_counter() - t0)
                    count += 1
                n += 1

        start = time.perf_counter()
        if profile is not None:
            profile.enable()
        try:
            async with trio.open_nursery() as nursery:
                for w in range(tasks):
                    nursery.start_soon(worker, w)
        finally:
            if profile is not None:
                profile.disable()
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


async def _fill(path: Path, events: int, ids: Callable[[int, int], str]) -> None:
    async with Journal.open(path) as j:
        per = len(_happy("x"))

        async def worker(w: int, n: int) -> None:
            for i in range(n):
                for ev in _happy(ids(w, i)):
                    await j.append(ev, barrier=False)

        invocations = events // per
        async with trio.open_nursery() as nursery:
            for w in range(64):
                nursery.start_soon(worker, w, invocations // 64)


async def _read_costs(path: Path, n: int = 500) -> dict[str, float]:
    """Microseconds per read the engine makes after a call, for invocations just written."""
    out: dict[str, float] = {}
    async with Journal.open(path) as j:
        iids = [engine_id(0, i) for i in range(n)]
        for iid in iids:
            for ev in _happy(iid):
                await j.append(ev, barrier=False)
            await j.put_result_chunk(iid, "body", 0, b"x" * 512)
            await j.commit_result(Event(E.RESULT_COMMITTED, iid, {}), summary={"status": 200})
        with JournalReader.open(path) as r:
            for name, fn in (
                ("Journal.record (writer's projection)", j.record),
                ("JournalReader.record (read and fold)", r.record),
                ("Journal.events", j.events),
                ("Journal.read_result (hashes verified)", j.read_result),
            ):
                t0 = time.perf_counter()
                for iid in iids:
                    fn(iid)
                out[name] = (time.perf_counter() - t0) / n * 1e6
    return out


def _sign_cost(base: Path, n: int = 2000) -> float:
    """Microseconds per checkpoint signature (``SigningKey.sign``: message plus Ed25519)."""
    key = SigningKey.create(base / "bench.signing.key")
    h = "ab" * 32
    t0 = time.perf_counter()
    for i in range(1, n + 1):
        key.sign(i, h, i - 1, 1.7e9)
    return (time.perf_counter() - t0) / n * 1e6


def _cell(values: list[float], unit: str = "/s") -> str:
    med = statistics.median(values)
    if unit == "/s":
        return f"{med:12,.0f} /s  ({min(values):,.0f}-{max(values):,.0f})"
    return f"{med:12.3f} s   ({min(values):.3f}-{max(values):.3f})"


def _verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


async def _handoff(path: Path, n: int = 20_000) -> dict[str, float]:
    """The writer's hand-off alone: a barrier write whose transaction does nothing (the writer
    thread's ``_run_batch`` replaced in this process), queued and answered ``n`` times from one
    task -- what each transaction costs besides its SQL and fsync.  p50 latency and process CPU,
    microseconds."""
    from affidavit.journal import writer

    def nothing(self: writer.Writer, batch: list[writer.Req[Any]]) -> None:
        for r in batch:
            r.result = None

    writer.Writer._run_batch = nothing  # type: ignore[method-assign]
    lat = []
    async with Journal.open(path) as j:
        w = j._writer
        cpu = time.process_time()
        for _ in range(n):
            t0 = time.perf_counter()
            await w.submit(None, (), barrier=True)
            lat.append(time.perf_counter() - t0)
        cpu = time.process_time() - cpu
    return {"lat": statistics.median(lat), "proc": cpu / n * 1e6}


def _tune_gc() -> None:
    """``--tune-gc``: the collector as ``affidavit serve`` has it (an ``--ab`` checkout from
    before ``tune_collector`` existed: untouched)."""
    import affidavit.engine

    tune = getattr(affidavit.engine, "tune_collector", None)
    if tune is not None:
        tune()


def _child(base: Path, tasks: int, seconds: float, ids: Callable[[int, int], str]) -> None:
    """``--child TASKS``: one rate (TASKS 0: the hand-off alone), a JSON line for ``_ab``."""
    if tasks == 0:
        print(json.dumps(trio.run(_handoff, base / f"{os.getpid()}-handoff.db")))
        return
    st = WriterStats()
    lat: list[float] = []
    cpu = time.process_time()
    path = base / f"{os.getpid()}-{tasks}.db"
    rate = trio.run(_journal_rate, path, tasks, seconds, ids, st, None, lat)
    cpu = (time.process_time() - cpu) / max(len(lat), 1) * 1e6
    out = {"rate": rate, "batch": st.requests / max(st.txns, 1), "lat": statistics.median(lat)}
    txn, commit = st.per_txn_ms()
    cycle = 1e3 / max(st.txns / max(len(lat), 1) * rate, 1e-9)  # ms from one txn to the next
    out.update(cycle=cycle, txn=txn, commit=commit, loop=cycle - txn)
    print(json.dumps({**out, "cpu": st.cpu / max(st.requests, 1) * 1e6, "proc": cpu}))


def _ab(args: argparse.Namespace, base: Path) -> None:
    """``--ab SRC``: 1-task and 64-task rates of this checkout (or of ``--src``'s) and of SRC,
    each in a process of its own, interleaved (the order alternates every run); medians and
    both ratios."""
    this = "this checkout" if args.src is None else f"@ {Path(args.src).name}"
    sides = {this: args.src, f"@ {Path(args.ab).name}": args.ab}
    got: dict[tuple[str, int], list[dict[str, float]]] = {}
    for run in range(args.runs):
        order = list(sides.items())[:: 1 if run % 2 == 0 else -1]
        for tasks in (0, 1, 64):
            for label, src in order:
                cmd = [sys.executable, __file__, "--child", str(tasks), "--dir", str(base)]
                cmd += ["--seconds", str(args.seconds), "--ids", args.ids]
                if args.tune_gc:
                    cmd += ["--tune-gc"]
                if src is not None:
                    cmd += ["--src", src]
                out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
                got.setdefault((label, tasks), []).append(json.loads(out.strip().splitlines()[-1]))
    gc_ = "tuned as affidavit serve's" if args.tune_gc else "CPython's default"
    print(f"{args.runs} interleaved runs of {args.seconds:g} s, medians (min-max); collector {gc_}")
    print(f"load {_load()}")
    for label in sides:
        one = [r["rate"] for r in got[(label, 1)]]
        many = [r["rate"] for r in got[(label, 64)]]

        def med(tasks: int, key: str, label: str = label) -> float:
            return statistics.median(r[key] for r in got[(label, tasks)])

        print(f"{label}:")
        print(
            f"  hand-off of an empty transaction: p50 {med(0, 'lat') * 1e6:.1f} us, process CPU "
            f"{med(0, 'proc'):.1f} us"
        )
        print(f"  {'1 task':10} {_cell(one)}  (p50 {med(1, 'lat') * 1e3:.3f} ms per append)")
        print(
            f"  {'64 tasks':10} {_cell(many)}  ({med(64, 'batch'):.1f} per txn; CPU per "
            f"append: process {med(64, 'proc'):.1f} us, writer thread {med(64, 'cpu'):.1f} us)"
        )
        for tasks in (1, 64):
            print(
                f"  {tasks:2} task(s), a transaction's cycle {med(tasks, 'cycle'):.3f} ms: the "
                f"transaction {med(tasks, 'txn'):.3f} ms (its COMMIT {med(tasks, 'commit'):.3f} "
                f"ms), the loop's turn {med(tasks, 'loop'):.3f} ms  (medians of each)"
            )
        ratio = statistics.median(many) / statistics.median(one)
        print(f"  64 tasks / 1 task = {ratio:.1f}x  (target >= 20x)  {_verdict(ratio >= 20)}")


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dir", default=None, help="directory on the disk to measure (default: tmp)")
    ap.add_argument("--seconds", type=float, default=3.0, help="per rate measurement")
    ap.add_argument("--runs", type=int, default=3, help="interleaved repetitions (medians)")
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--ids", choices=sorted(IDS), default="engine")
    ap.add_argument("--profile", default=None, help="cProfile the 64-task phase into FILE")
    ap.add_argument("--tune-gc", action="store_true", help="the collector as affidavit serve's")
    ap.add_argument("--ab", metavar="SRC", help="race the journal of checkout SRC (A/B)")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--src", metavar="DIR", help="with --ab: measure checkout DIR, not this one")
    args = ap.parse_args()
    if args.tune_gc:
        _tune_gc()
    if args.child is not None:
        _child(Path(args.dir), args.child, args.seconds, IDS[args.ids])
        return
    base = Path(tempfile.mkdtemp(prefix="affidavit-bench-", dir=args.dir))
    if args.ab:
        _ab(args, base)
        return
    s = args.seconds
    ids = IDS[args.ids]
    names = itertools.count()
    one: list[float] = []
    many: list[float] = []
    raw1: list[float] = []
    raw100: list[float] = []
    batch: list[float] = []
    wcpu: list[float] = []
    one_cpu: list[float] = []
    for _ in range(args.runs):
        st1 = WriterStats()
        one.append(trio.run(_journal_rate, base / f"one{next(names)}.db", 1, s, ids, st1))
        one_cpu.append(st1.cpu / max(st1.txns, 1) * 1e6)
        st = WriterStats()
        rate = trio.run(_journal_rate, base / f"many{next(names)}.db", 64, s, ids, st)
        many.append(rate)
        batch.append(st.requests / max(st.txns, 1))
        wcpu.append(st.cpu / max(st.requests, 1) * 1e6)
        raw1.append(_raw_rate(base / f"raw1-{next(names)}.db", 1, s))
        raw100.append(_raw_rate(base / f"raw100-{next(names)}.db", 100, s))

    big = base / "big.db"
    t0 = time.perf_counter()
    trio.run(_fill, big, args.events, ids)
    fill = time.perf_counter() - t0
    project: list[float] = []
    verify: list[float] = []
    for _ in range(args.runs):
        # A fresh reader each time: nothing of an earlier fold is cached in this process.
        with JournalReader.open(big) as r:
            t0 = time.perf_counter()
            records = r.list_actions()
            project.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            report = r.verify()
            verify.append(time.perf_counter() - t0)

    m_one, m_many = statistics.median(one), statistics.median(many)
    m_raw1, m_raw100 = statistics.median(raw1), statistics.median(raw100)
    m_project = statistics.median(project)
    print(f"disk: {base} ({os.statvfs(base).f_bsize}-byte blocks); ids: {args.ids}; ", end="")
    print(f"{args.runs} runs of {s:g} s, median (min-max)")
    print(f"{'journal barrier appends, 1 task':40} {_cell(one)}")
    print(f"{'journal barrier appends, 64 tasks':40} {_cell(many)}")
    print(f"{'raw sqlite3 FULL commit, 1 row each':40} {_cell(raw1)}")
    print(f"{'raw sqlite3 FULL commit, 100 rows each':40} {_cell(raw100)}")
    print(
        f"64 tasks: {statistics.median(batch):.1f} appends per transaction, writer thread CPU "
        f"{statistics.median(wcpu):.1f} us per append"
    )
    sign = _sign_cost(base)
    m_one_cpu = statistics.median(one_cpu)
    print(
        f"checkpoint signature (one per transaction): {sign:.1f} us = "
        f"{sign / m_one_cpu * 100:.0f}% of the writer's CPU per 1-task transaction "
        f"({m_one_cpu:.1f} us), {sign / statistics.median(batch):.1f} us per append at "
        f"{statistics.median(batch):.0f} appends per transaction"
    )
    r_group = m_many / m_one
    r_raw = m_raw100 / m_many
    print(
        f"64 tasks / 1 task             = {r_group:6.1f}x  (target >= 20x)  "
        f"{_verdict(r_group >= 20)}"
    )
    print(f"raw 100-row batch / 64 tasks  = {r_raw:6.1f}x  (target <= 3x)   {_verdict(r_raw <= 3)}")
    print(f"journal 1 task / raw 1 row    = {m_one / m_raw1:6.2f}x")
    print(
        f"projection of {report.count:,} events ({len(records):,} actions) from disk: "
        f"{_cell(project, 's')}  (target < 1 s)  {_verdict(m_project < 1.0)}"
    )
    print(f"verify of the same journal:   {_cell(verify, 's')};  fill: {fill:.1f} s")

    for name, us in trio.run(_read_costs, base / "reads.db").items():
        print(f"{name:40} {us:8.1f} us per call")

    if args.profile:
        main_prof, writer = cProfile.Profile(), WriterStats(profile=cProfile.Profile())
        trio.run(_journal_rate, base / "profiled.db", 64, s, ids, writer, main_prof)
        assert writer.profile is not None
        main_prof.dump_stats(args.profile)
        writer.profile.dump_stats(args.profile + ".writer")
        for name, prof in (("trio thread", main_prof), ("journal writer thread", writer.profile)):
            print(f"\n--- 64 tasks, {name}, cProfile by tottime ---")
            pstats.Stats(prof).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
