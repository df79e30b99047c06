"""Through ``Broker.call``: a request body the origin refuses at its head (a complete 413,
RFC 9112 §9.5) is cut, and the durable record says so -- the response head's
PROTOCOL_OBSERVED facts carry ``request_body_cut`` -- while a body written whole carries no
such fact.  The driver rows are in tests/http/test_early_response.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.statemachine import EventKind
from affidavit.views.records import record_view
from tests.http.hostile import HostileServer, Peer, Reply

from .helpers import TOKEN_ENV, http_target, open_broker, write_config

BODY = "z" * (4 << 20)  # past the loopback socket buffers


def _head_facts(broker: Any, env: dict[str, Any]) -> dict[str, Any]:
    view = record_view(broker.record(env["invocation_id"]), broker.events(env["invocation_id"]))
    kind = EventKind.PROTOCOL_OBSERVED.value
    facts = [e["attrs"]["facts"] for e in view["events"] if e["kind"] == kind]
    return next(f for f in facts if "header_names" in f)


@pytest.mark.parametrize("refuse", [True, False], ids=["413-at-head", "200-after-body"])
async def test_the_record_says_when_the_request_body_was_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refuse: bool
) -> None:
    monkeypatch.setenv(TOKEN_ENV, "tok-secret-0001")

    async def script(peer: Peer) -> None:
        rec = await peer.read_head()
        assert rec is not None
        if refuse:
            await peer.respond(Reply(413, headers=[("Connection", "close")], body=b"no"))
            await trio.sleep_forever()  # reads nothing more
        await peer.read_body(rec)
        await peer.respond(Reply(200, body=b"ok"))
        await trio.sleep_forever()

    async with HostileServer.running(script) as srv:
        target = http_target(srv.url, max_body=8 << 20)
        cfg = write_config(tmp_path, {"api": target})
        async with open_broker(cfg) as broker:
            with trio.fail_after(20):
                env = await broker.call(
                    {"target": "api", "method": "POST", "path": "/up", "body": BODY}
                )
            facts = _head_facts(broker, env)
    assert facts["status"] == (413 if refuse else 200)
    assert facts.get("request_body_cut") is (True if refuse else None)
    assert "tok-secret-0001" not in repr(env)
