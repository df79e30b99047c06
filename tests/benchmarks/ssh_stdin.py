"""What writing stdin on a worker thread costs, side by side in one run against one sshd on
127.0.0.1: the driver's ``perform()`` of ``wc -c`` with stdin of each size, three ways, columns
interleaved round by round so drift hits them alike:

  thread   the driver as it is: each piece (at most the window, at most 64 KiB) written by
           ``Io.write`` on a worker thread, so a key re-exchange that never ends cannot hold
           the trio loop, with the session blocking for the call, so that such a re-exchange
           is waited for in libssh's poll instead of spun on (docs/ssh-driver.md)
  spin     the same worker, the session left non-blocking (the driver before the blocking
           write: libssh's closing flush never waits)
  inline   ``Io.write`` replaced for the run by a plain ``channel.write`` on the trio thread
           (the driver before the thread: the same window cap, no hop)

A script, not a test (it asserts nothing about time):

    .venv/bin/python tests/benchmarks/ssh_stdin.py [--calls N] [--rounds R]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import trio

from affidavit.adapters.base import AttemptContext
from affidavit.adapters.ssh import SSH_TABLE, libssh, perform, prepare_credential
from affidavit.statemachine import ProtocolMachine, Step

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from anywhere
from tests.ssh.sshd import Sshd, start_sshd

SIZES = (0, 64 * 1024, 1024 * 1024, 8 * 1024 * 1024)
THREAD_WRITE = libssh.Io.write


class _NonBlocking:
    """The session as ``_Write`` sees it in the ``spin`` column: its mode is never changed."""

    def __init__(self, session: Any) -> None:
        self.session = session

    def set_blocking(self, blocking: bool) -> None:
        return None


class _SpinWrite(libssh._Write):
    def __init__(self, session: Any, channel: Any, data: bytes, stall: float) -> None:
        super().__init__(_NonBlocking(session), channel, data, stall)


BLOCKING_WRITE = libssh._Write


async def _inline_write(self: libssh.Io, channel: Any, data: bytes, stall: float) -> int:
    return int(channel.write(data)[1])


async def _noop_gate(facts: Mapping[str, Any]) -> None:
    return None


def _noop_observe(step: Step, facts: Mapping[str, Any]) -> None:
    return None


async def _noop_sink(stream: str, data: bytes) -> None:
    return None


async def _one(server: Sshd, stdin: bytes | None) -> None:
    ctx = AttemptContext(ProtocolMachine(SSH_TABLE), _noop_gate, _noop_observe, _noop_sink)
    res = await perform(server.target(), prepare_credential(server.client_key), "wc -c", stdin, ctx)
    assert res.code is None, res


async def _measure(server: Sshd, stdin: bytes | None, way: str, n: int) -> float:
    """ms per call, ``n`` sequential calls with ``Io.write`` done ``way``."""
    libssh.Io.write = _inline_write if way == "inline" else THREAD_WRITE  # type: ignore[method-assign]
    libssh._Write = _SpinWrite if way == "spin" else BLOCKING_WRITE  # type: ignore[misc]
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            await _one(server, stdin)
        return (time.perf_counter() - t0) * 1000 / n
    finally:
        libssh.Io.write = THREAD_WRITE  # type: ignore[method-assign]
        libssh._Write = BLOCKING_WRITE  # type: ignore[misc]


def _paired(samples: dict[str, list[float]], other: str) -> float:
    """The median of each round's own thread/other ratio."""
    pairs = zip(samples["thread"], samples[other], strict=True)
    return statistics.median(t / o for t, o in pairs)


async def main(calls: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as d, start_sshd(Path(d)) as server:
        await _one(server, b"warm")
        print(f"{calls} sequential calls of `wc -c` per cell, median of {rounds} interleaved "
              "rounds, ms/call")  # fmt: skip
        print(
            f"{'stdin':>10}{'thread':>10}{'spin':>10}{'inline':>10}"
            f"{'thr/spin':>10}{'per-round':>11}{'thr/inl':>10}{'per-round':>11}"
        )
        for size in SIZES:
            stdin = bytes(size) if size else None
            samples: dict[str, list[float]] = {"thread": [], "spin": [], "inline": []}
            for _ in range(rounds):
                for way in samples:
                    samples[way].append(await _measure(server, stdin, way, calls))
            med = {k: statistics.median(v) for k, v in samples.items()}
            print(
                f"{size:>10}{med['thread']:>10.2f}{med['spin']:>10.2f}{med['inline']:>10.2f}"
                f"{med['thread'] / med['spin']:>10.2f}{_paired(samples, 'spin'):>11.2f}"
                f"{med['thread'] / med['inline']:>10.2f}{_paired(samples, 'inline'):>11.2f}"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    trio.run(main, args.calls, args.rounds)
