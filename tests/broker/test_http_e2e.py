"""The issue's classification table, row by row, through ``Broker.call`` against the hostile
HTTP server (tests/http/hostile.py), plus the adversarial rows of the seed's "Retry code must be
simple and testable": apply-then-close, 500 after commit, idempotency honoured / ignored /
reused with a changed body, the idle keep-alive race, a cross-origin 307, real TLS.

Every test asserts phase, outcome, retry and code on the envelope *and* on the durable record
(``broker.record(id)``), plus what the server did or did not receive: the outcome must follow
the evidence, never the exception (seed: "The expected outcome must always follow the
evidence").  Loopback only; every network wait is under ``trio.fail_after``.
"""

from __future__ import annotations

import base64
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.journal import JournalReader
from affidavit.secrets.vault import PASSPHRASE_ENV, Vault
from affidavit.statemachine import EventKind
from tests.http.hostile import HostileServer, Peer, Received, Reply, make_tls, scripts

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
    raw_kinds,
    write_config,
)

E = EventKind
LIMIT = 10  # seconds: the bound on every network wait in this file
POST = {"target": "api", "method": "POST", "path": "/charge", "body": '{"amount":100}'}
GET = {"target": "api", "method": "GET", "path": "/thing"}
IDEM = {"header": "Idempotency-Key", "scope": "payments.create", "retention": "1h"}


def _cfg(tmp_path: Path, url: str, **overrides: Any) -> Path:
    return write_config(tmp_path, {"api": http_target(url, **overrides)})


def _dispatched(broker: Any, iid: str) -> bool:
    return E.DISPATCH_STARTED in event_kinds(broker, iid)


# -- validation: nothing is resolved, nothing is sent -----------------------------------------


@pytest.mark.parametrize(
    ("action", "code", "field"),
    [
        ({"target": "nope", "method": "GET", "path": "/"}, "INVALID_TARGET", "target"),
        ({"target": "api", "method": "DELETE", "path": "/"}, "UNSUPPORTED_ACTION", "method"),
        (
            {"target": "api", "method": "POST", "path": "/", "body": "x" * 65},
            "PAYLOAD_LIMIT",
            "body",
        ),
        (
            {"target": "api", "method": "GET", "path": "/", "headers": {"Authorization": "x"}},
            "FORBIDDEN_HEADER",
            "headers.Authorization",
        ),
        (
            {
                "target": "api",
                "method": "GET",
                "path": "/",
                "headers": {"proxy-authorization": "x"},
            },
            "FORBIDDEN_HEADER",
            "headers.proxy-authorization",
        ),
        (
            {"target": "api", "method": "GET", "path": "/", "headers": {"Cookie": "a=b"}},
            "FORBIDDEN_HEADER",
            "headers.Cookie",
        ),
        (
            {"target": "api", "method": "GET", "path": "/", "headers": {"X-Api-Key": "mine"}},
            "FORBIDDEN_HEADER",
            "headers.X-Api-Key",
        ),
        (
            {"target": "api", "method": "GET", "path": "/?api_key=mine"},
            "FORBIDDEN_HEADER",
            "path",
        ),
    ],
)
async def test_validation_failure_is_not_attempted_and_sends_nothing(
    tmp_path: Path, token: str, action: dict[str, Any], code: str, field: str
) -> None:
    inject = "query:api_key" if "?" in action.get("path", "") else "header:X-Api-Key"
    if "headers" in action and "X-Api-Key" not in action["headers"]:
        inject = "bearer"
    async with HostileServer.running(scripts.serve(Reply(200))) as srv:
        cfg = _cfg(tmp_path, srv.url, max_body=64, inject=inject)
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                env = await broker.call(action)
            rec = assert_error(
                broker,
                env,
                phase="validation",
                outcome="not_attempted",
                retry="after_correction",
                code=code,
            )
            assert env["error"]["field"] == field
            assert rec.field == field
            assert event_kinds(broker, env["invocation_id"]) == [
                E.ACTION_ACCEPTED,
                E.PREFLIGHT_FAILED,
            ]
            assert env["evidence"]["dispatch_started"] is False
        assert srv.connections == 0


