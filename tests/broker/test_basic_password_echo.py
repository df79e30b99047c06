"""Basic injection: the password alone is a secret too.

Seed, "The error envelope must contain evidence": "Exclude secrets, full authorization headers,
private keys, and unfiltered remote bodies."  With ``inject = "basic"`` the credential value is
``user:password``; a server that decodes the header and echoes the password alone (in a
response header or the body) must not get it into the envelope or the journal.
"""

from __future__ import annotations

import base64
import json
import secrets
from pathlib import Path

import pytest
import trio

from tests.http.hostile import HostileServer, Received, Reply, scripts

from .helpers import http_target, open_broker, write_config


async def call_basic(tmp_path: Path, handler: object) -> tuple[dict, dict, str]:
    """One GET through a broker injecting ``$BASIC_CRED`` as Basic into a loopback server
    answering with ``handler``: (envelope, the result fetched whole, the events' repr)."""
    async with HostileServer.running(scripts.serve(handler)) as srv:  # type: ignore[arg-type]
        cfg = write_config(
            tmp_path, {"t": http_target(srv.url, credential="env:BASIC_CRED", inject="basic")}
        )
        async with open_broker(cfg) as broker:
            with trio.fail_after(10):
                env = await broker.call({"target": "t", "method": "GET", "path": "/"})
                fetched = await broker.fetch_result(env["invocation_id"])
            events = repr(broker.events(env["invocation_id"]))
    assert srv.requests, "the server was reached"
    return env, fetched, events


USER = "svc"


def _decode_and_echo(req: Received) -> Reply:
    auth = dict((n.lower(), v) for n, v in req.headers).get("authorization", "")
    user_pass = base64.b64decode(auth.split(" ", 1)[1]).decode()
    password = user_pass.split(":", 1)[1]
    return Reply(
        200,
        headers=[("X-Password", password), ("X-User-Pass", user_pass)],
        body=f"user={USER} password={password}".encode(),
    )


async def test_basic_password_echoed_alone_is_redacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    password = "pw-" + secrets.token_urlsafe(18)
    monkeypatch.setenv("BASIC_CRED", f"{USER}:{password}")
    env, fetched, events = await call_basic(tmp_path, _decode_and_echo)
    assert "error" not in env, env
    assert "[REDACTED]" in env["result"]["body"]
    for where, text in (
        ("envelope", json.dumps(env)),
        ("fetched", json.dumps(fetched)),
        ("events", events),
    ):
        assert password not in text, f"password echoed into the {where}"
    for path in sorted(tmp_path.glob("journal.db*")):
        assert password.encode() not in path.read_bytes(), path.name
