"""A mismatch that answers "nothing was sent under the key" first makes it so (``binder.fence``).

Two brokers of one journal file (a shared journal: neither is its only writer), one target
``api`` each, configured differently: X's total timeout 30 s, Y's 1 s.  X binds ``charge-1``
and stalls before recording anything; Y calls under the same key (another fingerprint: its
target's configuration differs).  Y judged X gone by *its own* target's window (1 s +
lease_margin) and answered IDEMPOTENCY_MISMATCH "nothing was sent ... use a new key" with
nothing written into X's invocation: X resumed inside its own 30 s lease and sent, Y's caller
resent under a new key, and the remote was charged twice.

The fenced record names the binder's target, bound with the key: a scope shared by two targets
(X ``pay``, Y ``api``) once had Y fence X's invocation with no target, which every caller of
every broker read and listed (key, scope, fingerprint of another target's call).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio

from affidavit.api.broker import Broker
from affidavit.config import load_config
from affidavit.engine import EngineSettings
from affidavit.engine.binder import UNKNOWN_TARGET
from affidavit.statemachine import FENCE_RULES
from affidavit.statemachine import EventKind as E
from affidavit.views import actions_page
from tests.http.hostile import HostileServer, Peer, Reply
from tests.journal.helpers import sql

from .approvalkit import verify_ok
from .helpers import http_target, write_config
from .http_rows import IDEM, LIMIT

CHARGE = {
    "target": "api",
    "method": "POST",
    "path": "/v1/charges",
    "body": '{"amount": 5}',
    "idempotency_key": "charge-1",
}


def _configs(tmp_path: Path, url: str) -> tuple[Path, Path]:
    def one(total: int, name: str) -> Path:
        timeout = {"connect": 1, "total": total}
        return write_config(
            tmp_path, {"api": http_target(url, idempotency=IDEM, timeout=timeout)}, name=name
        )

    return one(30, "x.toml"), one(1, "y.toml")


async def _serve(peer: Peer, received: list[bytes]) -> None:
    while True:
        req = await peer.read_request()
        if req is None:
            return
        received.append(req.body or b"")
        await peer.respond(Reply(201, body=b'{"id": "ch_1"}'))


def _stall_after_binding(broker: Broker, *, drop_deadline: bool = False) -> tuple[Any, Any]:
    """X's broker stalls between its binding and its first event until ``go`` is set;
    ``drop_deadline``: it binds as a broker from before the binding row held the binder's own
    send deadline and target did."""
    bound, go = trio.Event(), trio.Event()
    bind = broker.journal.bind_idempotency

    async def stalled(*args: Any, **kwargs: Any) -> Any:
        if drop_deadline:
            kwargs.pop("send_by", None)
            kwargs.pop("target", None)
        done = await bind(*args, **kwargs)
        bound.set()
        await go.wait()
        return done

    broker.journal.bind_idempotency = stalled  # type: ignore[method-assign]
    return bound, go


async def test_a_binder_judged_gone_by_the_caller_s_window_is_fenced_and_sends_nothing(
    tmp_path: Path, token: str
) -> None:
    """Y, judging by a window shorter than X's, closes X's invocation before it answers
    "nothing was sent": X, resuming inside its own lease, is refused its first event and sends
    nothing -- answered from the closed record (IDEMPOTENCY_MISMATCH, not_attempted), as a
    fetch of it is; Y's new-key resend is the one charge."""
    received: list[bytes] = []

    async def script(peer: Peer) -> None:
        await _serve(peer, received)

    async with HostileServer.running(script) as srv:
        cx, cy = _configs(tmp_path, srv.url)
        quick = EngineSettings(lease_margin=0.1)
        async with (
            Broker.open(config=load_config(cx)) as bx,
            Broker.open(config=load_config(cy), settings=quick) as by,
        ):
            bound, go = _stall_after_binding(bx, drop_deadline=True)
            out: dict[str, dict[str, Any]] = {}

            async def x_call() -> None:
                out["x"] = await bx.call(CHARGE)

            with trio.fail_after(LIMIT):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(x_call)
                    await bound.wait()
                    out["y"] = await by.call(CHARGE)
                    go.set()  # X resumes well inside its own 30 s lease
                again = await by.call({**CHARGE, "idempotency_key": "charge-2"})
            x, y = out["x"], out["y"]
            assert y["error"]["code"] == "IDEMPOTENCY_MISMATCH", y
            assert "nothing was sent under the key" in y["error"]["message"]
            fetched = await bx.fetch_result(x["invocation_id"], as_operator=True)
            assert fetched is not None
            assert x["error"] == fetched["error"], (x, fetched)
            assert x["error"]["code"] == "IDEMPOTENCY_MISMATCH", x
            assert x["error"]["outcome"] == "not_attempted", x
            assert "nothing was sent under the key" in x["error"]["message"]
            assert again.get("error") is None, again
            # X's invocation is closed by Y's fence: its first event is Y's, naming the binding,
            # and nothing of Y's own call (its invocation id) is written there.
            events = bx.events(x["invocation_id"])
            assert [e.kind for e in events][:2] == [E.ACTION_ACCEPTED, E.PREFLIGHT_FAILED]
            assert events[0].attrs["fenced"]["why"] == "window_over"
            assert events[1].attrs["binder_gone"]["recorded"] == "nothing"
            assert y["invocation_id"] not in json.dumps([e.attrs for e in events])
            # The binding does not say whose target it was: no caller of either broker reads it.
            assert events[0].attrs["operation"]["target"] == UNKNOWN_TARGET
            for b in (bx, by):
                assert not b.callable_by_caller(b.record(x["invocation_id"]))
                assert x["invocation_id"] not in await _listed(b)
            verify_ok(bx)
    assert received == [b'{"amount": 5}']


