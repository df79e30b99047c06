"""Service overhead: the broker embedded vs the daemon (``affidavit serve``), side by side.

    .venv/bin/python tests/benchmarks/service_overhead.py [--seq N] [--calls N]
                                                         [--concurrency C] [--starts N]
                                                         [--installed-client]

One run, one loopback HTTP server (``http_overhead.py --serve``, its own process), one disk:

* throughput at concurrency 1 (``--seq`` sequential calls) and at ``--concurrency`` (``--calls``
  calls): ``Broker.call`` in this process vs ``affidavit.Client.call`` to a daemon process, in
  alternating blocks so load drift hits both alike -- with the CPU each call cost: this process
  (embedded), or the daemon plus this process as its client;
* the daemon's HTTP layer alone: ``GET /v1/health`` at ``--concurrency``, the daemon's CPU per
  request (what every call through the socket pays before any broker work);
* process start to envelope: ``affidavit call`` as a new process, through the daemon (``--socket``)
  vs embedded (``--config``), alternating, ``--starts`` each; with the start-up of ``affidavit
  --help`` and of a bare ``python -c pass``, the floor no command can beat. These processes may
  cache bytecode (``PYTHONDONTWRITEBYTECODE`` is dropped from their environment and one warm-up
  run each fills the caches), as an installed package has its ``.pyc`` files: a checkout that
  recompiles every module at each start measures the compiler, not the command. With
  ``--installed-client`` the thin client (and the floor) run from a regular install in a fresh
  venv: an editable install's finder and whatever .pth files this interpreter's site-packages
  holds run at every start of this interpreter, and no deployment has them.

The embedded broker and the daemon each have their own journal (the daemon is its journal's
only writer); both journal every call with the same barriers.  Targets (issue 10): the daemon
keeps >= 0.8x the embedded throughput; ``affidavit call`` through it takes <= 100 ms from process
start to envelope (issue 15: and ``affidavit --help`` <= 150 ms).  A script, not a test: it
prints the figures and their ratios and asserts nothing about time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from affidavit.api.broker import Broker  # noqa: E402
from affidavit.api.client import Client  # noqa: E402
from affidavit.config import load_config  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import http_overhead  # noqa: E402  (its loopback server and benchmark config)

SERVER = Path(__file__).with_name("http_overhead.py")
TOKEN_ENV = http_overhead.TOKEN_ENV
ACTION = {"target": "api", "method": "GET", "path": "/v1/ok"}
BLOCKS = 4


def _config(dir: Path, port: int, name: str) -> Path:
    """http_overhead.py's benchmark config (same target, same journal settings) in its own
    directory, with the daemon's socket beside it."""
    home = dir / name
    home.mkdir()
    path = home / "affidavit.toml"
    # The daemon's own ceiling is measured: no uid's call_rate stands in its way.
    service = (
        f'\n[service]\nsocket = "{home / "affidavit.sock"}"\n'
        "call_rate = 100000\ncall_burst = 1000000\n"
    )
    path.write_text(http_overhead._config(home, port) + service, encoding="utf-8")
    return path


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AFFIDAVIT_")}
    env[TOKEN_ENV] = "bench-token"
    return env


def _affidavit() -> list[str]:
    script = Path(sys.executable).with_name("affidavit")
    return [str(script)] if script.exists() else [sys.executable, "-m", "affidavit"]


async def _timed(calls: int, concurrency: int, call: Callable[[], Awaitable[Any]]) -> float:
    """Seconds for ``calls`` calls made by ``concurrency`` tasks."""
    left = calls

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            envelope = await call()
            if "error" in envelope:
                raise RuntimeError(f"benchmark call failed: {envelope['error']}")

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    return time.perf_counter() - start


