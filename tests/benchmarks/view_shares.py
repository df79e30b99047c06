"""One uid flooding the views, another uid's views meanwhile: the daemon's fair share of the view
threads and the kept views' turn (``daemon/shares.py``) against first come, first served (a
``trio.CapacityLimiter`` for the views' threads and one for the kept views' own), side by side
from one run.

    .venv/bin/python tests/benchmarks/view_shares.py [--sessions N] [--flood K] [--rounds R]

A daemon in this process (``Daemon.run``) over a journal of ``--sessions`` refused calls, each
its own session; two local uids are stood for by connections bound to abstract names (the
daemon tests' ``_Strangers``).  Each round, alternating the two ways so load drift hits both:
uid A loops ``GET /v1/sessions?limit=10000`` on ``--flood`` connections while uid B asks
``GET /v1/metrics?format=json`` and ``GET /v1/invocations/{id}`` one after another; B's
latencies (median, 90th percentile) and A's answered requests are printed per way, with the
ratio.  Wall times on a shared machine: read the ratio, not the figures.  A script, not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from affidavit.api.readers import BoundedTurn  # noqa: E402
from affidavit.config import load_config  # noqa: E402
from affidavit.daemon import app as daemon_app  # noqa: E402
from affidavit.daemon import server as daemon_server  # noqa: E402
from tests.broker.helpers import TOKEN_ENV  # noqa: E402
from tests.daemon.kit import action_bytes, api_target, write_daemon_config  # noqa: E402
from tests.daemon.test_connections import _Strangers  # noqa: E402
from tests.daemon.test_view_shares import ask_as  # noqa: E402

A, B = 65534, 65533
FLOOD_FOR = 3.0
"""Seconds each round's flood lasts."""


class FirstCome:
    """The views' places as they were handed out before the share: first come, first served."""

    def __init__(self, slots: int) -> None:
        self.limiter = trio.CapacityLimiter(slots)

    def place(self, asker: Any, wait: float) -> BoundedTurn:
        return BoundedTurn(self.limiter, wait)


@contextlib.asynccontextmanager
async def daemon(tmp: Path) -> AsyncIterator[tuple[_Strangers, list[Any]]]:
    os.environ.setdefault(TOKEN_ENV, "canary-bench")
    socket = tmp / "affidavit.sock"
    strangers = _Strangers(socket)
    daemon_server.peer_of = strangers.peer_of  # (this process only: a script)
    apis: list[Any] = []
    real_init = daemon_app.Api.__init__

    def init(self: Any, *a: Any, **k: Any) -> None:
        real_init(self, *a, **k)
        apis.append(self)

    daemon_app.Api.__init__ = init  # type: ignore[method-assign]
    service = {"allow_uids": [A, B], "call_rate": 100000, "call_burst": 1000000}
    config = write_daemon_config(
        tmp, api_target("http://127.0.0.1:9"), socket=socket, service=service
    )
    async with trio.open_nursery() as nursery:
        d = daemon_server.Daemon(load_config(config))
        await nursery.start(d.run)
        try:
            yield strangers, apis
        finally:
            d.shutdown.set()


async def fill(strangers: _Strangers, n: int) -> str:
    iid = ""
    for i in range(n):
        body = action_bytes(method="DELETE", session=f"s{i:07d}-" + "x" * 200)
        _, _, envelope = await ask_as(strangers, A, "POST", "/v1/calls", body)
        iid = json.loads(envelope)["invocation_id"]
    return iid


async def round_of(strangers: _Strangers, record: str, flood: int) -> tuple[list[float], int]:
    stop = time.monotonic() + FLOOD_FOR
    answered, waits = [0], []

    async def flooding() -> None:
        while time.monotonic() < stop:
            await ask_as(strangers, A, "GET", "/v1/sessions?limit=10000")
            answered[0] += 1

    async with trio.open_nursery() as nursery:
        for _ in range(flood):
            nursery.start_soon(flooding)
        await trio.sleep(0.3)
        while time.monotonic() < stop:
            for path in ("/v1/metrics?format=json", record):
                t = time.perf_counter()
                status, _, _ = await ask_as(strangers, B, "GET", path)
                waits.append(time.perf_counter() - t if status == 200 else float("inf"))
    return waits, answered[0]


def _p(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="affidavit-bench-") as tmp:
        async with daemon(Path(tmp)) as (strangers, apis):
            record = f"/v1/invocations/{await fill(strangers, args.sessions)}"
            (api,) = apis
            shared = (api.view_share, api.summary_turn)
            first = (FirstCome(daemon_app.VIEW_THREADS), FirstCome(1))
            waits: dict[str, list[float]] = {"fair share": [], "first come": []}
            flood = {"fair share": 0, "first come": 0}
            for _ in range(args.rounds):
                for name, (threads, turn) in (("fair share", shared), ("first come", first)):
                    api.view_share, api.summary_turn = threads, turn
                    got, answered = await round_of(strangers, record, args.flood)
                    waits[name] += got
                    flood[name] += answered
    print(f"{args.sessions} sessions, uid A flooding /v1/sessions on {args.flood} connections")
    print(f"{'':28} {'fair share':>12} {'first come':>12} {'fair/first':>11}")
    for label, q in (("B's view, median (s)", 0.5), ("B's view, 90th pct (s)", 0.9)):
        fair, fifo = _p(waits["fair share"], q), _p(waits["first come"], q)
        print(f"{label:28} {fair:>12.3f} {fifo:>12.3f} {fair / fifo:>10.2f}x")
    declined = {k: sum(1 for w in v if w == float("inf")) for k, v in waits.items()}
    print(
        f"{'B refused (of asked)':28} {declined['fair share']:>5}/{len(waits['fair share']):<6}"
        f" {declined['first come']:>5}/{len(waits['first come']):<6}"
    )
    ratio = flood["fair share"] / max(1, flood["first come"])
    print(f"{'A answered':28} {flood['fair share']:>12} {flood['first come']:>12} {ratio:>10.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=3000)
    parser.add_argument("--flood", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    trio.run(main, parser.parse_args())
