"""What clients streaming a chunked body of 1-byte chunks cost everyone else: an honest client's
``GET`` latency on the daemon's HTTP driver (h11server.py, in a process of its own on a Unix
socket, a stand-in route behind it: the routes take no part in the stall) before and while
``--floods`` connections each send ``1\\r\\n \\r\\n`` as fast as the server reads (reconnecting
when refused or timed out).  Before (audit 50), each chunk was one h11 event and one
``fail_at`` scope, ~11 000 of them per 64 KiB inbox decoded without the event loop turning.

    python tests/benchmarks/tiny_chunks.py [--floods 4] [--probes 30] [--ab OLD_CHECKOUT]

``--ab DIR``: the same against a server importing a checkout from before (``git archive main |
tar -x -C DIR``), and both printed side by side from one run.  A script, not a test.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))
if "--src" in sys.argv:  # the server of another checkout, before importing it
    import http_overhead

    http_overhead._use_source(Path(sys.argv[sys.argv.index("--src") + 1]))
sys.path.insert(0, str(ROOT))

import trio  # noqa: E402

HEAD = b"POST /x HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
BLOCK = b"1\r\n \r\n" * 20000
PROBE = b"GET /v1/health HTTP/1.1\r\nhost: x\r\n\r\n"


async def _server(path: str) -> None:
    from affidavit.daemon.admission import Server
    from affidavit.daemon.http import ApiProblem, Request
    from affidavit.daemon.link import Link
    from affidavit.daemon.peer import Peer

    logging.disable(logging.CRITICAL)
    server = Server(keep_alive=300.0)  # server.py KEEP_ALIVE
    peer = Peer(pid=os.getpid(), uid=os.getuid(), gid=os.getgid())

    async def routes(req: Request) -> None:
        if req.method != "POST":
            return await req.respond(200, b'{"ok":true}\n')
        try:
            await req.respond(200, b"%d\n" % len(await req.body()))
        except ApiProblem as problem:
            await req.respond_problem(problem, close=True)

    async def serve(stream: trio.SocketStream) -> None:
        await server.serve(Link(stream), peer, routes)

    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.bind(path)
    sock.listen(128)
    await trio.serve_listeners(serve, [trio.SocketListener(sock)])


async def _flood(path: str, stop: trio.Event) -> None:
    while not stop.is_set():
        stream = await trio.open_unix_socket(path)
        try:
            await stream.send_all(HEAD)
            while not stop.is_set():
                await stream.send_all(BLOCK)
        except trio.BrokenResourceError:
            pass  # refused (400) or timed out (408): again
        finally:
            await stream.aclose()


async def _probes(path: str, n: int) -> list[float]:
    took = []
    stream = await trio.open_unix_socket(path)
    async with stream:
        for _ in range(n):
            start = time.perf_counter()
            await stream.send_all(PROBE)
            got = b""
            while not got.endswith(b'{"ok":true}\n'):
                got += await stream.receive_some(65536)
            took.append(time.perf_counter() - start)
            await trio.sleep(0.02)
    return took


async def _measure(path: str, floods: int, probes: int) -> dict[str, list[float]]:
    quiet = await _probes(path, probes)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        for _ in range(floods):
            nursery.start_soon(_flood, path, stop)
        await trio.sleep(1.0)
        flooded = await _probes(path, probes)
        stop.set()
    return {"quiet": quiet, "flooded": flooded}


def _run(src: str | None, floods: int, probes: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "s.sock")
        cmd = [sys.executable, __file__, "--serve", path] + (["--src", src] if src else [])
        child = subprocess.Popen(cmd)
        try:
            deadline = time.monotonic() + 20
            while not os.path.exists(path):
                assert time.monotonic() < deadline and child.poll() is None, "no server"
                time.sleep(0.05)
            return trio.run(_measure, path, floods, probes)
        finally:
            child.terminate()
            child.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--floods", type=int, default=4)
    parser.add_argument("--probes", type=int, default=30)
    parser.add_argument("--ab", metavar="OLD_CHECKOUT", help="also measure checkout OLD (A/B)")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--src", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        trio.run(_server, args.serve)
        return
    runs = {"this tree": _run(None, args.floods, args.probes)}
    if args.ab:
        runs["@" + Path(args.ab).name] = _run(args.ab, args.floods, args.probes)
    print(f"GET latency, {args.probes} probes, quiet and under {args.floods} 1-byte-chunk floods")
    print(f"{'checkout':>16} {'quiet med ms':>13} {'flood med ms':>13} {'flood max ms':>13}")
    for name, got in runs.items():
        print(f"{name:>16} {statistics.median(got['quiet']) * 1e3:>13.2f} "
              f"{statistics.median(got['flooded']) * 1e3:>13.2f} "
              f"{max(got['flooded']) * 1e3:>13.2f}")  # fmt: skip
    if args.ab:
        new, old = runs["this tree"], runs["@" + Path(args.ab).name]
        print(f"under the floods, old/new: median "
              f"{statistics.median(old['flooded']) / statistics.median(new['flooded']):.1f}x, "
              f"max {max(old['flooded']) / max(new['flooded']):.1f}x")  # fmt: skip


if __name__ == "__main__":
    main()
