"""The multi-step stories of the HTTP evidence rules through ``Broker.call`` against the hostile
HTTP server: a locked vault unlocked between two calls, a caller's cancellation, the pooled
connection's close race, the idempotency-key retries (honoured, ignored, reused with another
body), the durable dispatch boundary, the config edited mid-call, and the journal these calls
wrote.  The single-call rows are the table in tests/broker/test_http_e2e.py.

Every story asserts the envelope *and* the durable record, plus what the server did or did not
receive (seed: "The expected outcome must always follow the evidence").  Loopback only; every
network wait is under ``trio.fail_after``.
"""

from __future__ import annotations

import contextlib
import socket
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.journal import JournalReader
from affidavit.secrets.vault import PASSPHRASE_ENV, Vault
from affidavit.statemachine import EventKind
from tests.cancel import cancel_once
from tests.http.hostile import HostileServer, Peer, Reply, make_tls, scripts

from .helpers import (
    FakeResolver,
    assert_error,
    assert_ok,
    custom_resolver,
    event_kinds,
    http_target,
    open_broker,
    raw_kinds,
    write_config,
)
from .http_rows import GET, IDEM, LIMIT, POST

E = EventKind


def _cfg(tmp_path: Path, url: str, **overrides: Any) -> Path:
    return write_config(tmp_path, {"api": http_target(url, **overrides)})


def _dispatched(broker: Any, iid: str) -> bool:
    return E.DISPATCH_STARTED in event_kinds(broker, iid)


def _at_the_reused_gate(
    broker: Any, monkeypatch: pytest.MonkeyPatch, srv: HostileServer, go: str, done: str
) -> None:
    """Once a reused connection's DISPATCH_STARTED is durable -- past the pool's staleness
    check, before the request's first byte -- set the server's event ``go``, wait for ``done``,
    then 50 ms for what the server did (a reset, bytes) to reach the client's socket."""
    original = broker.journal.append

    async def append(event: Any, **kw: Any) -> Any:
        stored = await original(event, **kw)
        if event.kind is E.DISPATCH_STARTED and event.attrs.get("reused_connection"):
            srv.event(go).set()
            await srv.event(done).wait()
            await trio.sleep(0.05)
        return stored

    monkeypatch.setattr(broker.journal, "append", append)


# -- credential injection ----------------------------------------------------------------------


async def test_locked_vault_is_vault_locked_not_attempted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(PASSPHRASE_ENV, raising=False)
    vault_path = tmp_path / "test.vault"
    vault = Vault.init(vault_path, "pass phrase", n_log2=10)
    vault.unlock("pass phrase")
    vault.put("api_token", b"vault-secret-value")
    vault.lock()
    async with HostileServer.running(scripts.serve(Reply(200))) as srv:
        cfg = write_config(
            tmp_path,
            {"api": http_target(srv.url, credential="vault:api_token")},
            vault=str(vault_path),
        )
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                env = await broker.call(GET)
            assert_error(
                broker,
                env,
                phase="credential_injection",
                outcome="not_attempted",
                retry="after_correction",
                code="VAULT_LOCKED",
            )
            assert not _dispatched(broker, env["invocation_id"])
            # After the user unlocks, the same action goes through with the vault's value.
            vault.unlock("pass phrase")
            with trio.fail_after(LIMIT):
                ok = await broker.call(GET)
            assert_ok(broker, ok)
        assert srv.connections == 1
        assert srv.requests[0].header("Authorization") == "Bearer vault-secret-value"


# -- a caller's cancellation after dispatch ---------------------------------------------------


async def test_caller_cancellation_after_dispatch_is_recorded_before_it_propagates(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.slow(3.0)) as srv:
        async with open_broker(_cfg(tmp_path, srv.url)) as broker, trio.open_nursery() as n:
            # The caller gives up once the request is at the peer (not 0.3 s after the call
            # began: a loaded machine had not always sent it by then).
            with trio.CancelScope() as scope:
                n.start_soon(cancel_once, scope, lambda: srv.requests, "the request sent")
                await broker.call(POST)
            assert scope.cancelled_caught
            (rec,) = broker.journal.list_actions()
            assert rec.phase.value == "remote_execution"
            assert rec.outcome.value == "unknown"
            assert rec.code is not None and rec.code.value == "CALLER_CANCELLED"
            assert rec.retry.value == "reconcile"
        assert srv.requests and srv.requests[0].method == "POST"