# -- credential injection ----------------------------------------------------------------------


async def test_missing_credential_is_credential_injection_not_attempted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    async with HostileServer.running(scripts.serve(Reply(200))) as srv:
        async with open_broker(_cfg(tmp_path, srv.url)) as broker:
            with trio.fail_after(LIMIT):
                env = await broker.call(GET)
            assert_error(
                broker,
                env,
                phase="credential_injection",
                outcome="not_attempted",
                retry="after_correction",
                code="CREDENTIAL_MISSING",
            )
            assert not _dispatched(broker, env["invocation_id"])
        assert srv.connections == 0


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


# -- connection setup on a fresh connection -------------------------------------------------


async def test_dns_failure_is_connection_setup_not_attempted_with_each_attempt_recorded(
    tmp_path: Path, token: str
) -> None:
    resolver = FakeResolver({})
    with custom_resolver(resolver):
        cfg = _cfg(tmp_path, "http://no-such-host.test:8080")
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                env = await broker.call(POST)
            rec = assert_error(
                broker,
                env,
                phase="connection_setup",
                outcome="not_attempted",
                retry="backoff",
                code="DNS_FAILED",
            )
    # Seed: bounded in-broker setup retries, each in the one action record, none dispatched.
    assert resolver.lookups == ["no-such-host.test", "no-such-host.test"]
    assert [a["outcome"] for a in rec.attempts] == ["not_attempted", "not_attempted"]
    assert {a["stage"] for a in rec.attempts} == {"dns"}
    assert not rec.evidence["dispatch_started"]


async def test_connection_refused_is_connection_setup_not_attempted(
    tmp_path: Path, token: str
) -> None:
    cfg = _cfg(tmp_path, f"http://127.0.0.1:{closed_port()}")
    async with open_broker(cfg) as broker:
        with trio.fail_after(LIMIT):
            env = await broker.call(POST)
        rec = assert_error(
            broker,
            env,
            phase="connection_setup",
            outcome="not_attempted",
            retry="backoff",
            code="CONNECTION_REFUSED",
        )
        assert [a["stage"] for a in rec.attempts] == ["tcp_connect", "tcp_connect"]
        assert not _dispatched(broker, env["invocation_id"])


async def test_tls_wrong_host_certificate_is_certificate_invalid_not_attempted(
    tmp_path: Path, token: str
) -> None:
    tls = make_tls(tmp_path)
    async with HostileServer.running(scripts.serve(Reply(200)), tls=tls.wrong_host) as srv:
        cfg = _cfg(tmp_path, srv.url, ca_file=tls.ca_file)
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                env = await broker.call(POST)
            rec = assert_error(
                broker,
                env,
                phase="connection_setup",
                outcome="not_attempted",
                retry="after_correction",
                code="CERTIFICATE_INVALID",
            )
            assert [a["stage"] for a in rec.attempts] == ["tls_handshake"]
            assert not _dispatched(broker, env["invocation_id"])
        assert srv.requests == []
        assert srv.tls_failures == 1


async def test_tls_with_test_ca_commits_and_records_the_peer(tmp_path: Path, token: str) -> None:
    tls = make_tls(tmp_path)
    async with HostileServer.running(
        scripts.serve(Reply(200, body=b'{"ok":true}')), tls=tls.good
    ) as srv:
        cfg = _cfg(tmp_path, srv.url, ca_file=tls.ca_file)
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                env = await broker.call(GET)
            assert_ok(broker, env)
            assert env["result"]["status"] == 200
            assert env["result"]["body"] == '{"ok":true}'
            dispatch = [
                e for e in broker.events(env["invocation_id"]) if e.kind is E.DISPATCH_STARTED
            ]
            assert dispatch[0].attrs["peer"]["verified_hostname"] == "127.0.0.1"
            assert dispatch[0].attrs["peer"]["trust"] == "ca_file"
        assert srv.requests[0].header("Authorization") == f"Bearer {token}"


# -- remote execution: dispatched, no complete result ------------------------------------------


