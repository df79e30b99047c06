"""How one row of the HTTP classification table (tests/broker/test_http_e2e.py) is run: the
situation's peers (the hostile server, a second origin for redirects, TLS with the test CA, a
fake resolver, a closed port), the broker on a fresh config and journal, one ``Broker.call``, the
four enums asserted on the envelope *and* the durable record, then the row's own checks — the
envelope and record while the broker is open, what the servers received once they stopped.

Real time, not trio's fake clock: the journal's writer runs in a worker thread, during which an
autojumping clock would fire the timeouts.
"""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.statemachine import EventKind, Record
from tests.http.hostile import HostileServer, Reply, Script, make_tls, scripts

from .helpers import (
    TOKEN_ENV,
    FakeResolver,
    assert_error,
    assert_ok,
    closed_port,
    custom_resolver,
    event_kinds,
    http_target,
    open_broker,
    write_config,
)

__all__ = ["GET", "IDEM", "LIMIT", "POST", "Got", "Row", "Seen", "Then", "run_row"]

E = EventKind
LIMIT = 10  # seconds: the bound on every network wait of a row or story
POST = {"target": "api", "method": "POST", "path": "/charge", "body": '{"amount":100}'}
GET = {"target": "api", "method": "GET", "path": "/thing"}
IDEM = {"header": "Idempotency-Key", "scope": "payments.create", "retention": "1h"}


@dataclass
class Seen:
    """One row's run: the envelope, the durable record behind it, and the peers."""

    env: dict[str, Any]
    rec: Record
    broker: Broker
    srv: HostileServer | None
    other: HostileServer | None
    resolver: FakeResolver | None
    token: str

    @property
    def iid(self) -> str:
        return str(self.env["invocation_id"])

    @property
    def kinds(self) -> list[EventKind]:
        return event_kinds(self.broker, self.iid)

    @property
    def dispatched(self) -> bool:
        return E.DISPATCH_STARTED in self.kinds

    def first_dispatch(self) -> Mapping[str, Any]:
        return next(e.attrs for e in self.broker.events(self.iid) if e.kind is E.DISPATCH_STARTED)

    @property
    def server(self) -> HostileServer:
        assert self.srv is not None
        return self.srv


Then = Callable[[Seen], Awaitable[None]]
"""More about the envelope and the record, checked while the broker is open."""
Got = Callable[[Seen], None]
"""What the server(s) received, checked after they stopped."""


async def _nothing_more(seen: Seen) -> None:
    return None


def _nothing_received(seen: Seen) -> None:
    return None


@dataclass(frozen=True)
class Row:
    error: tuple[str, str, str, str] | None
    """(phase, outcome, retry, code) on the envelope and the record; None: committed success"""
    script: Script | None = None
    """the server's behaviour (default: 200 to everything); ignored when ``url`` is given"""
    action: Mapping[str, Any] = field(default_factory=lambda: POST)
    target: Mapping[str, Any] = field(default_factory=dict)
    """overrides of ``http_target``'s test defaults"""
    url: str | None = None
    """no server: ``"closed"`` (a loopback port nobody listens on) or a URL to resolve"""
    names: Mapping[str, str] | None = None
    """resolve through a FakeResolver knowing these names (None: the system resolver)"""
    tls: str | None = None
    """serve TLS with the test CA's ``good`` or ``wrong_host`` certificate"""
    redirect: int | None = None
    """the server redirects with this status to a second server's /landing"""
    other_allowed: bool = False
    """the second server's origin is in the target's redirect_origins"""
    token: str = "fresh"
    """the credential: a fresh bearer token, ``"missing"``, or ``"user:…"``/``"user-…"``"""
    timeout: float | None = None
    deliver_fails: bool = False
    then: Then = _nothing_more
    received: Got = _nothing_received


def _set_token(kind: str, monkeypatch: pytest.MonkeyPatch) -> str:
    if kind == "missing":
        monkeypatch.delenv(TOKEN_ENV, raising=False)
        return ""
    if kind == "fresh":
        value = "tok-" + secrets.token_urlsafe(24)
    else:  # "user:s3cr3t" / "user-s3cr3t": a recognisable secret with a random tail
        value = kind + "-" + base64.b16encode(os.urandom(8)).decode()
    monkeypatch.setenv(TOKEN_ENV, value)
    return value


async def _deliver_fails(envelope: dict[str, Any]) -> None:
    raise BrokenPipeError("caller went away")


async def run_row(row: Row, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run ``row``: set up its peers, call once, assert the enums, then its own checks."""
    token = _set_token(row.token, monkeypatch)
    target = dict(row.target)
    async with contextlib.AsyncExitStack() as peers:
        other = srv = resolver = None
        if row.redirect is not None:
            elsewhere = scripts.serve(Reply(200, body=b"elsewhere"))
            other = await peers.enter_async_context(HostileServer.running(elsewhere))
            if row.other_allowed:
                target["redirect_origins"] = [other.url]
        if row.url is None:
            script = row.script or scripts.serve(Reply(200))
            if other is not None:
                script = scripts.redirect(f"{other.url}/landing", row.redirect)
            tls = make_tls(tmp_path) if row.tls else None
            if tls is not None:
                target["ca_file"] = tls.ca_file
            cert = getattr(tls, row.tls) if tls is not None and row.tls else None
            srv = await peers.enter_async_context(HostileServer.running(script, tls=cert))
            url = srv.url
        else:
            url = f"http://127.0.0.1:{closed_port()}" if row.url == "closed" else row.url
        if row.names is not None:
            resolver = peers.enter_context(custom_resolver(FakeResolver(row.names)))
        cfg = write_config(tmp_path, {"api": http_target(url, **target)})
        async with open_broker(cfg) as broker:
            deliver = _deliver_fails if row.deliver_fails else None
            with trio.fail_after(LIMIT):
                env = await broker.call(row.action, timeout=row.timeout, deliver=deliver)
            if row.error is None:
                rec = assert_ok(broker, env)
            else:
                phase, outcome, retry, code = row.error
                rec = assert_error(
                    broker, env, phase=phase, outcome=outcome, retry=retry, code=code
                )
            seen = Seen(env, rec, broker, srv, other, resolver, token)
            with trio.fail_after(LIMIT):
                await row.then(seen)
    row.received(seen)