async def test_caller_cancellation_before_dispatch_is_caller_cancelled_not_attempted(
    tmp_path: Path, token: str
) -> None:
    """The caller stops waiting while the TLS handshake hangs (a peer that never answers its
    ClientHello): nothing was sent, so the call ends connection setup ``not_attempted`` -- and
    its code names the cause, the caller's cancellation, not a connect timeout that never
    happened (the connect timeout is far away)."""
    async with HostileServer.running(scripts.silent()) as srv:
        url = f"https://{srv.hostport}"
        cfg = _cfg(tmp_path, url, timeout={"connect": 30, "total": 60})
        async with open_broker(cfg) as broker, trio.open_nursery() as n:
            # The caller gives up once the peer holds the connection (the handshake hangs),
            # not 0.3 s after the call began: a loaded machine may not have connected by then.
            with trio.CancelScope() as scope:
                n.start_soon(cancel_once, scope, lambda: srv.connections, "the connection")
                await broker.call(POST)
            assert scope.cancelled_caught
            (rec,) = broker.journal.list_actions()
            assert not _dispatched(broker, rec.invocation_id)
            assert rec.phase.value == "connection_setup"
            assert rec.outcome.value == "not_attempted"
            assert rec.code is not None and rec.code.value == "CALLER_CANCELLED"
        assert srv.requests == []


# -- the pooled connection race --------------------------------------------------------------


