"""SSH overhead, side by side in one run against the same sshd on 127.0.0.1 (issue 5):

  broker   ``Broker.call({"target": "box", "command": "true"})`` with the journal on (temp
           config and journal, key from an ``env:`` reference): every call is journaled,
           DISPATCH_STARTED and RESULT_COMMITTED are fsync barriers, the result is stored
  driver   affidavit's adapter alone, ``perform()`` with a no-op gate/observer/sink (the broker
           minus engine and journal: where the difference goes)
  bare     the same exec done by a minimal non-blocking ssh-python client under trio
  openssh  OpenSSH's ``ssh`` binary (a process per call)

sequentially and 8 concurrent, columns interleaved round by round so drift hits them alike.
Target: the broker within 1.2x of the bare ssh-python client.  Also printed: the journal's
transactions and fsync barriers per broker call and the raw fsync cost of the journal's disk.
A script, not a test (it asserts nothing about time):

    .venv/bin/python tests/benchmarks/ssh_overhead.py [--calls N] [--rounds R] [--profile FILE]

``--profile FILE`` runs extra sequential broker calls under cProfile, writes the stats to FILE
and prints the top functions by own time.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import pstats
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import ssh.exceptions
import ssh.key
import ssh.options
import ssh.session
import trio

from affidavit.adapters.base import AttemptContext
from affidavit.adapters.ssh import SSH_TABLE, perform, prepare_credential
from affidavit.api.broker import Broker
from affidavit.config import load_config
from affidavit.journal import Batch, Journal
from affidavit.statemachine import ProtocolMachine, Step

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from anywhere
from tests.ssh.sshd import Sshd, start_sshd

KEY_ENV = "AFFIDAVIT_BENCH_SSH_KEY"
COLUMNS = ("broker", "driver", "bare", "openssh")


class JournalCounter:
    """Wraps each journal writer transaction (``Journal.around_transaction``, as
    ``http_overhead.py`` does); one holding a barrier commits with ``synchronous=FULL`` (an
    fsync)."""

    def __init__(self, journal: Journal) -> None:
        self.txns = 0
        self.barriers = 0
        self.seconds = 0.0

        @contextlib.contextmanager
        def counted(batch: Batch) -> Iterator[None]:
            t0 = time.perf_counter()
            try:
                yield
            finally:
                self.seconds += time.perf_counter() - t0
                self.txns += 1
                self.barriers += batch.barrier

        journal.around_transaction = counted


def broker_call(broker: Broker) -> Callable[[], Awaitable[None]]:
    action = {"target": "box", "command": "true"}

    async def call() -> None:
        env = await broker.call(action)
        if "error" in env or env["result"]["exit_status"] != 0:
            raise RuntimeError(f"broker call failed: {env.get('error')}")

    return call


def _config(d: Path, server: Sshd) -> Path:
    cfg = d / "affidavit.toml"
    cfg.write_text(
        f"""[journal]
path = "{d / "journal.db"}"

[targets.box]
kind = "ssh"
host = "127.0.0.1"
port = {server.port}
user = "{server.user}"
host_key = "{server.host_pin}"
credential = "env:{KEY_ENV}"
timeout = {{ connect = 10, total = 60 }}
""",
        encoding="utf-8",
    )
    return cfg


def fsync_ms(directory: Path, n: int = 30) -> float:
    """Median of ``write(64 B) + os.fsync`` on the journal's disk, in ms."""
    fd = os.open(directory / "fsync-probe", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    times = []
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            os.write(fd, b"x" * 64)
            os.fsync(fd)
            times.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
    return statistics.median(times) * 1000


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


async def main(calls: int, rounds: int, profile: str | None) -> None:
    with tempfile.TemporaryDirectory() as d, start_sshd(Path(d)) as server:
        os.environ[KEY_ENV] = server.client_key.decode()
        work = Path(d) / "broker"
        work.mkdir()
        async with Broker.open(config=load_config(_config(work, server))) as broker:
            counter = JournalCounter(broker.journal)
            funcs = {
                "broker": broker_call(broker),
                "driver": driver_call(server),
                "bare": bare_call(server),
                "openssh": openssh_call(server),
            }
            print(f"{calls} calls of `true` per cell, median of {rounds} interleaved rounds, "
                  "ms/call (wall time / calls)")  # fmt: skip
            print(
                f"{'mode':<14}" + "".join(f"{c:>9}" for c in COLUMNS)
                + f"{'brk/bare':>10}{'drv/bare':>10}{'brk/ossh':>10}"
            )  # fmt: skip
            paired: list[tuple[str, float]] = []
            for label, conc in (("sequential", 1), ("8 concurrent", 8)):
                samples: dict[str, list[float]] = {k: [] for k in funcs}
                for _ in range(rounds):  # interleaved so drift hits every column alike
                    for name, fn in funcs.items():
                        samples[name].append(await _measure(fn, calls, conc))
                med = {k: statistics.median(v) for k, v in samples.items()}
                # Each round's own broker/bare ratio (measured back to back): robust to drift
                # from other load on the machine between rounds.
                paired.append(
                    (label, statistics.median(
                        b / r for b, r in zip(samples["broker"], samples["bare"], strict=True)
                    ))
                )  # fmt: skip
                print(
                    f"{label:<14}" + "".join(f"{med[c]:>9.2f}" for c in COLUMNS)
                    + f"{med['broker'] / med['bare']:>10.2f}"
                    + f"{med['driver'] / med['bare']:>10.2f}"
                    + f"{med['broker'] / med['openssh']:>10.2f}"
                )  # fmt: skip

            print(
                "median of per-round broker/bare ratios: "
                + ", ".join(f"{label} {ratio:.2f}" for label, ratio in paired)
                + " (target <= 1.20)"
            )
            one = broker_call(broker)
            t0, b0, s0 = counter.txns, counter.barriers, counter.seconds
            n = 10
            for _ in range(n):
                await one()
            print(
                f"journal per broker call: {(counter.txns - t0) / n:.1f} transactions, "
                f"{(counter.barriers - b0) / n:.1f} fsync barriers, "
                f"{(counter.seconds - s0) * 1000 / n:.2f} ms in the writer thread; "
                f"raw fsync on this disk: {fsync_ms(work):.2f} ms"
            )
            if profile:
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(calls):
                    await one()
                prof.disable()
                prof.dump_stats(profile)
                out = io.StringIO()
                pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(15)
                print(out.getvalue())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", help="write cProfile stats of extra broker calls here")
    args = parser.parse_args()
    trio.run(main, args.calls, args.rounds, args.profile)
