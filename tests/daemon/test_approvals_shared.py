"""Approvals on a shared PostgreSQL journal whose asking daemon has stopped (audit50d #1).

docs/approvals.md: ``affidavit serve`` "sends each approved request nobody holds".  A request
asked through daemon d1, which then stops, is held by nobody; the daemons still running learn
it from the journal at their sweeps (``engine.approval.refresh``: the rows appended since the
last one), not only at their start -- they were started before it was asked.  So a grant
recorded embedded (by neither) is sent once (the dispatch lease decides between d2 and d3,
both able to), and a request nobody decides is closed APPROVAL_EXPIRED when its window runs
out, with nobody asking.

Real ``affidavit serve`` processes, a real PostgreSQL, the scripted remote counting what it
received; every wait bounded.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from affidavit.api.broker import Broker
from affidavit.api.client import Client
from affidavit.config import load_config
from affidavit.journal.sealing import BrokerKey
from tests.http.hostile import HostileServer, Reply, scripts
from tests.postgres import Cluster

from .kit import DaemonProc, api_target, start_sharing, stop, wait_until

IDEM = {"header": "Idempotency-Key", "scope": "api.create", "retention": "24h"}
SETTLE = 2.0
"""How long after the send the test watches for a second one: two sweeps of every daemon."""
LATE = 2.0
"""How long after the requests are listed d2 grants them: two of its sweeps have seen them."""
CALLERS = 12
"""Requests callers wait for on d1 while d2 grants them: a d2 that took each at once won the
race for the dispatch lease of some of them (seen with ``GRACE`` 0)."""


@asynccontextmanager
async def _daemons(
    tmp: Path, url: str, remote: str, token: str, n: int, **approval: str
) -> AsyncIterator[list[DaemonProc]]:
    BrokerKey.create(tmp / "shared.key")
    policy = {"methods": ["POST"], "ttl": "60s", **approval}
    targets = api_target(remote, idempotency=IDEM, approval=policy)
    service = {"allow_self_approval": True, "lease_margin": 1, "operator_uids": [0]}
    procs: list[DaemonProc] = []
    try:
        for i in range(n):
            procs.append(await start_sharing(tmp, f"d{i}", url, targets, token, service))
        yield procs
    finally:
        for p in procs:
            stop(p)


ACTION = {
    "target": "api",
    "method": "POST",
    "path": "/v1/items/1",
    "body": json.dumps({"n": 1}),
    "idempotency_key": "k1",
}


async def _asked_then_stopped(asker: DaemonProc) -> str:
    """A request asked through ``asker``, answered APPROVAL_PENDING; then ``asker`` stops."""
    async with Client.open(asker.socket) as c:
        envelope = await c.call(ACTION)
    assert envelope["error"]["code"] == "APPROVAL_PENDING", envelope
    stop(asker)
    iid: str = envelope["invocation_id"]
    return iid


async def _kinds(daemon: DaemonProc, iid: str) -> list[Any]:
    async with Client.open(daemon.socket) as c:
        return [e["kind"] for e in await c.events(iid)]


async def test_a_grant_on_another_daemon_is_sent_once_after_the_asking_daemon_stopped(
    pg: Cluster, tmp_path: Path, token: str
) -> None:
    async with (
        HostileServer.running(scripts.serve(Reply(200, body=b"{}"))) as srv,
        _daemons(tmp_path, pg.database(), srv.url, token, 3) as (d1, _d2, d3),
    ):
        iid = await _asked_then_stopped(d1)
        # Granted embedded on the stopped d1's config: neither running daemon records it, so
        # only their sweeps' ``refresh`` (the rows the journal gained) can learn of it.
        async with Broker.open(config=load_config(d1.config)) as embedded:
            await embedded.approve(iid, note="embedded; the asking daemon is gone")
        await wait_until(lambda: len(srv.requests) >= 1, "the approved request is sent", 10)
        await trio.sleep(SETTLE)
        kinds = await _kinds(d3, iid)
        assert len(srv.requests) == 1
        assert kinds.count("DISPATCH_LEASE_ACQUIRED") == 1
        assert kinds.count("REQUEST_SENT") == 1
        assert "RESULT_COMMITTED" in kinds


async def test_an_undecided_approval_of_a_stopped_daemon_expires_on_another(
    pg: Cluster, tmp_path: Path, token: str
) -> None:
    async with (
        HostileServer.running(scripts.serve(Reply(200, body=b"{}"))) as srv,
        _daemons(tmp_path, pg.database(), srv.url, token, 2, ttl="2s") as (d1, d2),
    ):
        iid = await _asked_then_stopped(d1)

        async def expired() -> bool:
            async with Client.open(d2.socket) as c:
                record = await c.record(iid)
            return record is not None and record.get("code") == "APPROVAL_EXPIRED"

        # Nobody reads it through a path that closes it (a decision, a same-key call): d2's
        # dispatcher does, at the sweep after its window ran out.
        await wait_until(expired, "the approval is recorded APPROVAL_EXPIRED", 10)
        assert "PREFLIGHT_FAILED" in await _kinds(d2, iid)
        assert srv.requests == []


async def test_a_caller_waiting_on_one_daemon_gets_the_result_of_a_grant_on_another(
    pg: Cluster, tmp_path: Path, token: str
) -> None:
    """d2 learns the grant it records at once, but leaves a request asked elsewhere to the
    caller that may wait for it there (``engine.approval.GRACE``): that caller is answered the
    result, not IN_PROGRESS for a call d2 took from it."""
    async with (
        HostileServer.running(scripts.serve(Reply(200, body=b"{}"))) as srv,
        _daemons(tmp_path, pg.database(), srv.url, token, 2, wait="10s") as (d1, d2),
    ):
        answers: list[dict[str, Any]] = []

        async def caller(key: str) -> None:
            async with Client.open(d1.socket) as c:
                answers.append(await c.call({**ACTION, "idempotency_key": key}))

        async with trio.open_nursery() as nursery:
            for n in range(CALLERS):
                nursery.start_soon(caller, f"w{n}")
            async with Client.open(d2.socket) as c:

                async def asked() -> list[Any]:
                    rows = list(await c.approvals())
                    return rows if len(rows) == CALLERS else []

                rows = await wait_until(asked, "the requests wait for a decision", 10)
                # Well after d2 first saw them (its sweeps learn each request within a second):
                # the grace counts from the grant, so it cannot pass by the grant coming early.
                await trio.sleep(LATE)
                for row in rows:
                    await c.approve(row["invocation_id"], note="on d2")
        assert [a for a in answers if "result" not in a] == []
        assert len(srv.requests) == CALLERS