@pytest.mark.parametrize(
    ("action", "idempotency", "retry"),
    [
        (POST, None, "reconcile"),  # no contract, not idempotent: only reconciliation can tell
        ({**GET, "method": "PUT", "body": "v"}, None, "backoff"),  # configured idempotent
        (POST, IDEM, "same_idempotency_key"),  # a declared remote contract
    ],
    ids=["post-reconcile", "idempotent-backoff", "contract-same-key"],
)
async def test_server_applies_then_closes_without_answer_is_unknown(
    tmp_path: Path, token: str, action: dict[str, Any], idempotency: Any, retry: str
) -> None:
    async with HostileServer.running(scripts.apply_then_close()) as srv:
        cfg = _cfg(tmp_path, srv.url, idempotency=idempotency)
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                env = await broker.call(action)
            rec = assert_error(
                broker,
                env,
                phase="remote_execution",
                outcome="unknown",
                retry=retry,
                code="REMOTE_OUTCOME_UNKNOWN",
            )
            assert srv.event("applied").is_set()
            assert rec.evidence["dispatch_started"] is True
            assert env["evidence"]["request_complete"] is True
            assert env["evidence"]["response_complete"] is False
            assert "result" not in env
            kinds = event_kinds(broker, env["invocation_id"])
            assert kinds.index(E.DISPATCH_STARTED) < kinds.index(E.ATTEMPT_INTERRUPTED)
            assert E.RESULT_COMMITTED not in kinds


@pytest.mark.parametrize(
    ("script", "partial"),
    [
        (scripts.cut_mid_headers(), b"text/pl"),
        (scripts.cut_mid_body(), b'{"partial":'),
        (scripts.cut_mid_body(chunked=True), b"hello"),
    ],
    ids=["mid-headers", "mid-body-content-length", "mid-body-chunked"],
)
async def test_response_cut_short_is_unknown_and_partial_body_never_returned(
    tmp_path: Path, token: str, script: Any, partial: bytes
) -> None:
    async with HostileServer.running(script) as srv, open_broker(_cfg(tmp_path, srv.url)) as broker:
        with trio.fail_after(LIMIT):
            env = await broker.call(POST)
        assert_error(
            broker,
            env,
            phase="remote_execution",
            outcome="unknown",
            retry="reconcile",
            code="REMOTE_RESULT_INCOMPLETE",
        )
        iid = env["invocation_id"]
        assert "result" not in env
        assert broker.journal.read_result(iid) is None
        assert partial.decode() not in repr(env)
        fetched = await broker.fetch_result(iid)
        assert fetched is not None
        assert fetched["error"] == env["error"] and "result" not in fetched
        assert env["evidence"]["response_complete"] is False


async def test_cut_mid_body_of_idempotent_request_allows_backoff(
    tmp_path: Path, token: str
) -> None:
    async with (
        HostileServer.running(scripts.cut_mid_body(chunked=True)) as srv,
        open_broker(_cfg(tmp_path, srv.url)) as broker,
    ):
        with trio.fail_after(LIMIT):
            env = await broker.call(GET)
        assert_error(
            broker,
            env,
            phase="remote_execution",
            outcome="unknown",
            retry="backoff",
            code="REMOTE_RESULT_INCOMPLETE",
        )
        assert "hello" not in repr(env)


async def test_100_continue_then_close_is_unknown(tmp_path: Path, token: str) -> None:
    async with HostileServer.running(scripts.continue_then_close()) as srv:
        async with open_broker(_cfg(tmp_path, srv.url)) as broker:
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
            # An interim 100 is not a final response: nothing of a result is known.
            assert "result" not in env
            assert env["evidence"]["response_complete"] is False
        assert srv.requests[0].method == "POST"


async def test_caller_timeout_after_dispatch_is_caller_cancelled_unknown(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.slow(3.0)) as srv:
        async with open_broker(_cfg(tmp_path, srv.url)) as broker:
            with trio.fail_after(LIMIT):
                env = await broker.call(POST, timeout=0.3)
            assert_error(
                broker,
                env,
                phase="remote_execution",
                outcome="unknown",
                retry="reconcile",
                code="CALLER_CANCELLED",
            )
            assert _dispatched(broker, env["invocation_id"])
        assert srv.requests[0].complete


