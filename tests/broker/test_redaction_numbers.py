"""A credential the remote echoes as a number is redacted too: a Proxy-Status
``received-status`` (parsed into an integer of up to 15 digits) or a ``Retry-After`` of digits
(parsed into seconds) -- neither is a string, so redaction that scrubs strings only kept them,
in the envelope and the record, while the same secret in ``details`` was redacted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.http.hostile import HostileServer, Received, Reply, scripts

from .helpers import TOKEN_ENV, http_target, open_broker, write_config

SECRET = "987654321012"
"""A numeric credential: what a server echoes it as is a number."""
PART = SECRET[:8]
"""Its first digits: a secret cut short is a secret still."""


def _reply(req: Received) -> Reply:
    if req.target == "/origin":  # an origin's answer relayed, the proxy naming its status
        ps = f'edge; received-status={SECRET}; details="{SECRET}"'
        return Reply(200, [("proxy-status", ps)], b"ok")
    if req.target == "/proxy":  # a proxy's own error
        ps = f"edge; error=http_response_timeout; received-status={PART}"
        return Reply(502, [("proxy-status", ps)])
    if req.target == "/zero":
        return Reply(200, [("proxy-status", f"edge; received-status=0{SECRET}")], b"ok")
    if req.target == "/busy":
        return Reply(503, [("retry-after", SECRET)], b"busy")
    return Reply(404)


async def _calls(tmp_path: Path) -> list[Any]:
    async with HostileServer.running(scripts.serve(_reply)) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        seen: list[Any] = []
        async with open_broker(cfg) as broker:
            for path in ("/origin", "/proxy", "/zero", "/busy"):
                with trio.fail_after(10):
                    env = await broker.call({"target": "api", "method": "GET", "path": path})
                seen.append(env)
                seen.extend(e.attrs for e in broker.events(env["invocation_id"]))
    return seen


def _members(envelope: dict[str, Any]) -> list[dict[str, Any]]:
    ev = envelope["evidence"]
    return ev.get("proxy_status") or ev["evidence_from"].get("proxy_status") or []


def test_a_credential_echoed_as_a_number_is_redacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, SECRET)
    seen = trio.run(_calls, tmp_path)
    text = json.dumps(seen)
    assert SECRET not in text and PART not in text, text
    envelopes = [s for s in seen if "invocation_id" in s]
    origin, proxy, zero, busy = envelopes
    assert _members(origin) == [
        {"proxy": "edge", "received_status": "[redacted]", "details": "[redacted]"}
    ], origin
    assert _members(proxy)[0]["received_status"] == "[redacted]", proxy
    assert _members(zero) == [{"proxy": "edge", "received_status": "[redacted]"}], zero
    assert busy["error"]["code"] == "REMOTE_THROTTLED", busy
    assert "retry_after" not in busy["evidence"], busy  # a number in the schema: dropped


def test_a_number_holding_no_secret_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, "tok-not-a-number-4711x")
    seen = trio.run(_calls, tmp_path)
    origin, _, _, busy = [s for s in seen if "invocation_id" in s]
    assert _members(origin)[0]["received_status"] == int(SECRET), origin
    assert busy["evidence"]["retry_after"] == float(SECRET), busy
