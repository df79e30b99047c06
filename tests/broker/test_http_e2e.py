"""The issue's classification table through ``Broker.call`` against the hostile HTTP server
(tests/http/hostile.py), as one table: each row is a situation the broker meets, the envelope
it must answer (phase, outcome, retry, code, or a committed success) with what the durable
record and the envelope must show besides, and what the server did or did not receive — named
after the seed rule it proves.  The multi-step stories of the same rules (a vault unlocked
between two calls, the idempotency-key retries, the pooled-connection race, the config edited
mid-call, the durable dispatch boundary) are in tests/broker/test_http_stories.py.

Every row asserts the four enums on the envelope *and* on the durable record
(``broker.record(id)``, see ``assert_error``): the outcome must follow the evidence, never the
exception (seed: "The expected outcome must always follow the evidence").  Loopback only; every
network wait is under ``trio.fail_after`` (tests/broker/http_rows.py runs a row).
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import trio

from affidavit.adapters.http.classify import NOT_CONDITIONAL
from affidavit.statemachine import EventKind, envelope_schema
from tests.http.hostile import Received, Reply, scripts

from .helpers import assert_error
from .http_rows import GET, IDEM, LIMIT, POST, Got, Row, Seen, Then, run_row

E = EventKind


# -- what each row checks besides the four enums ----------------------------------------------


def _refused_unsent(field: str) -> Then:
    """Validation stopped the action: the field to fix, nothing after PREFLIGHT_FAILED."""

    async def then(s: Seen) -> None:
        assert s.env["error"]["field"] == field
        assert s.rec.field == field
        assert s.kinds == [E.ACTION_ACCEPTED, E.PREFLIGHT_FAILED]
        assert s.env["evidence"]["dispatch_started"] is False

    return then


async def _not_dispatched(s: Seen) -> None:
    assert not s.dispatched


async def _dispatched(s: Seen) -> None:
    assert s.dispatched


def _setup_attempts(*stages: str) -> Then:
    """Seed: bounded in-broker setup retries, each in the one action record, none dispatched."""

    async def then(s: Seen) -> None:
        assert [a["stage"] for a in s.rec.attempts] == list(stages)
        assert [a["outcome"] for a in s.rec.attempts] == ["not_attempted"] * len(stages)
        assert not s.dispatched and not s.rec.evidence["dispatch_started"]

    return then


async def _dns_looked_up_twice(s: Seen) -> None:
    await _setup_attempts("dns", "dns")(s)
    assert s.resolver is not None
    assert s.resolver.lookups == ["no-such-host.test", "no-such-host.test"]


async def _tls_peer_bound(s: Seen) -> None:
    assert s.env["result"]["status"] == 200
    assert s.env["result"]["body"] == '{"ok":true}'
    peer = s.first_dispatch()["peer"]
    assert peer["verified_hostname"] == "127.0.0.1"
    assert peer["trust"] == "ca_file"


async def _unknown_after_the_whole_request(s: Seen) -> None:
    assert s.rec.evidence["dispatch_started"] is True
    assert s.env["evidence"]["request_complete"] is True
    assert s.env["evidence"]["response_complete"] is False
    assert "result" not in s.env
    kinds = s.kinds
    assert kinds.index(E.DISPATCH_STARTED) < kinds.index(E.ATTEMPT_INTERRUPTED)
    assert E.RESULT_COMMITTED not in kinds


def _partial_never_returned(partial: bytes) -> Then:
    async def then(s: Seen) -> None:
        assert "result" not in s.env
        assert s.broker.journal.read_result(s.iid) is None
        assert partial.decode() not in repr(s.env)
        fetched = await s.broker.fetch_result(s.iid)
        assert fetched is not None
        assert fetched["error"] == s.env["error"] and "result" not in fetched
        assert s.env["evidence"]["response_complete"] is False

    return then


async def _no_final_response(s: Seen) -> None:
    # An interim 100 is not a final response: nothing of a result is known.
    assert "result" not in s.env
    assert s.env["evidence"]["response_complete"] is False


async def _committed_stored_and_fetchable(s: Seen) -> None:
    assert s.env["result"]["status"] == 201
    assert s.env["result"]["body"] == '{"id":"pay_1"}'
    assert s.env["evidence"]["response_complete"] is True
    assert s.rec.evidence["dispatch_started"] is True
    stored = s.broker.journal.read_result(s.iid)
    assert stored is not None and stored.streams["body"] == b'{"id":"pay_1"}'
    fetched = await s.broker.fetch_result(s.iid)
    assert fetched is not None and fetched["result"] == s.env["result"]
    assert fetched["evidence"]["state"] == "delivered_committed"


def _result_status(status: int, body: str | None = None) -> Then:
    async def then(s: Seen) -> None:
        assert s.env["result"]["status"] == status  # the complete response is the result
        if body is not None:
            assert s.env["result"]["body"] == body

    return then


def _not_modified(conditional: bool) -> Then:
    """A 304 is the result either way (stored, fetchable); only a conditional GET's is clean --
    to any other request the evidence says why it is no answer."""

    async def then(s: Seen) -> None:
        jsonschema.Draft202012Validator(envelope_schema()).validate(s.env)
        assert s.env["result"]["status"] == 304
        why = s.env["evidence"].get("redirect_not_followed")
        assert why == (None if conditional else {"reason": NOT_CONDITIONAL})
        fetched = await s.broker.fetch_result(s.iid)
        assert fetched is not None and fetched["result"]["status"] == 304

    return then


def _sent_with(name: str | None) -> Got:
    def received(s: Seen) -> None:
        (got,) = s.server.requests
        names = {n.lower() for n, _ in got.headers}
        assert (name in names) if name is not None else not names & {"if-none-match"}

    return received


async def _retry_after_recorded(s: Seen) -> None:
    assert s.rec.retry_after == 2.0


async def _stored_then_delivery_failed(s: Seen) -> None:
    kinds = s.kinds
    assert kinds.index(E.RESULT_COMMITTED) < kinds.index(E.RESULT_DELIVERY_FAILED)
    assert s.env["error"]["retry"] == "fetch_result"
    fetched = await s.broker.fetch_result(s.iid)
    assert fetched is not None
    assert fetched["result"]["body"] == "done"
    # The fetch delivered it -- a read, nothing sent again -- and says so after it returned.
    assert "error" not in fetched
    assert [e.kind for e in s.broker.events(s.iid)][-2:] == [
        E.RESULT_DELIVERY_FAILED,
        E.RESULT_DELIVERED,
    ]


async def _no_key_and_none_accepted(s: Seen) -> None:
    assert s.env["evidence"].get("idempotency") in (None, {})
    # A caller cannot ask for one either: the target documents no such semantics.
    with trio.fail_after(LIMIT):
        refused = await s.broker.call({**POST, "idempotency_key": "k"})
    assert_error(
        s.broker,
        refused,
        phase="validation",
        outcome="not_attempted",
        retry="after_correction",
        code="UNSUPPORTED_ACTION",
    )


async def _key_minted_and_bound_before_dispatch(s: Seen) -> None:
    key = s.env["evidence"]["idempotency"]["key"]
    assert key and s.env["evidence"]["idempotency"]["scope"] == "payments.create"
    bound = s.broker.journal.find_idempotency("payments.create", key)
    assert bound is not None and bound.invocation_id == s.iid
    accepted = s.broker.events(s.iid)[0]
    assert accepted.kind is E.ACTION_ACCEPTED
    assert accepted.attrs["operation"]["idempotency"]["key"] == key


async def _echo_redacted(s: Seen) -> None:
    assert "[REDACTED]" in s.env["result"]["body"]
    stored = s.broker.journal.read_result(s.iid)
    assert stored is not None
    raw = s.token.encode()
    for form in (raw, base64.b64encode(raw)):
        assert form.decode() not in repr(s.env)
        assert form not in stored.streams["body"]
        assert form.decode() not in repr(stored.summary)


def _echo(req: Received) -> Reply:
    # A misbehaving API that echoes the whole request back: headers, target and body.
    text = "\n".join(f"{n}: {v}" for n, v in req.headers) + "\n" + req.target
    return Reply(
        200, headers=[("X-Echo", req.header("Authorization") or req.target)], body=text.encode()
    )


# -- what the server received -------------------------------------------------------------------


def _no_connection(s: Seen) -> None:
    assert s.server.connections == 0


def _no_request_and_one_tls_failure(s: Seen) -> None:
    assert s.server.requests == []
    assert s.server.tls_failures == 1


def _bearer_sent(s: Seen) -> None:
    assert s.server.requests[0].header("Authorization") == f"Bearer {s.token}"


def _applied(s: Seen) -> None:
    assert s.server.event("applied").is_set()


def _post_received(s: Seen) -> None:
    assert s.server.requests[0].method == "POST"


def _whole_request_received(s: Seen) -> None:
    assert s.server.requests[0].complete


def _body_received(s: Seen) -> None:
    assert s.server.requests[0].body == b'{"amount":100}'


def _applied_once_never_retried(s: Seen) -> None:
    assert s.server.event("applied").is_set()
    assert len(s.server.requests) == 1  # the broker did not retry on its own


def _one_request(s: Seen) -> None:
    assert len(s.server.requests) == 1  # fetching is a read, never a re-execution


def _no_idempotency_header(s: Seen) -> None:
    (req,) = s.server.requests
    names = {n.lower() for n, _ in req.headers}
    assert not {n for n in names if "idempotency" in n}


def _minted_key_sent(s: Seen) -> None:
    key = s.env["evidence"]["idempotency"]["key"]
    assert s.server.requests[0].header("Idempotency-Key") == key


def _credential_stays_at_its_origin(s: Seen) -> None:
    first: Received = s.server.requests[0]
    assert s.token in repr(first.headers) + first.target  # the target's own origin got it
    assert s.other is not None
    (hop2,) = s.other.requests
    assert hop2.target == "/landing"
    assert s.token not in repr(hop2.headers) + hop2.target + hop2.body.decode()
    assert hop2.header("Authorization") is None
    assert hop2.header("X-Api-Key") is None


def _other_origin_untouched(s: Seen) -> None:
    assert s.other is not None and s.other.requests == []


def _echo_really_sent(s: Seen) -> None:
    # the server really did echo it, so the absence above is redaction, not luck
    echoed = s.server.requests[0]
    b64 = base64.b64encode(s.token.encode()).decode()
    assert any(s.token in v or b64 in v for _, v in echoed.headers) or ("api_key=" in echoed.target)


# -- the table ----------------------------------------------------------------------------------


def _preflight(action: dict[str, Any], inject: str, code: str, field: str) -> Row:
    return Row(
        ("validation", "not_attempted", "after_correction", code),
        action={"target": "api", **action},
        target={"max_body": 64, "inject": inject},
        then=_refused_unsent(field),
        received=_no_connection,
    )


def _unknown(retry: str, code: str) -> tuple[str, str, str, str]:
    return ("remote_execution", "unknown", retry, code)


ROWS: dict[str, Row] = {
    # Seed, "Validation and credential injection finish before dispatch": reject incorrectly
    # specified targets, unsupported methods, oversized payloads and forbidden header
    # overrides before resolving the host or touching the secret, with the field to fix.
    "preflight-invalid-target-sends-nothing": _preflight(
        {"target": "nope", "method": "GET", "path": "/"},
        "header:X-Api-Key",
        "INVALID_TARGET",
        "target",
    ),
    "preflight-unsupported-method-sends-nothing": _preflight(
        {"method": "DELETE", "path": "/"}, "header:X-Api-Key", "UNSUPPORTED_ACTION", "method"
    ),
    "preflight-oversized-payload-sends-nothing": _preflight(
        {"method": "POST", "path": "/", "body": "x" * 65},
        "header:X-Api-Key",
        "PAYLOAD_LIMIT",
        "body",
    ),
    "preflight-forbidden-authorization-override-sends-nothing": _preflight(
        {"method": "GET", "path": "/", "headers": {"Authorization": "x"}},
        "bearer",
        "FORBIDDEN_HEADER",
        "headers.Authorization",
    ),
    "preflight-forbidden-proxy-authorization-sends-nothing": _preflight(
        {"method": "GET", "path": "/", "headers": {"proxy-authorization": "x"}},
        "bearer",
        "FORBIDDEN_HEADER",
        "headers.proxy-authorization",
    ),
    "preflight-forbidden-cookie-sends-nothing": _preflight(
        {"method": "GET", "path": "/", "headers": {"Cookie": "a=b"}},
        "bearer",
        "FORBIDDEN_HEADER",
        "headers.Cookie",
    ),
    "preflight-override-of-the-injected-header-sends-nothing": _preflight(
        {"method": "GET", "path": "/", "headers": {"X-Api-Key": "mine"}},
        "header:X-Api-Key",
        "FORBIDDEN_HEADER",
        "headers.X-Api-Key",
    ),
    "preflight-override-of-the-injected-query-sends-nothing": _preflight(
        {"method": "GET", "path": "/?api_key=mine"}, "query:api_key", "FORBIDDEN_HEADER", "path"
    ),
    # Issue 9: CGI/WSGI/nginx read X_Api_Key as X-Api-Key; frameworks fold a query name's case.
    "preflight-underscore-spelling-of-the-injected-header-sends-nothing": _preflight(
        {"method": "GET", "path": "/", "headers": {"X_Api_Key": "mine"}},
        "header:X-Api-Key",
        "FORBIDDEN_HEADER",
        "headers.X_Api_Key",
    ),
    "preflight-other-case-of-the-injected-query-sends-nothing": _preflight(
        {"method": "GET", "path": "/?API_KEY=mine"}, "query:api_key", "FORBIDDEN_HEADER", "path"
    ),
    # Seed: "Credential injection still belongs to the preflight stage ... missing credentials".
    "missing-credential-is-credential-injection-not-attempted": Row(
        ("credential_injection", "not_attempted", "after_correction", "CREDENTIAL_MISSING"),
        action=GET,
        token="missing",
        then=_not_dispatched,
        received=_no_connection,
    ),
    # Seed, "connection_setup": "name resolution, routing, TCP, TLS ... failed before dispatch".
    "dns-failure-is-setup-not-attempted-each-attempt-recorded": Row(
        ("connection_setup", "not_attempted", "backoff", "DNS_FAILED"),
        url="http://no-such-host.test:8080",
        target={"trust_cleartext": True},
        names={},
        then=_dns_looked_up_twice,
    ),
    "connection-refused-is-setup-not-attempted": Row(
        ("connection_setup", "not_attempted", "backoff", "CONNECTION_REFUSED"),
        url="closed",
        then=_setup_attempts("tcp_connect", "tcp_connect"),
    ),
    "tls-wrong-host-certificate-is-setup-not-attempted": Row(
        ("connection_setup", "not_attempted", "after_correction", "CERTIFICATE_INVALID"),
        tls="wrong_host",
        then=_setup_attempts("tls_handshake"),
        received=_no_request_and_one_tls_failure,
    ),
    # Seed: "for resumed sessions and connection pools the verified identity of the other side
    # must be bound to the action record".
    "tls-with-the-test-ca-commits-and-binds-the-verified-peer": Row(
        None,
        scripts.serve(Reply(200, body=b'{"ok":true}')),
        action=GET,
        tls="good",
        then=_tls_peer_bound,
        received=_bearer_sent,
    ),
    # Seed, "Dispatch shifts the burden of proof": the server applied the effect and closed.
    "applied-then-closed-post-is-unknown-reconcile": Row(
        _unknown("reconcile", "REMOTE_OUTCOME_UNKNOWN"),
        scripts.apply_then_close(),
        then=_unknown_after_the_whole_request,
        received=_applied,
    ),
    "applied-then-closed-idempotent-method-is-unknown-backoff": Row(
        _unknown("backoff", "REMOTE_OUTCOME_UNKNOWN"),
        scripts.apply_then_close(),
        action={**GET, "method": "PUT", "body": "v"},
        then=_unknown_after_the_whole_request,
        received=_applied,
    ),
    "applied-then-closed-under-a-key-contract-is-unknown-same-key": Row(
        _unknown("same_idempotency_key", "REMOTE_OUTCOME_UNKNOWN"),
        scripts.apply_then_close(),
        target={"idempotency": IDEM},
        then=_unknown_after_the_whole_request,
        received=_applied,
    ),
    # Seed: "Only a complete final response ... can move the outcome out of unknown".
    "response-cut-mid-headers-is-unknown-partial-never-returned": Row(
        _unknown("reconcile", "REMOTE_RESULT_INCOMPLETE"),
        scripts.cut_mid_headers(),
        then=_partial_never_returned(b"text/pl"),
    ),
    "response-cut-mid-content-length-body-is-unknown-partial-never-returned": Row(
        _unknown("reconcile", "REMOTE_RESULT_INCOMPLETE"),
        scripts.cut_mid_body(),
        then=_partial_never_returned(b'{"partial":'),
    ),
    "response-cut-mid-chunked-body-is-unknown-partial-never-returned": Row(
        _unknown("reconcile", "REMOTE_RESULT_INCOMPLETE"),
        scripts.cut_mid_body(chunked=True),
        then=_partial_never_returned(b"hello"),
    ),
    # A close-delimited body ended by a TCP FIN: no protocol-specific close proves it whole.
    "close-delimited-body-ended-by-a-fin-is-unknown-partial-never-returned": Row(
        _unknown("reconcile", "REMOTE_RESULT_INCOMPLETE"),
        scripts.close_delimited_cut(),
        then=_partial_never_returned(b'{"items":[1,2'),
    ),
    "response-cut-mid-body-of-an-idempotent-request-allows-backoff": Row(
        _unknown("backoff", "REMOTE_RESULT_INCOMPLETE"),
        scripts.cut_mid_body(chunked=True),
        action=GET,
        then=_partial_never_returned(b"hello"),
    ),
    # Seed: "100 Continue ... says nothing about the final result of the application".
    "100-continue-then-close-is-unknown": Row(
        _unknown("reconcile", "REMOTE_OUTCOME_UNKNOWN"),
        scripts.continue_then_close(),
        then=_no_final_response,
        received=_post_received,
    ),
    # Seed: "Other 1xx responses likewise leave the call in progress": interim 102 and 103
    # followed by nothing are no result; followed by a complete final response, that response
    # (never an interim one) is the result.
    "102-and-103-then-close-is-unknown": Row(
        _unknown("reconcile", "REMOTE_OUTCOME_UNKNOWN"),
        scripts.informational_then((102, 103)),
        then=_no_final_response,
        received=_whole_request_received,
    ),
    "103-then-a-complete-201-is-the-201": Row(
        None,
        scripts.informational_then((103,), Reply(201, body=b'{"id":"pay_1"}')),
        then=_committed_stored_and_fetchable,
        received=_body_received,
    ),
    # Seed: the outcome may remain unknown "even if the local error says timeout".
    "caller-timeout-after-dispatch-is-caller-cancelled-unknown": Row(
        _unknown("reconcile", "CALLER_CANCELLED"),
        scripts.slow(3.0),
        timeout=0.3,
        then=_dispatched,
        received=_whole_request_received,
    ),
    # The caller's deadline in the middle of a framed body: the cause is the caller's, the
    # outcome still unknown, and the partial body is no result.
    "caller-timeout-mid-body-is-caller-cancelled-unknown": Row(
        _unknown("reconcile", "CALLER_CANCELLED"),
        scripts.stall_mid_body(b'{"id":"pay_'),
        timeout=0.5,
        then=_partial_never_returned(b'{"id":"pay_'),
        received=_whole_request_received,
    ),
    # Seed: "committed does not mean success"; rejected and committed are never merged.
    "complete-2xx-is-committed-stored-and-fetchable": Row(
        None,
        scripts.serve(Reply(201, headers=[("X-Request-Id", "req-42")], body=b'{"id":"pay_1"}')),
        then=_committed_stored_and_fetchable,
        received=_body_received,
    ),
    **{
        f"complete-{status}-is-rejected-after-correction": Row(
            ("remote_execution", "rejected", "after_correction", "REMOTE_REJECTED"),
            scripts.serve(Reply(status, body=b"no")),
            then=_result_status(status),
        )
        for status in (401, 403)
    },
    **{
        f"complete-{status}-with-retry-after-on-an-idempotent-method-is-backoff": Row(
            ("remote_execution", "rejected", "backoff", "REMOTE_THROTTLED"),
            scripts.serve(Reply(status, headers=[("Retry-After", "2")], body=b"slow down")),
            action=GET,
            then=_retry_after_recorded,
        )
        for status in (429, 503)
    },
    # RFC 9110 §15.4.5: a 304 answers a conditional GET or HEAD -- the caller's copy is
    # current; to any other request it is no answer, so never a clean result.
    **{
        f"304-to-a-get-with-{header.lower()}-is-a-clean-result": Row(
            None,
            scripts.serve(Reply(304)),
            action={**GET, "headers": {header: value}},
            then=_not_modified(conditional=True),
            received=_sent_with(header.lower()),
        )
        for header, value in (
            ("If-None-Match", '"v1"'),
            ("If-Modified-Since", "Sun, 06 Nov 1994 08:49:37 GMT"),
        )
    },
    "304-to-an-unconditional-get-is-committed-and-no-success": Row(
        ("remote_execution", "committed", "reconcile", "REMOTE_REDIRECTED"),
        scripts.serve(Reply(304)),
        action=GET,
        then=_not_modified(conditional=False),
        received=_sent_with(None),
    ),
    "304-to-a-post-with-if-none-match-is-committed-and-no-success": Row(
        ("remote_execution", "committed", "reconcile", "REMOTE_REDIRECTED"),
        scripts.serve(Reply(304)),
        action={**POST, "headers": {"If-None-Match": '"v1"'}},
        then=_not_modified(conditional=False),
        received=_sent_with("if-none-match"),
    ),
    # Seed: "A complete 500 is known ... Do not turn every 5xx into permission to retry a POST".
    "complete-500-on-post-is-committed-never-backoff": Row(
        ("remote_execution", "committed", "reconcile", "REMOTE_ERROR"),
        scripts.error_after_commit(500),
        then=_result_status(500, '{"error":"after commit"}'),
        received=_applied_once_never_retried,
    ),
    # Seed, "A result delivery error must not repeat execution".
    "delivery-failure-is-result-delivery-committed-fetch-result": Row(
        ("result_delivery", "committed", "fetch_result", "RESULT_DELIVERY_FAILED"),
        scripts.serve(Reply(200, body=b"done")),
        deliver_fails=True,
        then=_stored_then_delivery_failed,
        received=_one_request,
    ),
    # Seed: "Do not silently add an idempotency header for targets that do not document its
    # semantics"; "Before dispatch, the broker must persist ... the idempotency key".
    "no-idempotency-header-without-a-declared-contract": Row(
        None, then=_no_key_and_none_accepted, received=_no_idempotency_header
    ),
    "contract-without-caller-key-mints-and-records-one-before-dispatch": Row(
        None,
        scripts.serve(Reply(201)),
        target={"idempotency": IDEM},
        then=_key_minted_and_bound_before_dispatch,
        received=_minted_key_sent,
    ),
    # Redirects (docs/configuration.md): the credential never leaves the target's origin, and
    # another origin is followed only when the target lists it in redirect_origins.
    **{
        f"307-to-another-origin-does-not-forward-the-{inject.split(':')[0]}-credential": Row(
            None,
            action=GET,
            target={"follow_redirects": True, "inject": inject},
            redirect=307,
            other_allowed=True,
            then=_result_status(200, "elsewhere"),
            received=_credential_stays_at_its_origin,
        )
        for inject in ("bearer", "header:X-Api-Key", "query:api_key")
    },
    "307-to-an-origin-not-allowed-is-not-followed": Row(
        ("remote_execution", "committed", "reconcile", "REMOTE_REDIRECTED"),
        action=GET,
        target={"follow_redirects": True},
        redirect=307,
        then=_result_status(307),
        received=_other_origin_untouched,
    ),
    # Seed: "Exclude secrets ... from the envelope": an API echoing the credential back.
    **{
        f"echoed-{inject.split(':')[0]}-credential-is-redacted-in-stored-and-returned-result": Row(
            None,
            scripts.serve(_echo),
            action=GET,
            target={"inject": inject},
            token="user:s3cr3t" if inject == "basic" else "user-s3cr3t",
            then=_echo_redacted,
            received=_echo_really_sent,
        )
        for inject in ("bearer", "basic", "query:api_key")
    },
}


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
async def test_the_outcome_follows_the_evidence(
    row: Row, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await run_row(row, tmp_path, monkeypatch)