async def test_pooled_connection_reset_just_before_reuse_is_unknown(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server closes the idle keep-alive connection in the window after the pool's
    staleness check and the durable DISPATCH_STARTED, just before the request bytes: the write
    (or the read after it) fails, and the outcome is unknown — never a setup error (seed: "When
    the broker takes an existing connection, setup has already completed")."""
    async with HostileServer.running(scripts.keep_alive_then_reset("reset")) as srv:
        async with open_broker(_cfg(tmp_path, srv.url)) as broker:
            with trio.fail_after(LIMIT):
                first = await broker.call(GET)
            assert_ok(broker, first)

            _at_the_reused_gate(broker, monkeypatch, srv, "reset", "reset.done")
            with trio.fail_after(LIMIT):
                env = await broker.call(POST)
            rec = assert_error(
                broker,
                env,
                phase="remote_execution",
                outcome="unknown",
                retry="reconcile",
                code="REMOTE_OUTCOME_UNKNOWN",
            )
            dispatch = [
                e for e in broker.events(env["invocation_id"]) if e.kind is E.DISPATCH_STARTED
            ]
            assert dispatch[0].attrs["reused_connection"] is True
            assert rec.attempts[-1]["outcome"] == "unknown"
        assert srv.connections == 1  # no silent retry on a fresh connection


async def test_tls_response_sent_before_the_request_is_never_its_committed_result(
    tmp_path: Path, token: str
) -> None:
    """The origin answers A and, in the same TCP segment, sends a second response nobody asked
    for.  Its TLS record sits in the TLS layer's buffer, where neither h11 nor a poll of the
    socket sees it; the connection must not be pooled, so B is written on a fresh one and its
    answer is the one sent after it -- never the stored ``{"id":"fake"}``."""
    tls = make_tls(tmp_path)
    first = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst"
    unsolicited = b'HTTP/1.1 201 Created\r\nContent-Length: 13\r\n\r\n{"id":"fake"}'

    async def script(peer: Peer) -> None:
        await peer.read_request()
        s = peer.sock.socket
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
        await peer.send_raw(first)
        await peer.send_raw(unsolicited)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)
        await peer.read_request()  # never answered
        await trio.sleep(3)

    async with HostileServer.running(script, tls=tls.good) as srv:
        cfg = _cfg(tmp_path, srv.url, ca_file=tls.ca_file)
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                a = await broker.call(GET)
                await trio.sleep(0.2)
                b = await broker.call(POST)
            assert_ok(broker, a)
            assert_ok(broker, b)
            assert b["result"]["status"] == 200 and b["result"]["body"] == "first"
            dispatch = [
                e for e in broker.events(b["invocation_id"]) if e.kind is E.DISPATCH_STARTED
            ]
            assert dispatch[0].attrs["reused_connection"] is False
        assert srv.connections == 2


async def test_bytes_arriving_during_the_gate_are_never_the_answer_and_nothing_is_written(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pooled connection was silent at the pool's check; while DISPATCH_STARTED was being
    made durable the server sent a response.  It predates the request, so the request is not
    written; the record holds DISPATCH_STARTED, so the outcome stays ``unknown``."""
    unsolicited = b'HTTP/1.1 201 Created\r\nContent-Length: 13\r\n\r\n{"id":"fake"}'

    async def script(peer: Peer) -> None:
        await peer.read_request()
        await peer.respond(Reply(200, body=b"first"))
        await peer.server.event("gate").wait()
        await peer.send_raw(unsolicited)
        peer.server.event("sent").set()
        await peer.read_request()
        await trio.sleep(1)

    async with HostileServer.running(script) as srv:
        async with open_broker(_cfg(tmp_path, srv.url)) as broker:
            with trio.fail_after(LIMIT):
                first = await broker.call(GET)
            assert_ok(broker, first)
            _at_the_reused_gate(broker, monkeypatch, srv, "gate", "sent")
            with trio.fail_after(LIMIT):
                env = await broker.call(POST)
            assert_error(
                broker,
                env,
                phase="remote_execution",
                outcome="unknown",
                retry="reconcile",
                code="REMOTE_OUTCOME_UNKNOWN",
            )
            assert "result" not in env and "fake" not in repr(env)
        assert [r.target for r in srv.requests] == ["/thing"]  # the POST was never written


async def test_a_peer_that_speaks_first_is_never_the_answer_and_nothing_is_written(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh connection's peer sends ``201 Created`` as soon as it accepts and never reads.
    Those bytes predate the request: it is not written and the 201 is no result -- taken as
    the answer, the call was ``committed`` while the server had parsed no request at all.  The
    record holds DISPATCH_STARTED, so the outcome is ``unknown``."""
    unsolicited = b'HTTP/1.1 201 Created\r\nContent-Length: 13\r\n\r\n{"id":"fake"}'

    async def script(peer: Peer) -> None:
        await peer.send_raw(unsolicited)
        peer.server.event("sent").set()
        await peer.read_request()
        await trio.sleep(1)

    async with HostileServer.running(script) as srv:
        async with open_broker(_cfg(tmp_path, srv.url)) as broker:
            original = broker.journal.append

            async def append(event: Any, **kw: Any) -> Any:
                stored = await original(event, **kw)
                if event.kind is E.DISPATCH_STARTED:
                    await srv.event("sent").wait()
                    await trio.sleep(0.05)  # the bytes reach the client's socket
                return stored

            monkeypatch.setattr(broker.journal, "append", append)
            with trio.fail_after(LIMIT):
                env = await broker.call(POST)
            assert_error(
                broker,
                env,
                phase="remote_execution",
                outcome="unknown",
                retry="reconcile",
                code="REMOTE_OUTCOME_UNKNOWN",
            )
            assert "result" not in env and "fake" not in repr(env)
        assert srv.requests == []  # the POST was never written


# -- idempotency -----------------------------------------------------------------------------


def _idempotent_api(*, honour: bool, effects: Counter[str]) -> Any:
    """A payments API whose first answer for a key is lost (applied, then the connection
    drops).  ``honour``: a repeat with the same key replays the stored answer; otherwise the
    server ignores the key and applies the effect again."""

    async def script(peer: Peer) -> None:
        while True:
            req = await peer.read_request()
            if req is None:
                return
            key = req.header("Idempotency-Key") or ""
            first = effects[key] == 0
            if first or not honour:
                effects[key] += 1
            if first:
                await peer.close()
                return
            await peer.respond(Reply(201, body=b'{"payment":"pay_1"}'))

    return script


@contextlib.asynccontextmanager
async def _payments(
    tmp_path: Path, *, honour: bool
) -> AsyncIterator[tuple[HostileServer, Broker, Counter[str]]]:
    """That API behind a target with a declared key contract: (server, broker, effects)."""
    effects: Counter[str] = Counter()
    script = _idempotent_api(honour=honour, effects=effects)
    async with (
        HostileServer.running(script) as srv,
        open_broker(_cfg(tmp_path, srv.url, idempotency=IDEM)) as broker,
    ):
        yield srv, broker, effects


async def test_idempotency_key_honoured_retry_reuses_invocation_and_key(
    tmp_path: Path, token: str
) -> None:
    action = {**POST, "idempotency_key": "pay-key-1"}
    async with _payments(tmp_path, honour=True) as (srv, broker, effects):
        with trio.fail_after(LIMIT):
            first = await broker.call(action)
        assert_error(
            broker,
            first,
            phase="remote_execution",
            outcome="unknown",
            retry="same_idempotency_key",
            code="REMOTE_OUTCOME_UNKNOWN",
        )
        assert first["evidence"]["idempotency"]["key"] == "pay-key-1"
        with trio.fail_after(LIMIT):
            second = await broker.call(action)
        rec = assert_ok(broker, second)
        assert second["invocation_id"] == first["invocation_id"]
        assert rec.budget.used == 2
        assert [a["outcome"] for a in rec.attempts] == ["unknown", "committed"]
        assert second["result"]["status"] == 201
    assert [r.header("Idempotency-Key") for r in srv.requests] == ["pay-key-1", "pay-key-1"]
    assert effects == Counter({"pay-key-1": 1})


async def test_idempotency_key_ignored_by_server_is_reported_as_configured_not_proven(
    tmp_path: Path, token: str
) -> None:
    """The broker cannot see that a server ignores the key: it sends the same key and records
    that the guarantee rests on the *configured* contract — it never claims it was verified."""
    action = {**POST, "idempotency_key": "pay-key-2"}
    async with _payments(tmp_path, honour=False) as (srv, broker, effects):
        with trio.fail_after(LIMIT):
            first = await broker.call(action)
            second = await broker.call(action)
        assert second["invocation_id"] == first["invocation_id"]
        assert_ok(broker, second)
        assert second["evidence"]["idempotency"]["remote_contract"] == "configured"
    assert [r.header("Idempotency-Key") for r in srv.requests] == ["pay-key-2", "pay-key-2"]
    assert effects == Counter({"pay-key-2": 2})  # the duplicate is the server's doing


async def test_idempotency_key_reused_with_changed_body_is_mismatch_and_sends_nothing(
    tmp_path: Path, token: str
) -> None:
    action = {**POST, "idempotency_key": "pay-key-3"}
    async with _payments(tmp_path, honour=True) as (srv, broker, _):
        with trio.fail_after(LIMIT):
            first = await broker.call(action)
        before = (srv.connections, len(srv.requests))
        with trio.fail_after(LIMIT):
            env = await broker.call({**action, "body": '{"amount":999}'})
        assert_error(
            broker,
            env,
            phase="validation",
            outcome="not_attempted",
            retry="after_correction",
            code="IDEMPOTENCY_MISMATCH",
        )
        assert env["error"]["field"] == "idempotency_key"
        assert env["invocation_id"] != first["invocation_id"]
        assert not _dispatched(broker, env["invocation_id"])
        # The first invocation's record is untouched: still unknown, one attempt.
        original = broker.record(first["invocation_id"])
        assert original is not None and original.outcome.value == "unknown"
        assert original.budget.used == 1
    assert (srv.connections, len(srv.requests)) == before


# -- the durable dispatch boundary --------------------------------------------------------------


async def test_dispatch_started_is_durable_before_the_first_request_byte(
    tmp_path: Path, token: str
) -> None:
    """The server, on receiving the request head, reads the journal file through its own
    read-only SQLite connection: DISPATCH_STARTED must already be on disk, on a fresh and on a
    pooled connection alike (seed: "Before the first handoff to the transport, append
    dispatch_started")."""
    db = tmp_path / "journal.db"
    seen: list[list[str]] = []

    async def script(peer: Peer) -> None:
        while True:
            rec = await peer.read_head()
            if rec is None:
                return
            seen.append(raw_kinds(db))
            await peer.read_body(rec)
            await peer.respond(Reply(200, body=b"ok"))

    async with HostileServer.running(script) as srv, open_broker(_cfg(tmp_path, srv.url)) as broker:
        with trio.fail_after(LIMIT):
            a = await broker.call(POST)
            b = await broker.call(POST)
        assert_ok(broker, a)
        assert_ok(broker, b)
        dispatch_b = [e for e in broker.events(b["invocation_id"]) if e.kind is E.DISPATCH_STARTED]
        assert dispatch_b[0].attrs["reused_connection"] is True
    assert srv.connections == 1
    assert [k.count("DISPATCH_STARTED") for k in seen] == [1, 2]
    # ... and nothing after it was needed for that proof: the response did not exist yet.
    assert "REMOTE_RESPONSE_COMPLETE" not in seen[0]


# -- the config snapshot ---------------------------------------------------------------------


def _rewrite(cfg: Path, old: str, new: str) -> None:
    text = cfg.read_text(encoding="utf-8")
    assert old in text
    cfg.write_text(text.replace(old, new), encoding="utf-8")


async def test_config_changed_between_validation_and_dispatch_is_refused_unsent(
    tmp_path: Path, token: str
) -> None:
    """The config file is edited while the broker resolves the host (after validation, before
    the write): the gate re-checks the bound snapshot and refuses — validation/not_attempted,
    CONFIG_CHANGED — rather than silently running the new definition."""
    async with HostileServer.running(scripts.serve(Reply(200))) as srv:
        cfg = _cfg(tmp_path, f"http://api.test:{srv.port}", trust_cleartext=True)

        async def edit(_name: str) -> None:
            _rewrite(cfg, '"POST", "PUT"', '"POST", "PUT", "DELETE"')

        with custom_resolver(FakeResolver({"api.test": "127.0.0.1"}, on_lookup=edit)):
            async with open_broker(cfg) as broker:
                with trio.fail_after(LIMIT):
                    env = await broker.call(POST)
                assert_error(
                    broker,
                    env,
                    phase="validation",
                    outcome="not_attempted",
                    retry="after_correction",
                    code="CONFIG_CHANGED",
                )
                # The config path an operator looks at, like every other field path.
                assert env["error"]["field"] == "targets.api"
                kinds = event_kinds(broker, env["invocation_id"])
                assert E.PREFLIGHT_VALIDATED in kinds
                assert E.DISPATCH_STARTED not in kinds
        assert srv.requests == []


async def test_config_edit_elsewhere_does_not_change_the_bound_target(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(200))) as srv:
        cfg = write_config(
            tmp_path,
            {
                "api": http_target(f"http://api.test:{srv.port}", trust_cleartext=True),
                "other": http_target("http://other.test:1", trust_cleartext=True),
            },
        )

        async def edit(_name: str) -> None:
            _rewrite(cfg, "http://other.test:1", "http://other.test:2")

        with custom_resolver(FakeResolver({"api.test": "127.0.0.1"}, on_lookup=edit)):
            async with open_broker(cfg) as broker:
                with trio.fail_after(LIMIT):
                    env = await broker.call(POST)
                assert_ok(broker, env)
        assert len(srv.requests) == 1


# -- sanity: the journal the broker wrote verifies ---------------------------------------------


async def test_journal_written_by_these_calls_verifies(tmp_path: Path, token: str) -> None:
    async with (
        HostileServer.running(scripts.apply_then_close()) as srv,
        open_broker(_cfg(tmp_path, srv.url)) as broker,
    ):
        with trio.fail_after(LIMIT):
            await broker.call(POST)
            await broker.call(GET)
    with JournalReader.open(tmp_path / "journal.db") as reader:
        assert reader.verify().ok