def _cpu_of(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def throughput(
    args: argparse.Namespace, embedded_cfg: Path, socket: Path, daemon_pid: int
) -> None:
    async with (
        Broker.open(config=load_config(embedded_cfg)) as broker,
        Client.open(socket, max_idle=args.concurrency) as client,
    ):
        await _timed(20, 4, lambda: broker.call(ACTION))  # warm both: pools, caches
        await _timed(20, 4, lambda: client.call(ACTION))
        print(f"{'':22} {'embedded':>12} {'daemon':>12} {'daemon/embedded':>16}")
        for conc, calls in ((1, args.seq), (args.concurrency, args.calls)):
            per_block = max(1, calls // BLOCKS)
            spent = {"embedded": 0.0, "daemon": 0.0}
            cpu = {"embedded": 0.0, "client": 0.0, "daemon": 0.0}
            for _ in range(BLOCKS):
                mine = time.process_time()
                spent["embedded"] += await _timed(per_block, conc, lambda: broker.call(ACTION))
                cpu["embedded"] += time.process_time() - mine
                mine, theirs = time.process_time(), _cpu_of(daemon_pid)
                spent["daemon"] += await _timed(per_block, conc, lambda: client.call(ACTION))
                cpu["client"] += time.process_time() - mine
                cpu["daemon"] += _cpu_of(daemon_pid) - theirs
            done = per_block * BLOCKS
            rate = {k: done / v for k, v in spent.items()}
            print(
                f"{f'concurrency {conc}':22} {rate['embedded']:>8.0f} c/s {rate['daemon']:>8.0f}"
                f" c/s {rate['daemon'] / rate['embedded']:>15.2f}x"
            )
            ms = {k: v * 1000 / done for k, v in cpu.items()}
            print(
                f"{'  CPU ms per call':22} {ms['embedded']:>11.2f} {ms['daemon']:>5.2f}+"
                f"{ms['client']:.2f} client"
            )
        # The daemon's HTTP layer alone: GET /v1/health (no journal, no remote) at the same
        # concurrency, in the same run: what each call through the socket pays before any
        # broker work.
        done, theirs = args.calls, _cpu_of(daemon_pid)
        took = await _timed(done, args.concurrency, client.health)
        floor = (_cpu_of(daemon_pid) - theirs) * 1000 / done
        print(
            f"{'  GET /v1/health':22} {'':>12} {done / took:>8.0f} r/s  "
            f"daemon CPU {floor:.2f} ms per request (its HTTP layer, no broker work)"
        )


def _start_to_envelope(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(
        argv, input=json.dumps(ACTION).encode(), capture_output=True, env=env, check=False
    )
    took = time.perf_counter() - start
    if done.returncode != 0 or not done.stdout.startswith(b"{"):
        raise RuntimeError(f"{argv}: exit {done.returncode}: {done.stderr.decode()[-300:]}")
    return took


def _installed_client(dir: Path) -> Path:
    """``affidavit`` from a regular (not editable) install of this checkout in a fresh venv,
    as a deployment has it: no editable-install finder, nor any .pth this interpreter's own
    site-packages holds.  ``--no-deps``: the thin client is the standard library only (the
    daemon, which needs the rest, runs from this interpreter)."""
    venv = dir / "client-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "--no-deps", str(ROOT)], check=True)
    return venv / "bin"


def starts(args: argparse.Namespace, embedded_cfg: Path, socket: Path) -> None:
    cli = _affidavit()
    thin, python = cli, sys.executable
    if args.installed_client:
        bin = _installed_client(embedded_cfg.parents[1])
        thin, python = [str(bin / "affidavit")], str(bin / "python")
    through = [*thin, "call", "-", "--socket", str(socket)]
    local = [*cli, "call", "-", "--config", str(embedded_cfg)]
    env = {k: v for k, v in _env().items() if k != "PYTHONDONTWRITEBYTECODE"}
    _start_to_envelope(through, env)  # warm-up: bytecode caches
    _start_to_envelope(local, env)
    helps = [*thin, "--help"]
    subprocess.run(helps, check=True, env=env, stdout=subprocess.DEVNULL)  # warm-up
    times: dict[str, list[float]] = {"daemon": [], "embedded": [], "help": [], "python": []}
    for _ in range(args.starts):
        times["daemon"].append(_start_to_envelope(through, env))
        times["embedded"].append(_start_to_envelope(local, env))
        for key, argv in (("help", helps), ("python", [python, "-c", "pass"])):
            start = time.perf_counter()
            subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL)
            times[key].append(time.perf_counter() - start)
    print()
    print(f"process start to envelope ({args.starts} runs each, alternating; ms)")
    print(f"thin client and floor: {python}")
    print(f"{'':26} {'median':>8} {'p90':>8} {'min':>8}")
    for label, key in (
        ("affidavit call --socket", "daemon"),
        ("affidavit call (embedded)", "embedded"),
        ("affidavit --help", "help"),
        ("python -c pass (floor)", "python"),
    ):
        ms = sorted(t * 1000 for t in times[key])
        p90 = ms[min(len(ms) - 1, int(len(ms) * 0.9))]
        print(f"{label:26} {statistics.median(ms):>8.1f} {p90:>8.1f} {ms[0]:>8.1f}")
    ratio = statistics.median(times["embedded"]) / statistics.median(times["daemon"])
    print(f"embedded / daemon (median): {ratio:.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seq", type=int, default=400, help="sequential calls per side")
    parser.add_argument("--calls", type=int, default=4000, help="calls per side at concurrency")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--starts", type=int, default=20, help="process starts per side")
    parser.add_argument(
        "--installed-client",
        action="store_true",
        help="start `affidavit call --socket` from a regular install in a fresh venv "
        "(needs pip to reach its index for setuptools); default: this interpreter's",
    )
    args = parser.parse_args()
    os.environ[TOKEN_ENV] = "bench-token"
    server = subprocess.Popen(
        [sys.executable, str(SERVER), "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    with tempfile.TemporaryDirectory(prefix="affidavit-service-bench-") as tmp:
        daemon: subprocess.Popen[bytes] | None = None
        try:
            assert server.stdout is not None
            port = int(server.stdout.readline())
            dir = Path(tmp)
            embedded_cfg = _config(dir, port, "embedded")
            daemon_cfg = _config(dir, port, "daemon")
            socket = daemon_cfg.parent / "affidavit.sock"
            daemon = subprocess.Popen(
                [*_affidavit(), "serve", "--config", str(daemon_cfg)],
                env=_env(),
                stderr=subprocess.DEVNULL,
            )
            deadline = time.monotonic() + 30
            while not socket.exists():
                if time.monotonic() > deadline or daemon.poll() is not None:
                    raise RuntimeError("the daemon did not start")
                time.sleep(0.05)
            print(f"loopback server :{port}; daemon pid {daemon.pid}; journals in {dir}")
            print()
            trio.run(throughput, args, embedded_cfg, socket, daemon.pid)
            starts(args, embedded_cfg, socket)
        finally:
            if daemon is not None:
                daemon.terminate()
                daemon.wait(timeout=30)
            if server.stdin is not None:
                server.stdin.close()
            server.wait(timeout=10)


if __name__ == "__main__":
    main()
