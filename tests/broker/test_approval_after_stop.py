"""A request that needs approval, whose record was closed before the approval was asked: its
broker stopped (or the journal refused a write) between the preamble and APPROVAL_REQUESTED,
and the daemon's start closed it setup_failed (not_attempted, retry backoff).  A same-key retry
is a new attempt -- and it must ask an operator first, never send what nobody approved."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.engine import approval as approval_module
from affidavit.statemachine import EventKind
from tests.http.hostile import HostileServer, Reply, scripts

from .approvalkit import OPS, approval_config, verify_ok
from .helpers import event_kinds, open_broker

E = EventKind
OK = Reply(200, body=b'{"ok": true}')
IDEM = {"header": "Idempotency-Key", "scope": "charges", "retention": "24h"}
CHARGE = {
    "target": "api",
    "method": "POST",
    "path": "/v1/charges",
    "body": '{"amount": 5}',
    "idempotency_key": "charge-7",
}


class _Stopped(BaseException):
    """The broker stopping right after the preamble was queued, before APPROVAL_REQUESTED: not
    an ``Exception`` -- a failure inside the broker is closed at once (``internal_close``), a
    stopped process is closed by the next start's recovery, which this test is about."""


async def test_a_retry_of_a_request_closed_before_its_approval_asks_for_it(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with HostileServer.running(scripts.serve(OK)) as srv:
        cfg = approval_config(tmp_path, srv.url, idempotency=IDEM)
        real = approval_module.request_attrs
        stops = [True]

        def request_attrs(*args: Any, **kwargs: Any) -> Any:
            if stops and stops.pop():
                raise _Stopped
            return real(*args, **kwargs)

        monkeypatch.setattr(approval_module, "request_attrs", request_attrs)
        async with open_broker(cfg) as b:
            with trio.fail_after(10), pytest.raises(_Stopped):
                await b.call(CHARGE)
        async with open_broker(cfg) as b:
            with trio.fail_after(10):
                (closed,) = await b._engine.recover_orphans()  # the daemon's start
                assert (closed.state, closed.retry.value) == ("setup_failed", "backoff")
                again = await b.call(CHARGE)
            assert again["invocation_id"] == closed.invocation_id
            assert again["error"]["code"] == "APPROVAL_PENDING", again
            assert srv.requests == []  # nothing sent that no operator approved
            await b.approve(closed.invocation_id, operator=OPS)
            with trio.fail_after(10):
                sent = await b.call(CHARGE)
            assert sent.get("error") is None and sent["result"]["status"] == 200, sent
            kinds = event_kinds(b, closed.invocation_id)
            assert kinds.index(E.APPROVAL_GRANTED) < kinds.index(E.DISPATCH_STARTED)
            verify_ok(b)
    assert len(srv.requests) == 1
