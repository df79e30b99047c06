"""One sequential broker ``call()`` dissected: where its time goes, stage by stage (issue 15, c=1).

    .venv/bin/python tests/benchmarks/call_timeline.py [--calls N] [--dir DIR] [--ab SRC]

The broker (``Broker.open``, journal on disk) calls the loopback h11 server of
``http_overhead.py`` ``--calls`` times, one after the other, with ``time.perf_counter_ns``
marks wrapped around what each call goes through: the trio side queueing a journal write
(``submit``), the hand-off to the writer thread (``put`` on the loop, ``got`` on the thread),
the transaction (``begin``, rows and chain until ``sign``, the signed checkpoint, ``commit`` with
its fsync), the wake-up back (``rsoon``: ``TrioToken.run_sync_soon``; ``done``: the callback on
the loop; the submitter resumes), the adapter (``perform``, ``exch``: the HTTP exchange itself;
``send``: its socket writes, the first of them the request head once the gate returned).
It prints the median of each step between consecutive marks over the calls whose marks came in
the usual order, each tagged with the thread it ends on (L loop, W writer).  ``--ab SRC``
dissects a broker imported from another checkout instead (``http_overhead.py --ab``).

The marks wrap private functions of this tree (``journal/writer.py``, the SQLite backend, the
HTTP client): a script to read figures from, not a test; it asserts nothing about time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).parent))
import http_overhead
from http_clients import PATH

Mark = tuple[int, str, int]
MARKS: list[Mark] = []


def mark(label: str) -> None:
    MARKS.append((time.perf_counter_ns(), label, threading.get_ident()))


def _wrap(owner: Any, name: str, label: str) -> None:
    inner = getattr(owner, name)

    def wrapped(*a: Any, **k: Any) -> Any:
        mark(label + ">")
        try:
            return inner(*a, **k)
        finally:
            mark(label + "<")

    setattr(owner, name, wrapped)


def _wrap_async(owner: Any, name: str, label: str) -> None:
    inner = getattr(owner, name)

    async def wrapped(*a: Any, **k: Any) -> Any:
        mark(label + ">")
        try:
            return await inner(*a, **k)
        finally:
            mark(label + "<")

    setattr(owner, name, wrapped)


class _Queue:
    """The writer's queue to its thread, marked on both sides."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def put(self, item: Any) -> None:
        mark("put")
        self.inner.put(item)

    def get(self) -> Any:
        item = self.inner.get()
        mark("got")
        return item


class _Token:
    """The trio token as the writer thread sees it: ``run_sync_soon`` marked."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def run_sync_soon(self, fn: Callable[..., object], *args: Any) -> None:
        mark("rsoon>")
        self.inner.run_sync_soon(fn, *args)
        mark("rsoon<")


def instrument() -> None:
    import affidavit.adapters.http.client as client
    from affidavit.journal import checkpoints, sqlite
    from affidavit.journal import writer as w

    init = w.Writer.__init__

    def marked_init(self: Any, *a: Any, **k: Any) -> None:
        init(self, *a, **k)
        self._batches = _Queue(self._batches)

    thread_main = w.Writer._thread_main

    def marked_thread_main(self: Any, token: Any, batches: Any) -> None:
        thread_main(self, _Token(token), _Queue(batches.inner))

    w.Writer.__init__ = marked_init  # type: ignore[method-assign]
    w.Writer._thread_main = marked_thread_main  # type: ignore[method-assign]
    _wrap_async(w.Writer, "submit", "submit")
    _wrap(w.Writer, "_run_batch", "batch")
    _wrap(w.Writer, "_done", "done")
    _wrap(sqlite.SqliteBackend, "begin", "begin")
    _wrap(sqlite.SqliteBackend, "commit", "commit")
    _wrap(checkpoints, "sign", "sign")
    _wrap_async(client.HttpClient, "perform", "perform")
    _wrap_async(client, "exchange", "exch")
    _wrap_async(trio.SocketStream, "send_all", "send")


async def dissect(port: int, tmp: Path, calls: int) -> None:
    from affidavit.api.broker import Broker
    from affidavit.config import load_config

    cfg = tmp / "affidavit.toml"
    cfg.write_text(http_overhead._config(tmp, port), encoding="utf-8")
    # Steady state: a config file changed within SETTLED_NS is read again at every dispatch.
    await trio.sleep(http_overhead.CONFIG_SETTLED_S)  # (as http_overhead.measure_broker)
    action = {"target": "api", "method": "GET", "path": PATH}
    runs: list[list[Mark]] = []
    async with Broker.open(config=load_config(cfg)) as broker:
        for _ in range(http_overhead.WARM_UP):
            await broker.call(action)
        import affidavit.engine

        getattr(affidavit.engine, "tune_collector", lambda: None)()
        loop = threading.get_ident()
        for _ in range(calls):
            MARKS.clear()
            mark("call>")
            env = await broker.call(action)
            mark("call<")
            if "error" in env:
                raise RuntimeError(f"broker call failed: {env['error']}")
            runs.append(list(MARKS))
    orders = [tuple(label for _, label, _ in r) for r in runs]
    usual = max(set(orders), key=orders.count)
    kept = [r for r, o in zip(runs, orders, strict=True) if o == usual]
    total = statistics.median(r[-1][0] - r[0][0] for r in kept) / 1e3
    print(f"{len(kept)}/{len(runs)} calls with the usual marks; call p50 {total:.1f} us")
    print("| from | to | thread | p50 us | mean us |")
    print("|---|---|---|---|---|")
    for i in range(1, len(usual)):
        d = [(r[i][0] - r[i - 1][0]) / 1e3 for r in kept]
        where = "L" if kept[0][i][2] == loop else "W"
        print(
            f"| {usual[i - 1]} | {usual[i]} | {where} "
            f"| {statistics.median(d):.1f} | {statistics.mean(d):.1f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=300, help="sequential calls dissected")
    parser.add_argument("--dir", type=Path, help="where the journal goes (default: a temp dir)")
    parser.add_argument("--ab", metavar="SRC", help="dissect the broker of another checkout")
    args = parser.parse_args()
    if args.calls < 1:
        parser.error("--calls must be >= 1")
    os.environ.setdefault(http_overhead.TOKEN_ENV, "bench-" + os.urandom(12).hex())
    if args.ab:
        http_overhead._use_source(Path(args.ab))
    instrument()
    with (
        tempfile.TemporaryDirectory(prefix="affidavit-bench-", dir=args.dir) as d,
        http_overhead._server() as port,
    ):
        trio.run(dissect, port, Path(d), args.calls)


if __name__ == "__main__":
    main()
