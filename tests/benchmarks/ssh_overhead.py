"""SSH overhead, side by side in one run against the same sshd on 127.0.0.1:

  driver   affidavit's ``perform()`` of ``true`` (phase 1; phase 2 switches to ``Broker.call``)
  bare     the same exec done by a minimal non-blocking ssh-python client under trio
  openssh  OpenSSH's ``ssh`` binary (a process per call)

sequentially and 8 concurrent.  Target: driver within 1.2x of bare.  A script, not a test:

    .venv/bin/python tests/benchmarks/ssh_overhead.py [--calls N]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import ssh.exceptions
import ssh.key
import ssh.options
import ssh.session
import trio

from affidavit.adapters.base import AttemptContext
from affidavit.adapters.ssh import SSH_TABLE, perform, prepare_credential
from affidavit.statemachine import ProtocolMachine, Step

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from anywhere
from tests.ssh.sshd import Sshd, start_sshd


async def _noop_gate(facts: Mapping[str, Any]) -> None:
    return None


def _noop_observe(step: Step, facts: Mapping[str, Any]) -> None:
    return None


async def _noop_sink(stream: str, data: bytes) -> None:
    return None


def driver_call(server: Sshd) -> Callable[[], Awaitable[None]]:
    cred = prepare_credential(server.client_key)  # imported once, as the engine would cache it
    target = server.target()

    async def call() -> None:
        ctx = AttemptContext(ProtocolMachine(SSH_TABLE), _noop_gate, _noop_observe, _noop_sink)
        res = await perform(target, cred, "true", None, ctx)
        assert res.code is None

    return call


def bare_call(server: Sshd) -> Callable[[], Awaitable[None]]:
    """What a careful hand-written ssh-python client does, and nothing more."""
    key = ssh.key.import_privkey_base64(server.client_key)

    async def call() -> None:
        sock = trio.socket.socket()
        await sock.connect(("127.0.0.1", server.port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        fd = sock.detach()
        s = ssh.session.Session()
        s.options_set(ssh.options.HOST, "127.0.0.1")
        s.options_set(ssh.options.USER, server.user)
        s.set_socket(fd)
        s.set_blocking(False)

        async def wait() -> None:
            if s.get_poll_flags() & 0x08:
                await trio.lowlevel.wait_writable(fd)
            else:
                await trio.lowlevel.wait_readable(fd)

        async def nb(fn: Callable[..., Any], *a: Any, again: int = -2) -> Any:
            while True:
                rc = fn(*a)
                if (rc[0] if isinstance(rc, tuple) else rc) != again:
                    return rc
                await wait()

        await nb(s.connect)
        s.get_server_publickey().export_pubkey_base64()  # a real client checks the key too
        await nb(s.userauth_publickey, key, again=4)
        ch = s.channel_new()
        ch.set_blocking(False)
        await nb(ch.open_session)
        await nb(ch.request_exec, "true")
        ch.send_eof()
        eof = [False, False]
        while True:
            for i in (0, 1):
                if not eof[i]:
                    try:
                        ch.read_nonblocking(65536, bool(i))
                    except ssh.exceptions.EOF:
                        eof[i] = True
            status = ch.get_exit_state()[0]
            if all(eof) and ch.is_closed():
                assert status == 0
                break
            await wait()
        await nb(ch.close)
        with socket.socket(fileno=os.dup(fd)) as dup:
            dup.shutdown(socket.SHUT_RDWR)

    return call


def openssh_call(server: Sshd) -> Callable[[], Awaitable[None]]:
    argv = [
        "ssh", "-q", "-i", str(server.client_key_path), "-p", str(server.port),
        "-o", f"UserKnownHostsFile={server.known_hosts}", "-o", "StrictHostKeyChecking=yes",
        "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-F", "/dev/null",
        f"{server.user}@127.0.0.1", "true",
    ]  # fmt: skip

    async def call() -> None:
        await trio.run_process(argv)

    return call


async def _measure(call: Callable[[], Awaitable[None]], n: int, concurrency: int) -> float:
    """Wall time per call in ms (n calls, ``concurrency`` at a time)."""
    await call()  # warm up
    limiter = trio.CapacityLimiter(concurrency)

    async def one() -> None:
        async with limiter:
            await call()

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(one)
    return (time.perf_counter() - t0) * 1000 / n


async def main(calls: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as d, start_sshd(Path(d)) as server:
        makers = {"driver": driver_call, "bare": bare_call, "openssh": openssh_call}
        funcs = {name: make(server) for name, make in makers.items()}
        print(f"{calls} calls of `true` per cell, median of {rounds} interleaved rounds, ms/call")
        print(f"{'mode':<14}{'driver':>10}{'bare':>10}{'openssh':>10}{'drv/bare':>10}"
              f"{'drv/ossh':>10}")  # fmt: skip
        for label, conc in (("sequential", 1), ("8 concurrent", 8)):
            samples: dict[str, list[float]] = {k: [] for k in funcs}
            for _ in range(rounds):  # interleaved so drift hits every column alike
                for name, fn in funcs.items():
                    samples[name].append(await _measure(fn, calls, conc))
            med = {k: statistics.median(v) for k, v in samples.items()}
            print(
                f"{label:<14}{med['driver']:>10.2f}{med['bare']:>10.2f}{med['openssh']:>10.2f}"
                f"{med['driver'] / med['bare']:>10.2f}{med['driver'] / med['openssh']:>10.2f}"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    trio.run(main, args.calls, args.rounds)
