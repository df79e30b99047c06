"""HTTP overhead: broker ``call()`` vs a bare h11+trio client, side by side in one run.

    .venv/bin/python tests/benchmarks/http_overhead.py [--dir DIR] [--seq N] [--calls N]
                                                       [--concurrency C] [--profile FILE]

Both clients talk to the same loopback h11+trio keep-alive server.  The server runs in a
*subprocess* (this file with ``--serve``) so its CPU does not share the event loop -- nor the
GIL -- with the client being measured; each client keeps its own keep-alive connection pool.
The broker runs with its journal on (``Broker.open``, temp config and journal, credential from
the environment): every call is journaled, DISPATCH_STARTED and RESULT_COMMITTED are barriers.

Measured in the same run, same server, same disk:

* sequential per-call latency (median, p90) for bare vs broker (``--seq`` calls each,
  interleaved in blocks of 50 so load drift hits both alike);
* throughput at ``--concurrency`` concurrent tasks (calls/s) for bare vs broker (``--calls``);
* the raw fsync cost on the journal's disk (``os.fsync`` after a 64-byte write, median of
  samples taken between the sequential blocks);
* the journal rows, transactions and fsync barriers of one broker call (by wrapping the
  journal writer's batch commit), and the fsyncs per call at concurrency (group commit).

Targets (issue: HTTP overhead): at concurrency 64 the broker keeps >= 50% of the bare client's
throughput; at concurrency 1 it adds no more than two fsyncs plus 0.3 ms per call.  This is a
script, not a test: it prints the ratios and asserts nothing about time.

``--profile FILE`` additionally runs the broker phases under cProfile and writes the stats of
the main thread to FILE and of the journal writer thread's transactions to FILE.writer
(``python -m pstats FILE``), printing the top functions by cumulative and own time.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import h11
import trio

if TYPE_CHECKING:  # imported lazily at run time: the --serve subprocess needs none of it
    from affidavit.journal import Batch, Journal

BODY = b'{"ok":true,"items":[1,2,3],"note":"loopback benchmark response"}'
PATH = "/v1/ok"
TOKEN_ENV = "AFFIDAVIT_BENCH_TOKEN"
READ_SIZE = 65536
BLOCK = 50
WAL_COMMIT_BYTES = 4 * (4096 + 24)
"""What one barrier commit appends to the WAL here (strace: four page frames, then fdatasync)."""


# -- the server (subprocess) --------------------------------------------------------------------


async def _serve_conn(stream: trio.SocketStream) -> None:
    conn = h11.Connection(h11.SERVER)
    response = [("content-type", "application/json"), ("content-length", str(len(BODY)))]
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(READ_SIZE))  # b"": EOF
                continue
            if isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                return
            if isinstance(event, h11.EndOfMessage):
                out = conn.send(h11.Response(status_code=200, headers=response)) or b""
                out += conn.send(h11.Data(data=BODY)) or b""
                out += conn.send(h11.EndOfMessage()) or b""
                await stream.send_all(out)
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
    except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
        return
    finally:
        await trio.aclose_forcefully(stream)


async def _serve_main() -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    print(port, flush=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, _serve_conn, listeners)
        # Exit when the parent closes our stdin (or dies): never outlive the benchmark.
        await trio.to_thread.run_sync(sys.stdin.read)
        nursery.cancel_scope.cancel()


@contextlib.contextmanager
def _server() -> Iterator[int]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        yield int(proc.stdout.readline())
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- the bare client ----------------------------------------------------------------------------


class BareClient:
    """h11 over trio with a keep-alive pool (LIFO, unbounded): the floor the broker is compared
    against.  Sends the same headers the broker's HTTP binding sends."""

    def __init__(self, port: int, token: str) -> None:
        self._port = port
        self._idle: list[tuple[trio.SocketStream, h11.Connection]] = []
        self._headers = [
            ("Host", f"127.0.0.1:{port}"),
            ("User-Agent", "bare/1"),
            ("Authorization", f"Bearer {token}"),
        ]

    async def get(self, path: str) -> int:
        if self._idle:
            stream, conn = self._idle.pop()
        else:
            stream = await trio.open_tcp_stream("127.0.0.1", self._port)
            conn = h11.Connection(h11.CLIENT)
        data = conn.send(h11.Request(method="GET", target=path, headers=self._headers)) or b""
        data += conn.send(h11.EndOfMessage()) or b""
        await stream.send_all(data)
        status = 0
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(READ_SIZE))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
            else:
                raise RuntimeError(f"bare client: unexpected {event!r}")
        if bytes(body) != BODY:
            raise RuntimeError("bare client: wrong body")
        conn.start_next_cycle()
        self._idle.append((stream, conn))
        return status

    async def aclose(self) -> None:
        for stream, _ in self._idle:
            await stream.aclose()
        self._idle.clear()


