"""The HTTP clients ``http_overhead.py`` compares the broker with, each measured the same way.

Each ``measure_*`` runs in its own process (``http_overhead.py --client NAME``), against the
loopback server in another: warm up, then ``seq`` sequential calls (latency of each), then
``calls`` calls shared by ``concurrency`` workers (calls/s and process CPU per call).  They send
the same request the broker's HTTP binding sends (GET, bearer token) and check the body.

* ``bare``: h11 over trio with a LIFO keep-alive pool -- the floor;
* ``httpx``: ``httpx.AsyncClient`` under trio (what an agent written with trio would use);
* ``urllib3``: ``urllib3.PoolManager`` with one thread per concurrent caller;
* ``aiohttp``: ``aiohttp.ClientSession`` under asyncio.

httpx and aiohttp are dev extras; urllib3 comes with them.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import h11
import trio

BODY = b'{"ok":true,"items":[1,2,3],"note":"loopback benchmark response"}'
PATH = "/v1/ok"
READ_SIZE = 65536
WARMUP = 20

Figures = dict[str, Any]


def figures(lat: list[float], seq_s: float, rate: float, cpu: float, calls: int) -> Figures:
    return {
        "p50": statistics.median(lat),
        "p90": statistics.quantiles(lat, n=10)[-1],
        "seq_rate": len(lat) / seq_s,
        "rate": rate,
        "cpu": cpu / calls,
    }


Call = Callable[[], Awaitable[None]]
Spawn = Callable[[Call, int], Awaitable[None]]
"""Runs ``n`` copies of a worker concurrently until all return: the one step that depends on
the event loop (a trio nursery, ``asyncio.gather``)."""


async def trio_spawn(worker: Call, n: int) -> None:
    async with trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(worker)


async def sequential(call: Call, seq: int) -> tuple[list[float], float]:
    """Latencies of ``seq`` sequential calls, and their total time (any event loop)."""
    lat = []
    t0 = time.perf_counter()
    for _ in range(seq):
        t1 = time.perf_counter()
        await call()
        lat.append(time.perf_counter() - t1)
    return lat, time.perf_counter() - t0


async def concurrent(
    call: Call, calls: int, concurrency: int, spawn: Spawn = trio_spawn
) -> tuple[float, float]:
    """(calls/s, process CPU seconds) of ``calls`` calls shared by ``concurrency`` tasks."""
    left = calls

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await call()

    c0 = time.process_time()
    t0 = time.perf_counter()
    await spawn(worker, concurrency)
    return calls / (time.perf_counter() - t0), time.process_time() - c0


async def measure(
    call: Call, seq: int, calls: int, concurrency: int, spawn: Spawn = trio_spawn
) -> Figures:
    """Sequential latencies, then throughput and CPU at ``concurrency`` tasks (under trio
    unless ``spawn`` is another loop's)."""
    for _ in range(WARMUP):
        await call()
    lat, seq_s = await sequential(call, seq)
    rate, cpu = await concurrent(call, calls, concurrency, spawn)
    return figures(lat, seq_s, rate, cpu, calls)


# -- bare h11 + trio ------------------------------------------------------------------------------


class BareClient:
    """h11 over trio with a keep-alive pool (LIFO, unbounded)."""

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


async def measure_bare(port: int, token: str, seq: int, calls: int, conc: int) -> Figures:
    bare = BareClient(port, token)

    async def call() -> None:
        if await bare.get(PATH) != 200:
            raise RuntimeError("bare client: status")

    try:
        return await measure(call, seq, calls, conc)
    finally:
        await bare.aclose()


# -- httpx under trio -----------------------------------------------------------------------------


async def measure_httpx(port: int, token: str, seq: int, calls: int, conc: int) -> Figures:
    import httpx

    url = f"http://127.0.0.1:{port}{PATH}"
    headers = {"Authorization": f"Bearer {token}", "User-Agent": "httpx-bench/1"}
    limits = httpx.Limits(max_connections=conc, max_keepalive_connections=conc)
    async with httpx.AsyncClient(limits=limits) as client:

        async def call() -> None:
            r = await client.get(url, headers=headers)
            if r.status_code != 200 or r.content != BODY:
                raise RuntimeError("httpx: wrong answer")

        return await measure(call, seq, calls, conc)


# -- urllib3, threads -----------------------------------------------------------------------------


def measure_urllib3(port: int, token: str, seq: int, calls: int, conc: int) -> Figures:
    import urllib3

    pool = urllib3.PoolManager(maxsize=conc, block=False)
    url = f"http://127.0.0.1:{port}{PATH}"
    headers = {"Authorization": f"Bearer {token}", "User-Agent": "urllib3-bench/1"}

    def call() -> None:
        r = pool.request("GET", url, headers=headers)
        if r.status != 200 or r.data != BODY:
            raise RuntimeError("urllib3: wrong answer")

    for _ in range(WARMUP):
        call()
    lat = []
    t0 = time.perf_counter()
    for _ in range(seq):
        t1 = time.perf_counter()
        call()
        lat.append(time.perf_counter() - t1)
    seq_s = time.perf_counter() - t0
    left = calls
    lock = threading.Lock()

    def worker() -> None:
        nonlocal left
        while True:
            with lock:
                if left <= 0:
                    return
                left -= 1
            call()

    with ThreadPoolExecutor(conc) as ex:
        ex.submit(lambda: None).result()  # threads are started lazily; start one first
        c0 = time.process_time()
        t0 = time.perf_counter()
        for f in [ex.submit(worker) for _ in range(conc)]:
            f.result()
        rate = calls / (time.perf_counter() - t0)
        cpu = time.process_time() - c0
    pool.clear()
    return figures(lat, seq_s, rate, cpu, calls)


# -- aiohttp under asyncio ------------------------------------------------------------------------


async def _aiohttp_main(port: int, token: str, seq: int, calls: int, conc: int) -> Figures:
    import asyncio

    import aiohttp

    url = f"http://127.0.0.1:{port}{PATH}"
    headers = {"Authorization": f"Bearer {token}", "User-Agent": "aiohttp-bench/1"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=conc)) as session:

        async def call() -> None:
            async with session.get(url, headers=headers) as r:
                if r.status != 200 or await r.read() != BODY:
                    raise RuntimeError("aiohttp: wrong answer")

        async def spawn(worker: Call, n: int) -> None:
            await asyncio.gather(*(worker() for _ in range(n)))

        return await measure(call, seq, calls, conc, spawn)


def measure_aiohttp(port: int, token: str, seq: int, calls: int, conc: int) -> Figures:
    import asyncio

    return asyncio.run(_aiohttp_main(port, token, seq, calls, conc))


def run_client(name: str, port: int, token: str, seq: int, calls: int, conc: int) -> Figures:
    """One of the clients above, measured in this process."""
    if name == "bare":
        return trio.run(measure_bare, port, token, seq, calls, conc)
    if name == "httpx":
        return trio.run(measure_httpx, port, token, seq, calls, conc)
    if name == "urllib3":
        return measure_urllib3(port, token, seq, calls, conc)
    if name == "aiohttp":
        return measure_aiohttp(port, token, seq, calls, conc)
    raise ValueError(f"unknown client {name!r}")
