"""What clients that never read their answers cost the daemon's memory: this checkout against
another, side by side.

    .venv/bin/python tests/benchmarks/slow_readers.py [--readers 100] [--kb 900] [--ab OLD]

One loopback server (``http_overhead.py --serve``, its own process) answers ``GET /v1/big/N``
with N bytes of text.  For this checkout, and ``--ab``'s when given, a daemon process
(``affidavit serve`` with that checkout first on ``PYTHONPATH``) serves one warm-up call read
whole; then ``--readers`` connections (receive buffer 4 KiB) each send ``POST /v1/calls`` for a
``--kb`` KB result and never read the answer, which waits up to ``WRITE_WAIT`` (30 s) to be
written.  Per daemon: its RSS before (after the warm-up), 5 s into the stall, its peak
(``VmHWM``), and 3 s after the clients closed -- MiB.  Audit 50: 100 such readers of 0.9 MB
took a daemon from 58 to 392 MB, the answer budget counting 0.9 MB of each.  A script, not a
test: it prints, and asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))
import result_fetch  # noqa: E402  (its daemon and /proc readers)

from affidavit.api.client import Client  # noqa: E402

MIB = 2**20


def _stall(path: str, readers: int, size: int) -> list[socket.socket]:
    """``readers`` connections, each asking for a ``size``-byte result and reading nothing."""
    action = json.dumps({"target": "api", "method": "GET", "path": f"/v1/big/{size}"}).encode()
    request = b"POST /v1/calls HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s" % (
        len(action),
        action,
    )
    held = []
    for _ in range(readers):
        s = socket.socket(socket.AF_UNIX)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(path)
        s.sendall(request)
        held.append(s)
    return held


async def measure(checkout: Path, port: int, args: argparse.Namespace) -> dict[str, Any]:
    service = "call_rate = 100000\ncall_burst = 100000\n"
    async with result_fetch.daemon(checkout, port, "affidavit-slow-", service) as (sock, proc):
        size = args.kb * 1000
        async with Client.open(str(sock)) as client:
            envelope = await client.call(
                {"target": "api", "method": "GET", "path": f"/v1/big/{size}"}
            )
        assert "error" not in envelope, envelope
        Path(f"/proc/{proc.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
        before = result_fetch._status(proc.pid, "VmRSS")
        held = _stall(str(sock), args.readers, size)
        await trio.sleep(5)
        stalled = result_fetch._status(proc.pid, "VmRSS")
        peak = result_fetch._status(proc.pid, "VmHWM")
        for s in held:
            s.close()
        await trio.sleep(3)
        after = result_fetch._status(proc.pid, "VmRSS")
        return {
            "before": before / MIB,
            "stalled": stalled / MIB,
            "peak": peak / MIB,
            "after": after / MIB,
            "growth": (peak - before) / MIB,
        }


async def main(args: argparse.Namespace) -> None:
    title = f"{args.readers} clients not reading a {args.kb} KB answer each: daemon RSS, MiB"
    await result_fetch.side_by_side(measure, args, title, ".1f")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--readers", type=int, default=100)
    parser.add_argument("--kb", type=int, default=900)
    parser.add_argument("--ab", help="another checkout to measure beside this one")
    trio.run(main, parser.parse_args())
