"""A stored result fetched through the daemon: this checkout against another, side by side.

    .venv/bin/python tests/benchmarks/result_fetch.py [--mib N] [--readers R] [--ab OLD_CHECKOUT]

One loopback server (``http_overhead.py --serve``, its own process) answers ``GET /v1/big/N``
with N MiB of text.  For this checkout, and ``--ab``'s when given, a daemon process (``affidavit
serve`` with that checkout first on ``PYTHONPATH``) on a journal of its own stores one N MiB
result (one call); then R clients fetch it at once (``GET /v1/invocations/{id}/result``, each
answer read whole and thrown away) while one more asks ``/v1/health`` every 20 ms.  Per daemon:
seconds until the last answer was read, MiB/s over all R, the daemon's CPU seconds during the
fetches, its peak RSS growth over its RSS before them (``VmHWM``, reset through
``/proc/PID/clear_refs``), and the longest ``/v1/health`` wait.  Then this checkout's figures
over ``--ab``'s.  A script, not a test: it prints, and asserts nothing about time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))
import http_overhead  # noqa: E402  (its loopback server and config)

from affidavit.api.client import Client  # noqa: E402
from affidavit.api.wire import ClientError, blocking_request  # noqa: E402


def _status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _drain(socket: str, path: str) -> int:
    stream = await trio.open_unix_socket(socket)
    n = 0
    async with stream:
        await stream.send_all(
            f"GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".encode()
        )
        while data := await stream.receive_some(1 << 20):
            n += len(data)
    return n


@contextlib.asynccontextmanager
async def daemon(
    checkout: Path, port: int, prefix: str, service: str = ""
) -> AsyncIterator[tuple[Path, subprocess.Popen[bytes]]]:
    """An ``affidavit serve`` of ``checkout`` (first on ``PYTHONPATH``) in a fresh temporary
    directory, its one target the loopback server on ``port``, ``service`` lines added to its
    ``[service]`` table; yields its socket and process once ``/v1/health`` answers."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    sock = tmp / "affidavit.sock"
    config = tmp / "affidavit.toml"
    service = f'socket = "{sock}"\n' + service
    config.write_text(http_overhead._config(tmp, port) + "\n[service]\n" + service, "utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AFFIDAVIT_")}
    env[http_overhead.TOKEN_ENV] = "bench-token"
    env["PYTHONPATH"] = str(checkout)
    with (tmp / "daemon.log").open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "affidavit", "serve", "--config", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
            cwd=str(checkout),
        )
    try:
        with trio.fail_after(60):
            while True:
                try:
                    await trio.to_thread.run_sync(blocking_request, str(sock), "GET", "/v1/health")
                    break
                except ClientError:
                    await trio.sleep(0.1)
        yield sock, proc
    finally:
        proc.terminate()
        proc.wait(30)


async def measure(checkout: Path, port: int, args: argparse.Namespace) -> dict[str, Any]:
    async with daemon(checkout, port, "affidavit-fetch-") as (socket, proc):
        size = args.mib * 1024 * 1024
        async with Client.open(str(socket)) as client:
            action = {"target": "api", "method": "GET", "path": f"/v1/big/{size}"}
            envelope = await client.call(action)
        assert "error" not in envelope, envelope
        path = f"/v1/invocations/{envelope['invocation_id']}/result"
        Path(f"/proc/{proc.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
        rss, cpu, start = _status(proc.pid, "VmRSS"), _cpu(proc.pid), time.perf_counter()
        waits: list[float] = []
        read: list[int] = []

        async def fetch() -> None:
            read.append(await _drain(str(socket), path))

        async with trio.open_nursery() as nursery:
            for _ in range(args.readers):
                nursery.start_soon(fetch)
            while len(read) < args.readers:
                t = time.perf_counter()
                await trio.to_thread.run_sync(blocking_request, str(socket), "GET", "/v1/health")
                waits.append(time.perf_counter() - t)
                await trio.sleep(0.02)
        seconds = time.perf_counter() - start
        return {
            "seconds": seconds,
            "mib_s": args.readers * args.mib / seconds,
            "cpu_s": _cpu(proc.pid) - cpu,
            "rss_mib": (_status(proc.pid, "VmHWM") - rss) / 2**20,
            "health_ms": 1000 * max(waits),
            "answer_mib": min(read) / 2**20,
        }


Measure = Callable[[Path, int, argparse.Namespace], Awaitable[dict[str, Any]]]


async def side_by_side(measure: Measure, args: argparse.Namespace, title: str, fmt: str) -> None:
    """``measure`` this checkout's daemon, and ``args.ab``'s when given, against one loopback
    server; print ``title``, a table of their figures (each as ``fmt``), this over ``--ab``, and
    the figures as JSON."""
    figures: dict[str, dict[str, Any]] = {}
    with http_overhead._server() as port:
        checkouts = {"this": ROOT} | ({"ab": Path(args.ab).resolve()} if args.ab else {})
        for name, checkout in checkouts.items():
            figures[name] = await measure(checkout, port, args)
    print(title)
    keys = list(figures["this"])
    print("| daemon | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for name, fig in figures.items():
        print(f"| {name} | " + " | ".join(format(fig[k], fmt) for k in keys) + " |")
    if "ab" in figures:
        ratios = {k: figures["this"][k] / max(figures["ab"][k], 1e-9) for k in keys}
        print("this / ab: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    print(json.dumps(figures))


async def main(args: argparse.Namespace) -> None:
    title = f"{args.readers} clients fetching one {args.mib} MiB result at once, /v1/health beside"
    await side_by_side(measure, args, title, ".2f")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--readers", type=int, default=4)
    parser.add_argument("--ab", help="another checkout to measure beside this one")
    trio.run(main, parser.parse_args())
