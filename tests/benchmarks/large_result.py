"""A large response: broker ``call()`` against httpx streaming the same body, side by side.

    .venv/bin/python tests/benchmarks/large_result.py [--mib N] [--rounds R] [--dir DIR]
                                                      [--ab OLD_CHECKOUT] [--as-served]
                                                      [--postgres]

One loopback server (``http_overhead.py --serve``, its own process) answers ``GET /v1/big/N``
with N bytes.  Each client runs in a process of its own, in interleaved rounds (medians):

* ``httpx``: ``httpx.AsyncClient.stream`` under trio, every byte iterated and hashed, nothing
  kept -- what a careful client does with 50 MiB;
* ``broker``: ``Broker.call`` with its journal on: the body redacted, hashed, sealed and
  journaled in 64 KiB chunks, RESULT_COMMITTED durable before the envelope is returned; above
  the inline limit (1 MiB) the envelope carries the result's size, hash and fetch reference.
  With ``--as-served`` its process first sets what ``affidavit serve`` sets for itself at start
  (``affidavit.heap.keep_freed_buffers``; an ``--ab`` checkout without it stays untouched).
  With ``--postgres`` the journal is a shared one on a PostgreSQL server started for the run
  (``tests/postgres.py``, ``fsync = on``), every broker process on the same database with its
  own signing key: the result's chunks are rows there, read back and hashed by the commit
  (on SQLite a long result's chunks go to segment files the commit does not read back).

Per client: seconds for the call (median, and the fastest and slowest round), MiB/s, the
process's CPU seconds during the call (all its threads; for the broker also its main thread, the
one reading the response), peak RSS growth over the process's RSS just before the call (the
kernel's VmHWM, reset just before; the process is warmed by one small call first), and its
throughput against httpx's: the medians' ratio, and the lowest and highest of each round's ratio
against httpx's run of that round.
On a loaded machine CPU seconds vary less than wall time.  Targets (issue
15): broker >= 0.5x httpx's throughput, peak RSS growth <= 32 MiB.  ``--ab DIR`` also measures
the broker imported from another checkout (before/after).  A script, not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).parent))
import http_overhead  # its server, config and --ab import hook

TOKEN_ENV = http_overhead.TOKEN_ENV
_PG_ENV = "AFFIDAVIT_BENCH_JOURNAL_URL"
"""``--postgres``: the database's URL (password in it), handed to each broker process in its
environment, not its argv; the shared broker key file beside it in ``_KEY_ENV``."""
_KEY_ENV = "AFFIDAVIT_BENCH_KEY_FILE"


def _current_rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


def _peak_rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise OSError("no VmHWM in /proc/self/status")


def _reset_peak_rss() -> bool:
    """Make VmHWM the current RSS (``/proc/self/clear_refs`` 5, Linux 4.0+); False if refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _cpu() -> tuple[float, float]:
    """(CPU seconds of this process, of the calling thread)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, time.thread_time()


class PeakRss:
    """Peak RSS growth over the RSS at entry: the kernel's own peak (VmHWM), reset at entry --
    exact, and no thread in the measured process (a sampling thread waking every 2 ms takes
    the GIL from the call it measures).  Where the peak cannot be reset it falls back to
    sampling every 2 ms from a thread (``ru_maxrss`` would keep a peak from before, e.g. from
    imports)."""

    def __enter__(self) -> PeakRss:
        self.before = self.peak = _current_rss_mib()
        self._thread: threading.Thread | None = None
        if _reset_peak_rss():
            return self
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _current_rss_mib())

    def __exit__(self, *exc: object) -> None:
        if self._thread is None:
            self.peak = max(self.peak, _peak_rss_mib())
            return
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _current_rss_mib())

    @property
    def growth(self) -> float:
        return self.peak - self.before


async def _httpx(port: int, size: int) -> dict[str, Any]:
    import httpx

    headers = {"Authorization": f"Bearer {os.environ[TOKEN_ENV]}"}
    async with httpx.AsyncClient() as client:
        await client.get(f"http://127.0.0.1:{port}/v1/ok", headers=headers)
        with PeakRss() as rss:
            cpu0, main0 = _cpu()
            t0 = time.perf_counter()
            sha = hashlib.sha256()
            got = 0
            async with client.stream(
                "GET", f"http://127.0.0.1:{port}{http_overhead.BIG_PREFIX}{size}", headers=headers
            ) as r:
                async for piece in r.aiter_bytes():
                    sha.update(piece)
                    got += len(piece)
            took = time.perf_counter() - t0
            cpu1, main1 = _cpu()
    if got != size:
        raise RuntimeError(f"httpx: {got} bytes of {size}")
    return {"s": took, "rss": rss.growth, "cpu": cpu1 - cpu0, "main": main1 - main0}


async def _broker(port: int, size: int, tmp: Path) -> dict[str, Any]:
    from affidavit.api.broker import Broker
    from affidavit.config import load_config

    cfg = tmp / "affidavit.toml"
    config = http_overhead._config(tmp, port)
    url = os.environ.get(_PG_ENV)
    if url:
        target = config.split("\n\n", 1)[1]  # the [targets.api] table
        config = (
            f'[journal]\nurl = "{url}"\nkey_file = "{os.environ[_KEY_ENV]}"\n'
            f'signing_key = "{tmp / "signing.key"}"\n\n{target}'
        )
    cfg.touch(mode=0o600)  # (a URL's password in it: the broker refuses a config others read)
    cfg.write_text(config, encoding="utf-8")
    async with Broker.open(config=load_config(cfg)) as broker:
        await broker.call({"target": "api", "method": "GET", "path": "/v1/ok"})
        with PeakRss() as rss:
            cpu0, main0 = _cpu()
            t0 = time.perf_counter()
            env = await broker.call(
                {"target": "api", "method": "GET", "path": f"{http_overhead.BIG_PREFIX}{size}"}
            )
            took = time.perf_counter() - t0
            cpu1, main1 = _cpu()
        if "error" in env:
            raise RuntimeError(f"broker: {env['error']}")
        result = env["result"]
        by_ref = "by_reference" in result
        got = result["by_reference"]["bytes"] if by_ref else len(result["body"])
        del env, result
    if got != size:
        raise RuntimeError(f"broker: {got} bytes of {size}")
    return {
        "s": took,
        "rss": rss.growth,
        "cpu": cpu1 - cpu0,
        "main": main1 - main0,
        "by_reference": by_ref,
    }


def child(args: argparse.Namespace) -> None:
    size = args.mib << 20
    if args.client == "httpx":
        out = trio.run(_httpx, args.port, size)
    else:
        if args.src:
            http_overhead._use_source(Path(args.src))
        if args.as_served:
            try:
                from affidavit.heap import keep_freed_buffers
            except ImportError:  # (an --ab checkout from before it existed: untouched)
                pass
            else:
                keep_freed_buffers()
        with tempfile.TemporaryDirectory(prefix="affidavit-bench-", dir=args.dir) as d:
            out = trio.run(_broker, args.port, size, Path(d))
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--src", help=argparse.SUPPRESS)
    parser.add_argument("--mib", type=int, default=50, help="response size in MiB")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, help="where the journal goes (default: a temp dir)")
    parser.add_argument("--ab", metavar="SRC", help="also measure the broker from SRC (A/B)")
    parser.add_argument(
        "--as-served", action="store_true", help="the broker's process set up as serve's"
    )
    parser.add_argument(
        "--postgres", action="store_true", help="the journal on a PostgreSQL started for the run"
    )
    args = parser.parse_args()
    os.environ.setdefault(TOKEN_ENV, "bench-" + os.urandom(12).hex())
    if args.client:
        child(args)
        return
    clients: list[tuple[str, str, str | None]] = [
        ("httpx streaming, trio", "httpx", None),
        ("broker call()", "broker", None),
    ]
    if args.ab:
        clients.append((f"broker call() @ {Path(args.ab).name}", "broker", args.ab))
    with contextlib.ExitStack() as stack:
        if args.postgres:
            sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
            from tests.postgres import Cluster

            cluster = Cluster.create(tmpfs=False)
            stack.callback(cluster.destroy)
            keys = stack.enter_context(tempfile.TemporaryDirectory(prefix="affidavit-bench-"))
            os.environ[_PG_ENV] = cluster.database()
            os.environ[_KEY_ENV] = str(Path(keys) / "shared.key")
        _run(args, clients)


def _run(args: argparse.Namespace, clients: list[tuple[str, str, str | None]]) -> None:
    results: dict[str, list[dict[str, Any]]] = {c[0]: [] for c in clients}
    loads = [os.getloadavg()[0]]
    with http_overhead._server() as port:
        for r in range(args.rounds):
            for label, name, src in clients[r % len(clients) :] + clients[: r % len(clients)]:
                cmd = [sys.executable, __file__, "--client", name, "--port", str(port)]
                cmd += ["--mib", str(args.mib)]
                if args.dir:
                    cmd += ["--dir", str(args.dir)]
                if src:
                    cmd += ["--src", src]
                if args.as_served and name == "broker":
                    cmd += ["--as-served"]
                out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
                results[label].append(json.loads(out.strip().splitlines()[-1]))
            loads.append(os.getloadavg()[0])
    where = "a PostgreSQL journal" if args.postgres else "a SQLite journal"
    print(
        f"{args.mib} MiB response, {where}, {args.rounds} interleaved rounds (medians), 1-min "
        f"load average {min(loads):.2f}..{max(loads):.2f} on {os.cpu_count()} cores"
    )
    print(
        "| client | seconds (min..max) | MiB/s | CPU s (process / main thread) "
        "| peak RSS growth MiB | x httpx (min..max) |"
    )
    print("|---|---|---|---|---|---|")
    med: dict[str, tuple[float, float]] = {}
    httpx = [f["s"] for f in results["httpx streaming, trio"]]
    for label, _, _ in clients:
        runs = results[label]
        s, rss, cpu, main = (
            statistics.median(f[k] for f in runs) for k in ("s", "rss", "cpu", "main")
        )
        med[label] = (s, rss)
        # Each round's ratio against httpx's run of the same round: the spread the load gave.
        ratios = [h / f["s"] for h, f in zip(httpx, runs, strict=True)]
        fast, slow = min(f["s"] for f in runs), max(f["s"] for f in runs)
        print(
            f"| {label} | {s:.3f} ({fast:.3f}..{slow:.3f}) | {args.mib / s:.1f} "
            f"| {cpu:.3f} / {main:.3f} | {rss:.1f} "
            f"| {statistics.median(httpx) / s:.2f} ({min(ratios):.2f}..{max(ratios):.2f}) |"
        )
    (hs, _), (bs, brss) = med["httpx streaming, trio"], med["broker call()"]
    ratio = hs / bs
    print(f"broker / httpx throughput: {ratio:.2f}x (target >= 0.5x: {_v(ratio >= 0.5)})")
    print(f"broker peak RSS growth: {brss:.1f} MiB (target <= 32 MiB: {_v(brss <= 32)})")
    print(f"by reference: {[f.get('by_reference') for f in results['broker call()']]}")


def _v(ok: bool) -> str:
    return "MET" if ok else "MISSED"


if __name__ == "__main__":
    main()
