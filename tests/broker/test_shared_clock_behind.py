"""A broker whose clock runs behind the database's must not have its live first attempt closed
by another broker's recovery on a shared PostgreSQL journal.

Generation 0 has no lease row: its deadline is ACTION_ACCEPTED's ``lease_expires_at``, written
by the accepting broker.  Written by that broker's own clock, an hour behind, it was already
past in database time -- the clock recovery judges it by (``leases.check_lapsed``) -- and
broker B's ``fetch_result`` closed A's attempt while A was mid-redirect: a same-key retry could
then have sent the request again.  The journal records it in database time instead
(``Txn.lease_offset``): B answers the record in progress, A sends its next hop and finishes.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

import affidavit.engine.attempt as attempt
import affidavit.engine.invocation as invocation
from affidavit.api.broker import Broker
from affidavit.config import load_config
from affidavit.engine import EngineSettings
from affidavit.statemachine import EventKind as E
from tests.http.hostile import HostileServer, Peer, Reply, Script

from .helpers import GateStall, http_target, write_config
from .http_rows import IDEM

LIMIT = 30  # seconds: the bound on the scenario
BEHIND = 3600.0
HOP = {"target": "api", "method": "POST", "path": "/v1/x", "idempotency_key": "behind"}


class _Behind:
    """Broker A's host clock: an hour behind the database's (and B's)."""

    @staticmethod
    def time() -> float:
        return time.time() - BEHIND


def _redirecting() -> Script:
    """``POST /v1/x`` answers 307 to ``/landing``, which answers 201."""

    async def script(peer: Peer) -> None:
        while True:
            req = await peer.read_request()
            if req is None:
                return
            if req.target.startswith("/landing"):
                await peer.respond(Reply(201, body=b'{"hop": 2}'))
            else:
                await peer.respond(Reply(307, headers=[("Location", "/landing")], body=b"moved"))

    return script


@asynccontextmanager
async def _brokers(
    tmp: Path, url: str, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Broker, Broker]]:
    targets = {"api": http_target(url, idempotency=IDEM, follow_redirects=True)}
    cfg = [
        load_config(
            write_config(
                tmp,
                targets,
                journal={"url": pg_url, "key_file": str(tmp / "k"), "signing_key": str(tmp / n)},
                name=f"{n}.toml",
            )
        )
        for n in "ab"
    ]
    settings = EngineSettings(lease_margin=0.0)
    async with (
        Broker.open(config=cfg[0], settings=settings, holder="worker-A") as a,
        Broker.open(config=cfg[1], settings=settings, holder="worker-B") as b,
    ):
        # A's host clock, as its engine and its journal's writer read it; B reads the real one
        # (B runs only recovery here, in modules not patched).
        monkeypatch.setattr(a.journal._writer, "clock", _Behind.time)
        monkeypatch.setattr(a.journal, "_clock", _Behind.time)
        monkeypatch.setattr(invocation, "time", _Behind)
        monkeypatch.setattr(attempt, "time", _Behind)
        yield a, b


async def test_a_clock_behind_does_not_get_its_live_first_attempt_closed(
    tmp_path: Path, pg_url: str, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with (
        HostileServer.running(_redirecting()) as srv,
        _brokers(tmp_path, srv.url, pg_url, monkeypatch) as (a, b),
    ):
        stall = GateStall(a._engine.bindings["http"], hop=2, limit=LIMIT / 2)
        a._engine.bindings["http"] = stall
        out: dict[str, Any] = {}

        async def call_a() -> None:
            out["a"] = await a.call(HOP)

        with trio.fail_after(LIMIT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(call_a)
                await stall.stopped.wait()  # A sent its first hop and is stopped mid-redirect
                (action,) = b.journal.list_actions()
                iid = action.invocation_id
                seen = await b.fetch_result(iid)  # B's recovery looks at A's attempt
                assert seen is not None and seen["evidence"]["state"] == "dispatched", seen
                stall.resume.set()
        events = b.events(iid)
    (accepted,) = [e for e in events if e.kind is E.ACTION_ACCEPTED]
    # The deadline every broker judges by: the database's time, not A's.
    assert accepted.attrs["lease_expires_at"] > time.time(), accepted.attrs
    assert [r.target for r in srv.requests] == ["/v1/x", "/landing"]
    kinds = [e.kind for e in events]
    assert E.ATTEMPT_INTERRUPTED not in kinds and E.LEASE_LOST not in kinds, kinds
    assert "error" not in out["a"], out["a"]