async def test_caller_cancellation_after_dispatch_is_recorded_before_it_propagates(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.slow(3.0)) as srv:
        async with open_broker(_cfg(tmp_path, srv.url)) as broker:
            with trio.move_on_after(0.3) as scope:
                await broker.call(POST)
            assert scope.cancelled_caught
            (rec,) = broker.journal.list_actions()
            assert rec.phase.value == "remote_execution"
            assert rec.outcome.value == "unknown"
            assert rec.code is not None and rec.code.value == "CALLER_CANCELLED"
            assert rec.retry.value == "reconcile"
        assert srv.requests and srv.requests[0].method == "POST"


# -- complete remote results -----------------------------------------------------------------


async def test_complete_2xx_is_committed_without_error(tmp_path: Path, token: str) -> None:
    reply = Reply(201, headers=[("X-Request-Id", "req-42")], body=b'{"id":"pay_1"}')
    async with HostileServer.running(scripts.serve(reply)) as srv:
        async with open_broker(_cfg(tmp_path, srv.url)) as broker:
            with trio.fail_after(LIMIT):
                env = await broker.call(POST)
            rec = assert_ok(broker, env)
            assert env["result"]["status"] == 201
            assert env["result"]["body"] == '{"id":"pay_1"}'
            assert env["evidence"]["response_complete"] is True
            assert rec.evidence["dispatch_started"] is True
            stored = broker.journal.read_result(env["invocation_id"])
            assert stored is not None and stored.streams["body"] == b'{"id":"pay_1"}'
            fetched = await broker.fetch_result(env["invocation_id"])
            assert fetched is not None and fetched["result"] == env["result"]
            assert fetched["evidence"]["state"] == "delivered_committed"
        assert srv.requests[0].body == b'{"amount":100}'


@pytest.mark.parametrize("status", [401, 403])
async def test_complete_401_403_is_rejected_after_correction(
    tmp_path: Path, token: str, status: int
) -> None:
    async with (
        HostileServer.running(scripts.serve(Reply(status, body=b"no"))) as srv,
        open_broker(_cfg(tmp_path, srv.url)) as broker,
    ):
        with trio.fail_after(LIMIT):
            env = await broker.call(POST)
        assert_error(
            broker,
            env,
            phase="remote_execution",
            outcome="rejected",
            retry="after_correction",
            code="REMOTE_REJECTED",
        )
        assert env["result"]["status"] == status  # the rejection itself is the result


@pytest.mark.parametrize("status", [429, 503])
async def test_complete_429_503_with_retry_after_on_idempotent_method_is_backoff(
    tmp_path: Path, token: str, status: int
) -> None:
    reply = Reply(status, headers=[("Retry-After", "2")], body=b"slow down")
    async with (
        HostileServer.running(scripts.serve(reply)) as srv,
        open_broker(_cfg(tmp_path, srv.url)) as broker,
    ):
        with trio.fail_after(LIMIT):
            env = await broker.call(GET)
        rec = assert_error(
            broker,
            env,
            phase="remote_execution",
            outcome="rejected",
            retry="backoff",
            code="REMOTE_THROTTLED",
        )
        assert rec.retry_after == 2.0


async def test_complete_500_on_post_is_committed_and_never_backoff(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.error_after_commit(500)) as srv:
        async with open_broker(_cfg(tmp_path, srv.url)) as broker:
            with trio.fail_after(LIMIT):
                env = await broker.call(POST)
            assert_error(
                broker,
                env,
                phase="remote_execution",
                outcome="committed",
                retry="reconcile",
                code="REMOTE_ERROR",
            )
            assert env["result"]["status"] == 500
            assert env["result"]["body"] == '{"error":"after commit"}'
        assert srv.event("applied").is_set()
        assert len(srv.requests) == 1  # the broker did not retry on its own


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

            original = broker.journal.append

            async def append(event: Any, **kw: Any) -> Any:
                stored = await original(event, **kw)
                if event.kind is E.DISPATCH_STARTED and event.attrs.get("reused_connection"):
                    srv.event("reset").set()
                    await srv.event("reset.done").wait()
                    await trio.sleep(0.05)  # let the RST reach the client's socket
                return stored

            monkeypatch.setattr(broker.journal, "append", append)
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


