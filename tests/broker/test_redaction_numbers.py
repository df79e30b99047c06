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


def _echo(req: Received) -> Reply:
    """The remote's words as the test's path names them: ``/ps/<received-status>``,
    ``/ra/<Retry-After>``."""
    kind, _, text = req.target.strip("/").partition("/")
    if kind == "ps":
        return Reply(200, [("proxy-status", f"edge; received-status={text}")], b"ok")
    return Reply(503, [("retry-after", text)], b"busy")


async def _echoed(tmp_path: Path, paths: tuple[str, ...]) -> list[dict[str, Any]]:
    async with HostileServer.running(scripts.serve(_echo)) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        seen: list[dict[str, Any]] = []
        async with open_broker(cfg) as broker:
            for path in paths:
                with trio.fail_after(10):
                    env = await broker.call({"target": "api", "method": "GET", "path": path})
                seen.append(
                    {
                        "envelope": env,
                        "events": [e.attrs for e in broker.events(env["invocation_id"])],
                    }
                )
    return seen


def test_a_secret_with_leading_zeros_echoed_as_a_number_is_redacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``received-status=00042`` parses to 42: two digits, under ``MIN_LEN``, but with the
    zeros parsing took away they are the secret "00042".  Ordinary statuses stay."""
    monkeypatch.setenv(TOKEN_ENV, "00042")
    echoed, other, kept = trio.run(_echoed, tmp_path, ("/ps/00042", "/ps/042", "/ps/404"))
    for seen in (echoed, other):  # "042": part of the secret as sent, 42 as parsed
        assert _members(seen["envelope"]) == [{"proxy": "edge", "received_status": "[redacted]"}], (
            seen
        )
        recorded = json.dumps(seen["events"])
        assert '"received_status": "[redacted]"' in recorded, recorded
        assert '"received_status": 42' not in recorded, recorded
    assert _members(kept["envelope"]) == [{"proxy": "edge", "received_status": 404}], kept


def test_a_retry_after_holding_part_of_a_secret_is_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Retry-After: 12345678`` holds no secret as text, but its digits are part of
    "sk12345678" (``Redactor.number``, as a Proxy-Status number's); 120 is no part of it."""
    monkeypatch.setenv(TOKEN_ENV, "sk12345678")
    echoed, kept = trio.run(_echoed, tmp_path, ("/ra/12345678", "/ra/120"))
    env = echoed["envelope"]
    assert env["error"]["code"] == "REMOTE_THROTTLED", env
    assert "retry_after" not in env["evidence"], env
    assert "retry_after" not in json.dumps(echoed["events"]), echoed["events"]
    assert kept["envelope"]["evidence"]["retry_after"] == 120.0, kept
