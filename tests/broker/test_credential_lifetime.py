"""How long the broker holds a resolved credential (docs/security.md, "Credential lifetime").

A request waiting for an operator's decision holds no resolved credential: it is resolved
again, as it is then, once the request is approved -- the value resolved to bind its version
is dropped as soon as APPROVAL_REQUESTED is written, not kept for the wait (which may last the
approval's whole ``wait``).  And a finished call leaves none behind.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import trio

from affidavit.adapters.http import HttpRequest
from affidavit.api.broker import Broker
from affidavit.secrets.credentials import Credential, Injection
from tests.http.hostile import HostileServer, Reply, scripts

from .approvalkit import OPS, approval_config
from .helpers import assert_ok, open_broker

LIMIT = 20
CHARGE = {"target": "api", "method": "POST", "path": "/v1/charges", "body": '{"amount": 5}'}


def _holders(token: str) -> list[str]:
    """The live objects that hold ``token`` resolved or injected: ``Credential``, ``Injection``
    and ``HttpRequest`` instances."""
    gc.collect()
    found = []
    for obj in gc.get_objects():
        if isinstance(obj, Credential) and obj.value == token.encode():
            found.append("Credential")
        elif isinstance(obj, Injection) and any(token in v for _, v in obj.headers):
            found.append("Injection")
        elif isinstance(obj, HttpRequest) and any(token in v for _, v in obj.headers):
            found.append("HttpRequest")
    return found


async def _waiting(broker: Broker) -> None:
    with trio.fail_after(LIMIT):
        while not broker.approvals():
            await trio.sleep(0.02)


async def test_a_request_waiting_for_approval_holds_no_resolved_credential(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        cfg = approval_config(tmp_path, srv.url, approval={"wait": "20s"})
        async with open_broker(cfg) as broker:
            got: dict[str, Any] = {}

            async def caller() -> None:
                got["env"] = await broker.call(CHARGE)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(caller)
                await _waiting(broker)
                held_while_waiting = _holders(token)
                [waiting] = broker.approvals()
                await broker.approve(waiting["invocation_id"], operator=OPS)
            assert_ok(broker, got["env"])
            held_after = _holders(token)
    assert srv.requests[0].header("authorization") == f"Bearer {token}"  # it was used
    assert held_while_waiting == []
    assert held_after == []