# -- result delivery -------------------------------------------------------------------------


async def test_delivery_failure_is_result_delivery_committed_fetch_result(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"done"))) as srv:
        async with open_broker(_cfg(tmp_path, srv.url)) as broker:

            async def deliver(envelope: dict[str, Any]) -> None:
                raise BrokenPipeError("caller went away")

            with trio.fail_after(LIMIT):
                env = await broker.call(POST, deliver=deliver)
            assert_error(
                broker,
                env,
                phase="result_delivery",
                outcome="committed",
                retry="fetch_result",
                code="RESULT_DELIVERY_FAILED",
            )
            iid = env["invocation_id"]
            kinds = event_kinds(broker, iid)
            assert kinds.index(E.RESULT_COMMITTED) < kinds.index(E.RESULT_DELIVERY_FAILED)
            fetched = await broker.fetch_result(iid)
            assert fetched is not None
            assert fetched["result"]["body"] == "done"
            assert fetched["error"]["retry"] == "fetch_result"
        assert len(srv.requests) == 1  # fetching is a read, never a re-execution


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


async def test_idempotency_key_honoured_retry_reuses_invocation_and_key(
    tmp_path: Path, token: str
) -> None:
    effects: Counter[str] = Counter()
    action = {**POST, "idempotency_key": "pay-key-1"}
    async with HostileServer.running(_idempotent_api(honour=True, effects=effects)) as srv:
        async with open_broker(_cfg(tmp_path, srv.url, idempotency=IDEM)) as broker:
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
    effects: Counter[str] = Counter()
    action = {**POST, "idempotency_key": "pay-key-2"}
    async with HostileServer.running(_idempotent_api(honour=False, effects=effects)) as srv:
        async with open_broker(_cfg(tmp_path, srv.url, idempotency=IDEM)) as broker:
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
    effects: Counter[str] = Counter()
    action = {**POST, "idempotency_key": "pay-key-3"}
    async with HostileServer.running(_idempotent_api(honour=True, effects=effects)) as srv:
        async with open_broker(_cfg(tmp_path, srv.url, idempotency=IDEM)) as broker:
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


async def test_no_idempotency_header_without_a_declared_contract(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(200))) as srv:
        async with open_broker(_cfg(tmp_path, srv.url)) as broker:
            with trio.fail_after(LIMIT):
                env = await broker.call(POST)
            assert_ok(broker, env)
            assert env["evidence"].get("idempotency") in (None, {})
            # A caller cannot ask for one either: the target documents no such semantics.
            with trio.fail_after(LIMIT):
                refused = await broker.call({**POST, "idempotency_key": "k"})
            assert_error(
                broker,
                refused,
                phase="validation",
                outcome="not_attempted",
                retry="after_correction",
                code="UNSUPPORTED_ACTION",
            )
        (req,) = srv.requests
        names = {n.lower() for n, _ in req.headers}
        assert not {n for n in names if "idempotency" in n}


async def test_contract_without_caller_key_mints_and_records_one_before_dispatch(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(201))) as srv:
        async with open_broker(_cfg(tmp_path, srv.url, idempotency=IDEM)) as broker:
            with trio.fail_after(LIMIT):
                env = await broker.call(POST)
            assert_ok(broker, env)
            iid = env["invocation_id"]
            key = env["evidence"]["idempotency"]["key"]
            assert key and env["evidence"]["idempotency"]["scope"] == "payments.create"
            bound = broker.journal.find_idempotency("payments.create", key)
            assert bound is not None and bound.invocation_id == iid
            accepted = broker.events(iid)[0]
            assert accepted.kind is E.ACTION_ACCEPTED
            assert accepted.attrs["operation"]["idempotency"]["key"] == key
        assert srv.requests[0].header("Idempotency-Key") == key


