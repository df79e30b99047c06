"""Journal backends under the daemon: calls/s with 1, 2 and 4 daemons on one PostgreSQL journal
vs 1 daemon on SQLite, side by side in one run.

    .venv/bin/python tests/benchmarks/journal_backends.py [--calls N] [--concurrency C]
                                                          [--rounds R]

One loopback HTTP server (``http_overhead.py --serve``, its own process), one PostgreSQL server
started for the run (``tests/postgres.py``, ``fsync = on``: barriers really flush), one disk.
Each setup is ``affidavit serve`` processes with their own sockets; this process is their client
(``affidavit.Client``, ``--concurrency`` tasks spread over the setup's daemons) and makes
``--calls`` GET calls per round to each setup in turn, ``--rounds`` rounds alternating the order
so load drift hits every setup alike.  Every call is journaled with its barriers
(DISPATCH_STARTED, RESULT_COMMITTED).

Printed per setup: calls/s, and for PostgreSQL the transactions the database committed per call
(``pg_stat_database.xact_commit``) -- group commit shows as fewer than the barriers a call has.
A script, not a test: it prints the figures and their ratios and asserts nothing about time.
On a 2-core machine the daemons, the client and the database share the cores: more daemons
add CPU-bound processes, which is the ceiling these figures show rather than the journal's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from affidavit.api.client import Client  # noqa: E402
from tests.postgres import Cluster  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import http_overhead  # noqa: E402  (its loopback server and benchmark target)
import service_overhead  # noqa: E402  (its timed loop and daemon start-up)

ACTION = service_overhead.ACTION


class Setup:
    def __init__(self, name: str, sockets: list[Path], database: str | None) -> None:
        self.name = name
        self.sockets = sockets
        self.database = database
        self.rate: list[float] = []
        self.commits = 0
        self.calls = 0


def _journal_table(home: Path, url: str | None, shared_key: Path) -> str:
    if url is None:
        return f'[journal]\npath = "{home / "bench.db"}"\n'
    return (
        f'[journal]\nurl = "{url}"\nkey_file = "{shared_key}"\n'
        f'signing_key = "{home / "signing.key"}"\n'
    )


def _start(home: Path, port: int, url: str | None, shared_key: Path) -> subprocess.Popen[bytes]:
    home.mkdir(parents=True)
    target = http_overhead._config(home, port).split("\n\n", 1)[1]  # the [targets.api] table
    config = home / "affidavit.toml"
    socket = home / "affidavit.sock"
    config.write_text(
        _journal_table(home, url, shared_key)
        + f'\n[service]\nsocket = "{socket}"\nmax_calls = 4096\n'
        + "call_rate = 100000\ncall_burst = 1000000\n\n"  # the journal's ceiling, not a uid's
        + target,
        encoding="utf-8",
    )
    proc = subprocess.Popen(
        [*service_overhead._affidavit(), "serve", "--config", str(config)],
        env=service_overhead._env(),
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while not socket.exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"the daemon in {home} did not start")
        time.sleep(0.05)
    return proc


def _xact_commits(cluster: Cluster, database: str) -> int:
    rows = cluster.sql(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", "postgres", (database,)
    )
    return int(rows[0][0])


async def _round(setup: Setup, calls: int, concurrency: int, cluster: Cluster) -> None:
    clients = [Client(s, max_idle=concurrency) for s in setup.sockets]
    try:
        turn = 0

        async def call() -> Any:
            nonlocal turn
            turn += 1
            return await clients[turn % len(clients)].call(ACTION)

        await service_overhead._timed(8 * len(clients), 8, call)  # warm: pools, caches
        before = _xact_commits(cluster, setup.database) if setup.database else 0
        took = await service_overhead._timed(calls, concurrency, call)
        if setup.database:
            time.sleep(0.6)  # statistics reach pg_stat_database within its 500 ms flush
            setup.commits += _xact_commits(cluster, setup.database) - before
        setup.calls += calls
        setup.rate.append(calls / took)
    finally:
        for c in clients:
            await c.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per setup per round")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    os.environ[http_overhead.TOKEN_ENV] = "bench-token"
    procs: list[subprocess.Popen[bytes]] = []
    with (
        http_overhead._server() as port,
        tempfile.TemporaryDirectory(prefix="affidavit-backends-") as tmp,
    ):
        cluster = Cluster.create(tmpfs=False)
        try:
            dir = Path(tmp)
            setups = [Setup("sqlite, 1 daemon", [], None)]
            procs.append(_start(dir / "sqlite", port, None, dir / "unused.key"))
            setups[0].sockets.append(dir / "sqlite" / "affidavit.sock")
            for n in (1, 2, 4):
                url = cluster.database()
                name = url.rsplit("/", 1)[1]
                setup = Setup(f"postgresql, {n} daemon{'s' if n > 1 else ''}", [], name)
                key = dir / f"pg{n}.key"
                for i in range(n):
                    home = dir / f"pg{n}" / f"d{i}"
                    procs.append(_start(home, port, url, key))
                    setup.sockets.append(home / "affidavit.sock")
                setups.append(setup)
            print(f"loopback server :{port}; PostgreSQL {cluster.port} (fsync on); {tmp}")
            print(f"{args.calls} calls per setup per round, concurrency {args.concurrency}, "
                  f"{args.rounds} rounds, {os.cpu_count()} CPUs")  # fmt: skip
            for r in range(args.rounds):
                order = setups if r % 2 == 0 else list(reversed(setups))
                for setup in order:
                    trio.run(_round, setup, args.calls, args.concurrency, cluster)
            print()
            base = sum(setups[0].rate) / len(setups[0].rate)
            print(f"{'setup':24} {'calls/s':>9} {'vs sqlite':>10} {'commits/call':>13}")
            for s in setups:
                rate = sum(s.rate) / len(s.rate)
                per = f"{s.commits / s.calls:.2f}" if s.database else "-"
                print(f"{s.name:24} {rate:>9.0f} {rate / base:>9.2f}x {per:>13}")
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
            cluster.destroy()


if __name__ == "__main__":
    main()