# -- counting journal transactions ----------------------------------------------------------


@dataclass
class TxnCounter:
    """Wraps each journal writer transaction (``Journal.around_transaction``); one holding a
    barrier commits with ``synchronous=FULL``, i.e. one WAL fsync (a ``NORMAL`` commit does not
    fsync)."""

    txns: int = 0
    barrier_txns: int = 0
    requests: int = 0
    seconds: float = 0.0
    """Time spent inside the writer thread's transactions (SQLite work, fsync included)."""
    barrier_s: list[float] = field(default_factory=list)
    plain_s: list[float] = field(default_factory=list)
    cpu: float = 0.0
    """CPU time of the writer thread inside transactions (``time.thread_time``)."""
    profile: cProfile.Profile | None = None
    """With --profile: the writer thread's transactions (cProfile sees one thread at a time)."""

    def install(self, journal: Journal) -> None:
        @contextlib.contextmanager
        def counted(batch: Batch) -> Iterator[None]:
            self.txns += 1
            self.requests += batch.writes
            barrier = batch.barrier
            self.barrier_txns += barrier
            t0 = time.perf_counter()
            c0 = time.thread_time()
            if self.profile is not None:
                self.profile.enable()
            try:
                yield
            finally:
                if self.profile is not None:
                    self.profile.disable()
                took = time.perf_counter() - t0
                self.cpu += time.thread_time() - c0
                self.seconds += took
                (self.barrier_s if barrier else self.plain_s).append(took)

        journal.around_transaction = counted

    def snapshot(self) -> tuple[int, int, int, float]:
        return self.txns, self.barrier_txns, self.requests, self.seconds


def _delta(
    after: tuple[int, int, int, float], before: tuple[int, int, int, float]
) -> tuple[int, int, int, float]:
    return (
        after[0] - before[0],
        after[1] - before[1],
        after[2] - before[2],
        after[3] - before[3],
    )


# -- measurement helpers ------------------------------------------------------------------------


def fsync_probe(directory: Path, n: int, times: list[float], size: int = 64) -> None:
    """Append ``n`` samples of ``write(size bytes) + os.fsync`` on a file in ``directory``.  The
    probe runs between the measured blocks, so a shared disk's varying load is sampled over the
    same period as the calls."""
    fd = os.open(directory / f"fsync-probe-{size}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            os.write(fd, b"x" * size)
            os.fsync(fd)
            times.append(time.perf_counter() - t0)
    finally:
        os.close(fd)


async def sequential(call: Callable[[], Awaitable[None]], n: int) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        await call()
        times.append(time.perf_counter() - t0)
    return times


async def concurrent(call: Callable[[], Awaitable[None]], n: int, tasks: int) -> float:
    """Calls per second with ``tasks`` tasks sharing ``n`` calls."""
    left = n

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await call()

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(tasks):
            nursery.start_soon(worker)
    return n / (time.perf_counter() - t0)


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f}"


def _config(tmp: Path, port: int) -> str:
    return f"""[journal]
path = "{tmp / "bench.db"}"

[targets.api]
kind = "http"
url = "http://127.0.0.1:{port}"
methods = ["GET"]
idempotent = ["GET"]
credential = "env:{TOKEN_ENV}"
inject = "bearer"
timeout = {{ connect = 5, total = 30 }}
"""


