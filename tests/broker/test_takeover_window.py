"""Between a take-over's ACTION_ACCEPTED and its preamble, a late binder writes nothing into the
taker's record and sends nothing.

Two brokers of one journal file, one configuration (total 1 s): X binds ``charge-1`` and stalls
before recording anything (as a broker from before the binding held its send deadline, so Y
judges it by its own window); past that window Y, the same request, takes the invocation over
by winning its first event (``took_over``) and is held right after that write (bounded by
``LIMIT``).  X resumes there: its ACTION_ACCEPTED is refused.  Once, its PREFLIGHT_VALIDATED and
CREDENTIAL_AUTHORIZED, posted in the same write, were each validated alone against Y's record
and landed in it; Y's own preamble was then refused, and Y was answered LEASE_LOST over a
record holding X's credential rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.config import load_config
from affidavit.engine import EngineSettings
from affidavit.statemachine import EventKind as E
from tests.http.hostile import HostileServer, Peer, Reply

from .approvalkit import verify_ok
from .helpers import http_target, write_config
from .http_rows import IDEM, LIMIT
from .test_fence_window import _hold_first, _stall_binder

CHARGE = {
    "target": "api",
    "method": "POST",
    "path": "/v1/charges",
    "body": '{"amount": 5}',
    "idempotency_key": "charge-1",
}


async def _serve(peer: Peer, received: list[bytes]) -> None:
    while True:
        req = await peer.read_request()
        if req is None:
            return
        received.append(req.body or b"")
        await peer.respond(Reply(201, body=b'{"id": "ch_1"}'))


@pytest.mark.parametrize("margin", [0.1, 1.0], ids=["lease_over", "lease_held"])
async def test_a_binder_resuming_after_a_take_over_writes_nothing_into_the_taker_s_record(
    tmp_path: Path, token: str, margin: float
) -> None:
    """X resumes between Y's ACTION_ACCEPTED and Y's preamble: nothing of X lands in Y's
    record, X sends nothing and is answered LEASE_LOST from Y's record (binder.py: a late
    binder is refused its first event); Y then runs the invocation, sends it once, and is
    answered what its own records prove.  ``margin``: X's ``lease_margin`` -- at 0.1 X's own
    lease is over when it resumes; at 1.0 it still holds, with no time left to try in, and X
    closed the record it had lost (SETUP_FAILED, generation 0: Y's attempt too) -- its next
    write after the refused preamble, accepted against Y's record -- and Y, its own
    preamble then refused, sent nothing."""
    received: list[bytes] = []

    async def script(peer: Peer) -> None:
        await _serve(peer, received)

    out: dict[str, dict[str, Any]] = {}
    async with HostileServer.running(script) as srv:
        timeout = {"connect": 1, "total": 1}
        cfg = write_config(
            tmp_path, {"api": http_target(srv.url, idempotency=IDEM, timeout=timeout)}
        )
        quick = EngineSettings(lease_margin=0.1)
        async with (
            Broker.open(
                config=load_config(cfg), settings=EngineSettings(lease_margin=margin)
            ) as bx,
            Broker.open(config=load_config(cfg), settings=quick) as by,
        ):
            go, release = trio.Event(), trio.Event()
            bound, ids = _stall_binder(bx, go)
            held = _hold_first(by, release, "took_over")

            async def call(name: str, b: Broker) -> None:
                out[name] = await b.call(CHARGE)

            with trio.fail_after(LIMIT):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(call, "x", bx)
                    await bound.wait()
                    await trio.sleep(1.3)  # past Y's window for X (total 1 s + margin 0.1)
                    nursery.start_soon(call, "y", by)
                    await held.wait()
                    go.set()  # X resumes in the window
                    while "x" not in out:
                        await trio.sleep(0.01)
                    assert "y" not in out  # Y is still held after its first event
                    (xid,) = ids
                    window = bx.events(xid)
                    release.set()
            # In the window: Y's ACTION_ACCEPTED, then X's LEASE_LOST alone (a stale worker of
            # generation 0 stopped, as the record's ``stale_workers`` says) -- none of X's
            # preamble, whose rows came after its refused first event.
            assert [e.kind for e in window] == [E.ACTION_ACCEPTED, E.LEASE_LOST], window
            assert "took_over" in window[0].attrs
            assert window[1].attrs == {"generation": 0, "holder": bx._engine.holder}
            events = bx.events(xid)
            kinds = [e.kind for e in events]
            assert events[:2] == window
            assert kinds.count(E.ACTION_ACCEPTED) == kinds.count(E.PREFLIGHT_VALIDATED) == 1
            assert kinds.count(E.CREDENTIAL_AUTHORIZED) == kinds.count(E.DISPATCH_STARTED) == 1
            assert kinds.count(E.RESULT_COMMITTED) == 1, kinds
            # Y: what its own records prove -- sent once, committed, its result returned.
            x, y = out["x"], out["y"]
            assert y["invocation_id"] == xid and "error" not in y, y
            assert y["evidence"]["outcome"] == "committed", y
            assert received == [b'{"amount": 5}']
            # X: sent nothing, and is answered so from the record it lost (LEASE_LOST).
            assert x["invocation_id"] == xid, x
            assert x["error"]["code"] == "LEASE_LOST", x
            assert x["error"]["outcome"] == "not_attempted", x
            assert "it sent nothing" in x["error"]["message"], x
            assert x["evidence"]["dispatch_started"] is False, x
            verify_ok(bx)