async def _listed(broker: Broker) -> list[str]:
    """The ids a caller's unfiltered actions list of ``broker`` holds (as the daemon's)."""
    page = await broker.view(
        lambda j: actions_page(j, 50, readable=broker.callable_target), trio.CapacityLimiter(1)
    )
    assert page.total == len(page.records)
    return [r.invocation_id for r in page.records]


async def test_a_fenced_invocation_names_its_binder_s_target_not_the_fencing_one_s(
    tmp_path: Path, token: str
) -> None:
    """Two targets share one scope: X's ``pay`` binds and stalls past its own 1 s deadline; Y's
    ``api`` fences it.  The closed record names ``pay``: Y (which configures only ``api``)
    neither reads nor lists it; X's callers do."""
    received: list[bytes] = []

    async def script(peer: Peer) -> None:
        await _serve(peer, received)

    async with HostileServer.running(script) as srv:
        timeout = {"connect": 1, "total": 1}
        cx = write_config(
            tmp_path,
            {"pay": http_target(srv.url, idempotency=IDEM, timeout=timeout)},
            name="x.toml",
        )
        cy = write_config(tmp_path, {"api": http_target(srv.url, idempotency=IDEM)}, name="y.toml")
        quick = EngineSettings(lease_margin=0.1)
        async with (
            Broker.open(config=load_config(cx), settings=quick) as bx,
            Broker.open(config=load_config(cy), settings=quick) as by,
        ):
            bound, go = _stall_after_binding(bx)
            out: dict[str, dict[str, Any]] = {}

            async def x_call() -> None:
                out["x"] = await bx.call({**CHARGE, "target": "pay"})

            with trio.fail_after(LIMIT):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(x_call)
                    await bound.wait()
                    out["y"] = await by.call(CHARGE)  # waits out X's own deadline, then fences
                    go.set()
            x, y = out["x"], out["y"]
            assert y["error"]["code"] == "IDEMPOTENCY_MISMATCH", y
            xid = x["invocation_id"]
            fetched = await bx.fetch_result(xid)  # X's caller reads it: on X's target
            assert fetched is not None and x["error"] == fetched["error"], (x, fetched)
            assert x["error"]["code"] == "IDEMPOTENCY_MISMATCH", x
            assert x["error"]["outcome"] == "not_attempted", x
            events = bx.events(xid)
            assert events[0].attrs["fenced"]["why"] == "send_by_passed"
            # Fenced under the strict rules whatever judged the binder gone: the record is
            # Record.fenced (no attempt of its binder's is ever taken in it), closed with them.
            fenced = dict(events[0].attrs["fenced"])
            assert fenced.pop("rules") == FENCE_RULES
            record = bx.record(xid)
            assert record is not None and dict(record.fenced or {}) == fenced, record
            assert events[1].attrs["binder_gone"] == fenced
            assert events[0].attrs["operation"]["target"] == "pay"
            assert not by.callable_by_caller(by.record(xid))
            assert xid not in await _listed(by)
            assert bx.callable_by_caller(bx.record(xid))
            assert xid in await _listed(bx)
            verify_ok(bx)
    assert received == []


async def test_a_binder_is_judged_by_its_own_send_deadline_bound_with_the_key(
    tmp_path: Path, token: str
) -> None:
    """The binding holds X's own send deadline (its 30 s lease end): Y, whose target says 1 s,
    still waits after 1.5 s, and is answered from X's record once X goes on -- the same request
    under another configuration, CONFIG_CHANGED naming X's invocation -- never a mismatch
    inviting a resend; X's call is not cut off; the remote is charged once."""
    received: list[bytes] = []

    async def script(peer: Peer) -> None:
        await _serve(peer, received)

    async with HostileServer.running(script) as srv:
        cx, cy = _configs(tmp_path, srv.url)
        quick = EngineSettings(lease_margin=0.1)
        async with (
            Broker.open(config=load_config(cx)) as bx,
            Broker.open(config=load_config(cy), settings=quick) as by,
        ):
            bound, go = _stall_after_binding(bx)
            out: dict[str, dict[str, Any]] = {}

            async def call(name: str, b: Broker) -> None:
                out[name] = await b.call(CHARGE)

            with trio.fail_after(LIMIT):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(call, "x", bx)
                    await bound.wait()
                    nursery.start_soon(call, "y", by)
                    await trio.sleep(1.5)  # past Y's own window (1 s + 0.1 s), inside X's
                    assert "y" not in out, out["y"]  # still waiting for X's record
                    go.set()
            x, y = out["x"], out["y"]
            assert x.get("error") is None, x
            assert y["error"]["code"] == "CONFIG_CHANGED", y
            assert y["evidence"]["idempotency"]["bound_to"] == x["invocation_id"], y
            # The deadline bound with the key is the lease end X's ACTION_ACCEPTED carries.
            accepted = bx.events(x["invocation_id"])[0].attrs
            row = sql(tmp_path / "journal.db", "SELECT send_by FROM idempotency")
            assert row == [(accepted["lease_expires_at"],)], (row, accepted)
            assert "fenced" not in accepted
            verify_ok(bx)
    assert received == [b'{"amount": 5}']