@contextlib.contextmanager
def _profiled(prof: cProfile.Profile | None) -> Iterator[None]:
    if prof is None:
        yield
        return
    prof.enable()
    try:
        yield
    finally:
        prof.disable()


# -- the run --------------------------------------------------------------------------------


async def run(args: argparse.Namespace, port: int, tmp: Path) -> None:
    from affidavit.api.broker import Broker
    from affidavit.config import load_config

    token = os.environ[TOKEN_ENV]
    cfg = tmp / "affidavit.toml"
    cfg.write_text(_config(tmp, port), encoding="utf-8")
    prof = cProfile.Profile() if args.profile else None
    bare = BareClient(port, token)
    action = {"target": "api", "method": "GET", "path": PATH}
    counter = TxnCounter(profile=cProfile.Profile() if args.profile else None)
    fsync_times: list[float] = []
    wal_like: list[float] = []

    async def bare_call() -> None:
        if await bare.get(PATH) != 200:
            raise RuntimeError("bare client: status")

    async with Broker.open(config=load_config(cfg)) as broker:
        counter.install(broker.journal)

        async def broker_call() -> None:
            env = await broker.call(action)
            if "error" in env or env["result"]["status"] != 200:
                raise RuntimeError(f"broker call failed: {env.get('error')}")

        # Warm both (connections opened, imports and caches hot) before measuring.
        for _ in range(20):
            await bare_call()
            await broker_call()

        # One call, dissected: rows written, transactions and fsync barriers.
        before = counter.snapshot()
        env = await broker.call(action)
        one_txns, one_barriers, one_reqs, one_s = _delta(counter.snapshot(), before)
        events = broker.events(env["invocation_id"])
        committed = next(e for e in events if e.kind.value == "RESULT_COMMITTED")
        chunks = sum(dict(committed.attrs.get("chunks", {})).values())

        # Sequential latency, interleaved in blocks with the fsync probe.
        bare_lat: list[float] = []
        brk_lat: list[float] = []
        seq_before = counter.snapshot()
        for i in range(0, args.seq, BLOCK):
            k = min(BLOCK, args.seq - i)
            fsync_probe(tmp, 20, fsync_times)
            fsync_probe(tmp, 5, wal_like, WAL_COMMIT_BYTES)
            bare_lat += await sequential(bare_call, k)
            with _profiled(prof):
                brk_lat += await sequential(broker_call, k)
        seq_txn, seq_bar, _, seq_s = _delta(counter.snapshot(), seq_before)
        fsync_probe(tmp, 20, fsync_times)

        # Throughput at concurrency.
        bare_rate = await concurrent(bare_call, args.calls, args.concurrency)
        conc_before = counter.snapshot()
        cpu0, wcpu0 = time.process_time(), counter.cpu
        with _profiled(prof):
            brk_rate = await concurrent(broker_call, args.calls, args.concurrency)
        c_txn, c_bar, c_req, c_s = _delta(counter.snapshot(), conc_before)
        writer_cpu = counter.cpu - wcpu0
        main_cpu = time.process_time() - cpu0 - writer_cpu
    await bare.aclose()

    fsync_s = statistics.median(fsync_times)
    print(f"server: h11+trio keep-alive on 127.0.0.1:{port}, in a subprocess")
    print(f"journal: {tmp / 'bench.db'} (WAL; synchronous=FULL at barriers)")
    print(
        f"fsync (write 64 B + os.fsync, same disk, median of {len(fsync_times)} samples taken "
        f"between the sequential blocks): {ms(fsync_s)} ms"
    )
    print(
        f"  for comparison, append {WAL_COMMIT_BYTES} B (a barrier's four WAL frames) + fsync: "
        f"{ms(statistics.median(wal_like))} ms"
    )
    print()
    print("one broker call:")
    print(f"  journal events: {len(events)} ({', '.join(e.kind.value for e in events)})")
    print(f"  result rows: {chunks} chunk(s) + 1 completeness marker")
    print(f"  journal writes queued: {one_reqs}, in {one_txns} transactions")
    print(f"  fsync barriers (synchronous=FULL commits): {one_barriers}")
    print(f"  time inside its journal transactions: {ms(one_s)} ms")
    print(
        "  median transaction over the run: with fsync "
        f"{ms(statistics.median(counter.barrier_s))} ms, without "
        f"{ms(statistics.median(counter.plain_s or [0.0]))} ms"
    )
    print()
    bm, bp = statistics.median(bare_lat), p90(bare_lat)
    km, kp = statistics.median(brk_lat), p90(brk_lat)
    print(f"concurrency 1, {args.seq} sequential calls each     median ms     p90 ms")
    print(f"  bare h11+trio                            {ms(bm):>9}  {ms(bp):>9}")
    print(f"  broker call()                            {ms(km):>9}  {ms(kp):>9}")
    print(f"  latency ratio broker/bare                {km / bm:>8.2f}x  {kp / bp:>8.2f}x")
    per_call_bar = seq_bar / args.seq
    print(
        f"  journal per call: {seq_txn / args.seq:.2f} transactions, {per_call_bar:.2f} with "
        f"fsync, {ms(seq_s / args.seq)} ms inside them"
    )
    overhead = km - bm
    n_fsync = round(per_call_bar)
    rest = overhead - n_fsync * fsync_s
    verdict = "MET" if n_fsync <= 2 and rest <= 0.0003 else "MISSED"
    print(
        f"  broker overhead per call = {ms(overhead)} ms = {n_fsync} fsyncs + {ms(rest)} ms"
        f"   (target: <= 2 fsyncs + 0.300 ms: {verdict})"
    )
    print()
    ratio = brk_rate / bare_rate
    print(f"concurrency {args.concurrency}, {args.calls} calls each                calls/s")
    print(f"  bare h11+trio                            {bare_rate:>9.0f}")
    print(f"  broker call()                            {brk_rate:>9.0f}")
    print(
        f"  throughput ratio broker/bare             {ratio:>9.1%}"
        f"   (target: >= 50%: {'MET' if ratio >= 0.5 else 'MISSED'})"
    )
    print(
        f"  journal: {c_txn} transactions ({c_bar} with fsync) for {args.calls} calls = "
        f"{c_bar / args.calls:.3f} fsyncs/call, {c_req / max(c_txn, 1):.1f} writes per "
        f"transaction, {c_s:.2f} s inside them"
    )
    print(
        f"  broker CPU per call: {ms(main_cpu / args.calls)} ms event-loop thread + "
        f"{ms(writer_cpu / args.calls)} ms journal writer thread (one GIL); the bare client's "
        f"whole budget per call at its rate is {ms(1 / bare_rate)} ms"
    )
    if prof is not None and counter.profile is not None:
        prof.dump_stats(args.profile)
        counter.profile.dump_stats(args.profile + ".writer")
        for name, stats in (("main thread", prof), ("journal writer thread", counter.profile)):
            for key in ("cumulative", "tottime"):
                buf = io.StringIO()
                pstats.Stats(stats, stream=buf).sort_stats(key).print_stats(25)
                print(f"\n--- broker phases, {name}, cProfile by {key} ---")
                print(buf.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dir", type=Path, help="where the journal goes (default: a temp dir)")
    parser.add_argument("--seq", type=int, default=300, help="sequential calls per client")
    parser.add_argument("--calls", type=int, default=2000, help="calls per client at concurrency")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--profile", help="write cProfile stats of the broker phases here")
    args = parser.parse_args()
    if args.serve:
        trio.run(_serve_main)
        return
    if args.seq < 2 or args.calls < 1 or args.concurrency < 1:
        parser.error("--seq must be >= 2, --calls and --concurrency >= 1")
    os.environ.setdefault(TOKEN_ENV, "bench-" + os.urandom(12).hex())
    t0 = time.perf_counter()
    with (
        tempfile.TemporaryDirectory(prefix="affidavit-bench-", dir=args.dir) as d,
        _server() as port,
    ):
        trio.run(run, args, port, Path(d))
    print(f"\n(total wall time {time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