# -- redirects -------------------------------------------------------------------------------


@pytest.mark.parametrize("inject", ["bearer", "header:X-Api-Key", "query:api_key"])
async def test_307_to_another_origin_does_not_forward_the_credential(
    tmp_path: Path, token: str, inject: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"elsewhere"))) as other:
        location = f"{other.url}/landing"
        async with HostileServer.running(scripts.redirect(location, 307)) as srv:
            cfg = _cfg(
                tmp_path,
                srv.url,
                follow_redirects=True,
                inject=inject,
                redirect_origins=[other.url],
            )
            async with open_broker(cfg) as broker:
                with trio.fail_after(LIMIT):
                    env = await broker.call(GET)
                assert_ok(broker, env)
                assert env["result"]["status"] == 200
                assert env["result"]["body"] == "elsewhere"
            first: Received = srv.requests[0]
            seen_first = repr(first.headers) + first.target
            assert token in seen_first  # the target's own origin did get the credential
        (hop2,) = other.requests
        assert hop2.target == "/landing"
        leaked = repr(hop2.headers) + hop2.target + hop2.body.decode()
        assert token not in leaked
        assert hop2.header("Authorization") is None
        assert hop2.header("X-Api-Key") is None


async def test_307_to_an_origin_not_allowed_is_not_followed(tmp_path: Path, token: str) -> None:
    """The redirect target is re-validated against the target's allow-list: an origin the
    config does not list gets no request at all; the complete 307 is the recorded result."""
    async with HostileServer.running(scripts.serve(Reply(200, body=b"elsewhere"))) as other:
        async with HostileServer.running(scripts.redirect(f"{other.url}/landing", 307)) as srv:
            cfg = _cfg(tmp_path, srv.url, follow_redirects=True)
            async with open_broker(cfg) as broker:
                with trio.fail_after(LIMIT):
                    env = await broker.call(GET)
                assert_ok(broker, env)
                assert env["result"]["status"] == 307
        assert other.requests == []


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
        cfg = _cfg(tmp_path, f"http://api.test:{srv.port}")

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
                "api": http_target(f"http://api.test:{srv.port}"),
                "other": http_target("http://other.test:1"),
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


# -- redaction -------------------------------------------------------------------------------


@pytest.mark.parametrize("inject", ["bearer", "basic", "query:api_key"])
async def test_echoed_credential_is_redacted_in_stored_and_returned_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inject: str
) -> None:
    secret = "user:s3cr3t-" + base64.b16encode(os.urandom(8)).decode()
    monkeypatch.setenv(TOKEN_ENV, secret if inject == "basic" else secret.replace(":", "-"))
    value = os.environ[TOKEN_ENV]

    def echo(req: Received) -> Reply:
        # A misbehaving API that echoes the whole request back: headers, target and body.
        text = "\n".join(f"{n}: {v}" for n, v in req.headers) + "\n" + req.target
        return Reply(
            200,
            headers=[("X-Echo", req.header("Authorization") or req.target)],
            body=text.encode(),
        )

    async with (
        HostileServer.running(scripts.serve(echo)) as srv,
        open_broker(_cfg(tmp_path, srv.url, inject=inject)) as broker,
    ):
        with trio.fail_after(LIMIT):
            env = await broker.call(GET)
        assert_ok(broker, env)
        stored = broker.journal.read_result(env["invocation_id"])
        assert stored is not None
    raw = value.encode()
    forms = {raw, base64.b64encode(raw)}
    assert "[REDACTED]" in env["result"]["body"]
    for form in forms:
        assert form.decode() not in repr(env)
        assert form not in stored.streams["body"]
        assert form.decode() not in repr(stored.summary)
    # the server really did echo it, so the absence above is redaction, not luck
    echoed = srv.requests[0]
    assert any(value in v or base64.b64encode(raw).decode() in v for _, v in echoed.headers) or (
        "api_key=" in echoed.target
    )


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
