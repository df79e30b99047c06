"""Benchmark (a script, not collected by pytest): pooled keep-alive vs a fresh connection per
request against the loopback hostile server, measured side by side in one run.

    .venv/bin/python -m tests.http.bench_pool [N]
"""

from __future__ import annotations

import sys
import time

import trio

from affidavit.adapters.http import HttpClient, HttpRequest

from .fakes import FakeEngine
from .hostile import HostileServer, Reply, scripts


async def run(n: int) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"x" * 512))) as srv:
        async with HttpClient() as pooled:
            t0 = time.perf_counter()
            for _ in range(n):
                await pooled.perform(HttpRequest("GET", srv.url + "/", []), FakeEngine().ctx)
            t_pooled = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(n):
            async with HttpClient() as fresh:
                await fresh.perform(HttpRequest("GET", srv.url + "/", []), FakeEngine().ctx)
        t_fresh = time.perf_counter() - t0
    print(f"requests per mode: {n}")
    print(f"pooled: {n / t_pooled:8.0f} req/s   ({t_pooled * 1e6 / n:6.0f} us/req)")
    print(f"fresh:  {n / t_fresh:8.0f} req/s   ({t_fresh * 1e6 / n:6.0f} us/req)")
    print(f"ratio pooled/fresh throughput: {t_fresh / t_pooled:.2f}x")


if __name__ == "__main__":
    trio.run(run, int(sys.argv[1]) if len(sys.argv) > 1 else 500)
