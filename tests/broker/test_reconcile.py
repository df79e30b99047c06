"""Reconciliation an operator can actually run, through the Python API against a scripted
payments API (issue 12).

Seed: "There are only three safe paths out of ``unknown`` ... Query the remote state by a
stable identifier, reconcile it, and decide whether a new action is needed"; "A second observer
may attach a reconciliation result, but it must not rewrite the original attempt as though no
dispatch had taken place"; "An operator is entitled to determine the outcome of an unknown
attempt after inspecting the remote system, but that fact must not be passed off as a response
the broker received on the original connection."
"""

from __future__ import annotations

import contextlib
import gzip
import json
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.approvals import Operator, OperatorError
from affidavit.protocols.http.reconcile import AMBIGUOUS, parse_condition, verdict
from affidavit.reconcile import service
from affidavit.statemachine import Event, EventKind
from tests.http.hostile import HostileServer, Peer, Reply, Script, scripts

from .approvalkit import OPS, OPS_UID, PaymentsApi, reconcile_target, verify_ok
from .helpers import event_kinds, http_target, open_broker, write_config

E = EventKind


@contextlib.asynccontextmanager
async def payments(
    tmp_path: Path, settle: str | None = "0s", api: PaymentsApi | None = None
) -> AsyncIterator[tuple[HostileServer, Broker]]:
    """The payments API and a broker whose target ``api`` declares its reconciliation query
    (``settle``: its window; None, the default)."""
    async with HostileServer.running((api or PaymentsApi()).script) as srv:
        path = write_config(tmp_path, reconcile_target(srv.url, settle=settle))
        with path.open("a") as f:
            f.write(f"[service]\noperator_uids = [{OPS_UID}]\n")
        async with open_broker(path) as b:
            yield srv, b


async def _unknown(b: Broker, key: str, **body: bool) -> str:
    """A POST whose connection dropped after the request: unknown, reconcile."""
    action = {
        "target": "api",
        "method": "POST",
        "path": "/v1/charges",
        "body": json.dumps(body or {"drop": True}),
        "idempotency_key": key,
    }
    env = await b.call(action)
    assert env["error"]["outcome"] == "unknown", env["error"]
    return str(env["invocation_id"])


def _kept_original(b: Broker, iid: str) -> None:
    """The original attempt as recorded, then the reconciliation after it -- nothing rewritten."""
    kinds = event_kinds(b, iid)
    assert kinds.index(E.DISPATCH_STARTED) < kinds.index(E.ATTEMPT_INTERRUPTED)
    assert kinds[-1] is E.RECONCILED
    rec = b.record(iid)
    assert rec is not None and rec.attempts[0]["outcome"] == "unknown"
    assert rec.evidence["dispatch_started"] is True


@pytest.mark.parametrize(
    ("body", "outcome", "state", "retry", "status"),
    [
        ({"drop": True}, "committed", "reconciled_committed", "never", 200),
        ({"refuse": True}, "rejected", "reconciled_rejected", "after_correction", 404),
    ],
    ids=["applied-then-dropped-is-committed", "dropped-unapplied-is-rejected"],
)
async def test_an_unknown_post_is_reconciled_by_its_query(
    tmp_path: Path,
    token: str,
    body: dict[str, bool],
    outcome: str,
    state: str,
    retry: str,
    status: int,
) -> None:
    async with payments(tmp_path) as (srv, b):
        iid = await _unknown(b, "pay/1?x=y&z", **body)
        answer = await b.reconcile(iid, query=True)
        assert answer["reconciled"] is True
        env = answer["envelope"]
        assert env["evidence"]["outcome"] == outcome
        assert env["evidence"]["state"] == state
        assert env["evidence"]["source"] == "remote_query"
        if outcome == "committed":
            assert "error" not in env
        else:
            assert (env["error"]["code"], env["error"]["retry"]) == ("REMOTE_REJECTED", retry)
        query = answer["query"]
        rc = env["evidence"]["reconciliation"]
        assert (rc["source"], rc["observer"], rc["query_invocation"]) == (
            "remote_query",
            query["invocation_id"],
            query["invocation_id"],
        )
        assert rc["matched"] == f"status:{status} and json:/key={{idempotency_key}}"
        # The query is an invocation of its own, linked to the one it reconciled.
        accepted = b.events(query["invocation_id"])[0]
        assert accepted.attrs["link"] == {"reconciles": iid}
        _kept_original(b, iid)
        verify_ok(b)
        assert b._engine.recorder._writing == {}  # nothing kept for the reconciling task
    # The key is data in the query's URL, percent-encoded: its "/", "?" and "&" change nothing.
    post, get = srv.requests
    assert (post.method, get.method) == ("POST", "GET")
    assert get.target == "/v1/charges?idempotency_key=pay%2F1%3Fx%3Dy%26z"
    query_of = urllib.parse.parse_qs(urllib.parse.urlsplit(get.target).query)
    assert query_of == {"idempotency_key": ["pay/1?x=y&z"]}
    assert get.header("authorization") == f"Bearer {token}"  # through the same engine


@pytest.mark.parametrize(
    ("key", "code", "reason"),
    [
        ("drop", "REMOTE_OUTCOME_UNKNOWN", "no complete, authoritative result"),
        ("boom", "REMOTE_ERROR", "matches neither"),
    ],
    ids=["the-query-itself-fails", "an-answer-matching-neither"],
)
async def test_a_query_that_settles_nothing_leaves_the_invocation_unknown(
    tmp_path: Path, token: str, key: str, code: str, reason: str
) -> None:
    async with payments(tmp_path) as (srv, b):
        iid = await _unknown(b, key)
        answer = await b.reconcile(iid, query=True)
        assert answer["reconciled"] is False
        env = answer["envelope"]
        assert (env["error"]["code"], env["error"]["outcome"], env["error"]["retry"]) == (
            "REMOTE_OUTCOME_UNKNOWN",
            "unknown",
            "same_idempotency_key",
        )
        query_id = answer["query"]["invocation_id"]
        assert answer["query"]["error"]["code"] == code  # its evidence, on its own record
        [tried] = env["evidence"]["reconcile_queries"]
        assert tried["query_invocation"] == query_id and reason in tried["reason"]
        kinds = event_kinds(b, iid)
        assert E.RECONCILED not in kinds and kinds[-1] is E.RECONCILE_INCONCLUSIVE
        verify_ok(b)
    assert [r.method for r in srv.requests] == ["POST", "GET"]


def _closed_at(b: Broker, iid: str) -> float:
    """When the attempt was closed: its last event before any reconciliation."""
    closing = [e for e in b.events(iid) if e.kind is not E.RECONCILE_INCONCLUSIVE]
    assert closing[-1].at is not None
    return closing[-1].at


async def test_an_absent_finding_within_the_settle_window_settles_nothing(
    tmp_path: Path, token: str
) -> None:
    """The hazard: the broker gave up on a charge the remote still held in its queue.  A query
    right then finds it absent; the remote applies it a moment later.  Within the target's
    settle window (the default, 60 s) the absent finding settles nothing -- the record says
    when a query may -- and the later query finds the charge present and settles it."""
    api = PaymentsApi()
    async with payments(tmp_path, settle=None, api=api) as (_, b):
        iid = await _unknown(b, "pay/late", late=True)
        early = await b.reconcile(iid, query=True)
        assert early["query"]["evidence"]["status"] == 404  # the query did find it absent
        assert early["reconciled"] is False
        env = early["envelope"]
        assert env["error"]["outcome"] == "unknown"
        assert env["error"]["retry"] == "same_idempotency_key"  # the key contract's, as before
        [tried] = env["evidence"]["reconcile_queries"]
        assert tried["query_invocation"] == early["query"]["invocation_id"]
        assert tried["not_before"] == pytest.approx(_closed_at(b, iid) + 60.0)
        assert "within the target's settle window (60s)" in tried["reason"]
        assert "query again after" in tried["reason"]
        assert event_kinds(b, iid)[-1] is E.RECONCILE_INCONCLUSIVE

        api.release_late()  # the queued charge is applied after all
        late = await b.reconcile(iid, query=True)
        assert late["reconciled"] is True
        assert late["envelope"]["evidence"]["state"] == "reconciled_committed"
        _kept_original(b, iid)
        verify_ok(b)
    assert api.applied == ["pay/late"]


async def test_an_absent_finding_settles_once_the_window_has_passed(
    tmp_path: Path, token: str
) -> None:
    async with payments(tmp_path, settle="0.4s") as (srv, b):
        iid = await _unknown(b, "pay/2", refuse=True)
        early = await b.reconcile(iid, query=True)
        assert early["reconciled"] is False
        [tried] = early["envelope"]["evidence"]["reconcile_queries"]
        assert tried["not_before"] == pytest.approx(_closed_at(b, iid) + 0.4)
        with trio.fail_after(5):
            await trio.sleep(max(0.0, tried["not_before"] - time.time()) + 0.05)
        answer = await b.reconcile(iid, query=True)
        assert answer["reconciled"] is True
        env = answer["envelope"]
        assert env["evidence"]["state"] == "reconciled_rejected"
        assert env["evidence"]["reconcile_queries"] == [tried]  # the early one stays on record
        _kept_original(b, iid)
        verify_ok(b)
    assert [r.method for r in srv.requests] == ["POST", "GET", "GET"]


async def test_an_operator_attests_and_the_note_and_identity_are_kept(
    tmp_path: Path, token: str
) -> None:
    async with payments(tmp_path) as (srv, b):
        iid = await _unknown(b, "ch-9")
        note = "found ch_1 for key ch-9 in the dashboard"
        answer = await b.reconcile(iid, attest="committed", note=note, operator=OPS)
        env = answer["envelope"]
        assert "error" not in env
        rc = env["evidence"]["reconciliation"]
        assert (rc["source"], rc["outcome"], rc["note"]) == (
            "operator_attested",
            "committed",
            note,
        )
        assert rc["observer"] == f"operator:uid={OPS_UID}(ops)"
        assert rc["operator"] == {"uid": OPS_UID, "name": "ops", "via": "embedded"}
        assert env["evidence"]["source"] == "operator_attested"  # not a remote_response
        _kept_original(b, iid)
        verify_ok(b)
        assert b._engine.recorder._writing == {}  # nothing kept for the attesting task
        # Settled once: a second attestation, or a query, finds nothing unknown.
        for again in (
            b.reconcile(iid, attest="rejected", note="no", operator=OPS),
            b.reconcile(iid, query=True),
        ):
            with pytest.raises(OperatorError) as info:
                await again
            assert info.value.code == "NOT_UNKNOWN"
    assert len(srv.requests) == 1  # attesting sent nothing


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        (
            {"attest": "committed", "note": "trust me", "operator": Operator(1, 1, ())},
            "NOT_AN_OPERATOR",
        ),
        ({"attest": "committed", "note": " ", "operator": OPS}, "NOTE_REQUIRED"),
        ({"attest": "not_attempted", "note": "x", "operator": OPS}, "BAD_OUTCOME"),
        ({"query": True, "attest": "committed"}, "BAD_REQUEST"),
    ],
    ids=["not-an-operator", "no-note", "not-attempted-is-no-finding", "both-forms"],
)
async def test_an_attestation_is_refused_unless_an_operator_says_what_they_found(
    tmp_path: Path, token: str, kwargs: dict[str, Any], code: str
) -> None:
    async with payments(tmp_path) as (_srv, b):
        iid = await _unknown(b, "ch-10")
        with pytest.raises(OperatorError) as info:
            await b.reconcile(iid, **kwargs)
        assert info.value.code == code
        if code in ("NOTE_REQUIRED", "BAD_OUTCOME"):  # bad input: the field to fix
            assert info.value.field == ("note" if code == "NOTE_REQUIRED" else "attest")
        rec = b.record(iid)
        assert rec is not None and rec.outcome.value == "unknown"
        assert E.RECONCILED not in event_kinds(b, iid)


async def test_only_an_unknown_outcome_is_reconciled(tmp_path: Path, token: str) -> None:
    async with payments(tmp_path) as (_srv, b):
        env = await b.call({"target": "api", "method": "POST", "path": "/v1/charges", "body": "{}"})
        assert "error" not in env  # committed: nothing to reconcile
        with pytest.raises(OperatorError) as info:
            await b.reconcile(env["invocation_id"], attest="rejected", note="x", operator=OPS)
        assert info.value.code == "NOT_UNKNOWN"
        with pytest.raises(OperatorError) as info:
            await b.reconcile("act_nope", query=True)
        assert (info.value.code, info.value.status) == ("NO_SUCH_INVOCATION", 404)


class RetriedCharges:
    """``POST /v1/charges``: the first is closed unanswered and unapplied (the invocation is
    unknown); the next -- the same-key retry -- is applied at once (``retry_applied``) and
    answered once the test sets ``release_retry``.  The reconciliation query reads whether
    the key was applied at once (``query_read``) and answers once ``release_query`` is set:
    what it says is what it read then."""

    def __init__(self) -> None:
        self.applied: list[str] = []
        self.posts = 0

    async def script(self, peer: Peer) -> None:
        server = peer.server
        while True:
            req = await peer.read_request()
            if req is None:
                return
            if req.method == "POST":
                self.posts += 1
                if self.posts == 1:
                    await peer.close()
                    return
                self.applied.append(req.header("idempotency-key") or "")
                server.event("retry_applied").set()
                await server.event("release_retry").wait()
                await peer.respond(Reply(201, body=b'{"id": "ch_1"}'))
                continue
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(req.target).query)
            key = query.get("idempotency_key", [""])[0]
            status = 200 if key in self.applied else 404
            server.event("query_read").set()
            await server.event("release_query").wait()
            await peer.respond(Reply(status, body=json.dumps({"key": key}).encode()))


async def test_a_query_that_read_the_remote_before_a_retry_dispatched_does_not_close_the_retry(
    tmp_path: Path, token: str
) -> None:
    # Seed, "A second observer may attach a reconciliation result": about the attempt it
    # observed.  The query read "absent" before a same-key retry took the lease and applied
    # the charge; appended while the retry is in flight, that observation would close the
    # retry's attempt as rejected -- a false record that invites a duplicate charge.
    api = RetriedCharges()
    charge = {
        "target": "api",
        "method": "POST",
        "path": "/v1/charges",
        "body": json.dumps({"amount": 5}),
        "idempotency_key": "charge-1",
    }
    async with (
        HostileServer.running(api.script) as srv,
        open_broker(write_config(tmp_path, reconcile_target(srv.url))) as b,
    ):
        first = await b.call(charge)
        assert first["error"]["outcome"] == "unknown", first
        iid = first["invocation_id"]
        out: dict[str, Any] = {}

        async def reconcile() -> None:
            out["answer"] = await b.reconcile(iid, query=True)
            out["refused"] = out["answer"]["refused"]

        async def retry() -> None:
            out["retry"] = await b.call(charge)

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(reconcile)
                await srv.event("query_read").wait()  # the query saw the charge absent
                nursery.start_soon(retry)
                await srv.event("retry_applied").wait()  # the retry dispatched; it applied
                srv.event("release_query").set()
                while "refused" not in out:
                    await trio.sleep(0.01)
                srv.event("release_retry").set()
        await b.settled()  # the calls' deliveries, queued (for the sync reads)
        record = b.record(iid)
        assert record is not None
        kinds = event_kinds(b, iid)
        verify_ok(b)
    assert api.applied == ["charge-1"]
    # The retry was in flight when the query's answer came: the service says so, and records
    # nothing of an observation the record has moved past -- answered, not raised (the query
    # ran): not reconciled, the query's own envelope named.
    refused, answer = out["refused"], out["answer"]
    assert refused["code"] == "STILL_RUNNING", refused["message"]
    assert answer["reconciled"] is False
    assert answer["query"]["invocation_id"] != iid
    assert answer["envelope"]["invocation_id"] == iid
    assert E.RECONCILED not in kinds and E.RECONCILE_INCONCLUSIVE not in kinds, kinds
    # The retry's own complete response is the record's, and its caller's answer.
    env = out["retry"]
    assert "error" not in env, env
    assert json.loads(env["result"]["body"]) == {"id": "ch_1"}
    assert record.state == "delivered_committed", (record.state, kinds)
    assert [(a["generation"], a["outcome"]) for a in record.attempts] == [
        (0, "unknown"),
        (1, "committed"),
    ]


@pytest.mark.parametrize(
    ("retry_ended", "code", "state"),
    [(False, "STILL_RUNNING", "retry_pending"), (True, "RETRIED_MEANWHILE", "retry_setup_failed")],
    ids=["the-retry-runs", "the-retry-ended-unknown"],
)
async def test_an_attestation_of_a_record_retried_after_it_was_read_is_refused(
    tmp_path: Path,
    token: str,
    monkeypatch: pytest.MonkeyPatch,
    retry_ended: bool,
    code: str,
    state: str,
) -> None:
    # An operator's attestation has the query's shape: the record is read, then RECONCILED is
    # appended.  Another worker's same-key retry takes the lease in between (on a shared
    # journal, another host): what the operator found is about the attempt before it.
    async with payments(tmp_path) as (srv, b):
        iid = await _unknown(b, "ch-11")
        read = service._unknown_at_rest

        async def then_retried(engine: Any, invocation_id: str, *, operator: bool) -> Any:
            record = await read(engine, invocation_id, operator=operator)
            lease = await b.journal.acquire_lease(invocation_id, "worker-2", 60.0)
            if retry_ended:  # the retry stopped in setup: unknown and at rest again
                setup = {"code": "CONNECTION_REFUSED", "stage": "tcp_connect"}
                ended = Event(E.SETUP_FAILED, iid, {**setup, "generation": lease.generation})
                await b.journal.append(ended, barrier=True)
            return record

        monkeypatch.setattr(service, "_unknown_at_rest", then_retried)
        with pytest.raises(OperatorError) as info:
            await b.reconcile(iid, attest="rejected", note="not in the dashboard", operator=OPS)
        assert info.value.code == code, info.value.message
        rec = b.record(iid)
        assert rec is not None and (rec.state, rec.outcome.value) == (state, "unknown")
        assert E.RECONCILED not in event_kinds(b, iid)
        verify_ok(b)
    assert len(srv.requests) == 1  # attesting sent nothing


class _Clocked:
    """An engine as ``service._too_soon`` sees it: the events' times, the journal's kind and
    the lease margin."""

    def __init__(self, shared: bool, ended: float, observed: float) -> None:
        from types import SimpleNamespace

        at = {"orig": [(E.ATTEMPT_INTERRUPTED, ended)], "query": [(E.DISPATCH_STARTED, observed)]}
        self.settings = SimpleNamespace(lease_margin=30.0)
        self.journal = SimpleNamespace(
            backend=SimpleNamespace(shared=shared),
            events=lambda iid: [SimpleNamespace(kind=k, at=t, attrs={}) for k, t in at[iid]],
        )


@pytest.mark.parametrize(
    ("shared", "gap", "believed"),
    [(False, 60.0, True), (False, 59.9, False), (True, 60.0, False), (True, 89.9, False),
     (True, 90.0, True)],
)  # fmt: skip
def test_a_shared_journal_widens_the_settle_window_by_the_lease_margin(
    shared: bool, gap: float, believed: bool
) -> None:
    """The attempt's end and the query's dispatch are wall-clock times two brokers may have
    written: on a shared journal an absent finding is believed only ``lease_margin`` later
    than the settle window alone would allow (the skew the leases already allow for)."""
    engine: Any = _Clocked(shared, ended=1000.0, observed=1000.0 + gap)
    not_before, reason = service._too_soon(engine, "orig", "query", 60.0)
    assert (not_before is None) is believed
    if not believed:
        assert not_before == 1000.0 + 60.0 + (30.0 if shared else 0.0)
        assert ("lease_margin 30s" in reason) is shared


def test_a_settle_window_beyond_a_century_is_a_config_error(tmp_path: Path) -> None:
    """A window no date can end (``"999999999d"``) is refused when the config loads, naming
    the field -- not after a query was sent, by the date its answer would have named."""
    from affidavit.config import ConfigError, load_config

    path = write_config(tmp_path, reconcile_target("http://127.0.0.1:9", settle="999999999d"))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert "settle" in str(caught.value) and "100 years" in str(caught.value)


async def test_a_forward_proxys_own_404_for_the_query_settles_nothing(
    tmp_path: Path, token: str
) -> None:
    # docs/proxies.md: a plain-HTTP forward proxy may answer the lookup itself (Privoxy's 404
    # for a domain it cannot resolve) -- with ``rejected_if = "status:404"`` that answer must
    # not mark the unknown charge rejected, inviting a second one.
    async def proxy_script(peer: Peer) -> None:
        while True:
            req = await peer.read_request()
            if req is None:
                return
            if req.method == "POST":  # taken, then the connection drops: unknown
                await peer.close()
                return
            await peer.respond(Reply(404, body=b"<h1>Privoxy: no such domain</h1>"))

    async with HostileServer.running(proxy_script) as proxy:
        cfg = reconcile_target(
            "http://origin.invalid:8080", proxy=proxy.url, trust_forward_proxy=True
        )
        path = write_config(tmp_path, cfg)
        async with open_broker(path) as b:
            iid = await _unknown(b, "pay/proxy")
            answer = await b.reconcile(iid, query=True)
            assert answer["reconciled"] is False
            env = answer["envelope"]
            assert (env["error"]["outcome"], env["error"]["code"]) == (
                "unknown",
                "REMOTE_OUTCOME_UNKNOWN",
            )
            query = answer["query"]
            assert query["evidence"]["evidence_from"]["hop"] == "proxy"
            [tried] = env["evidence"]["reconcile_queries"]
            assert tried["reason"] == service.PROXY_ANSWERED
            kinds = event_kinds(b, iid)
            assert E.RECONCILED not in kinds and kinds[-1] is E.RECONCILE_INCONCLUSIVE
            verify_ok(b)
    assert [r.method for r in proxy.requests] == ["POST", "GET"]


STATUS = {"committed_if": "status:200"}


def _lookup_target(url: str, **extra: Any) -> dict[str, Any]:
    """Target ``pay`` whose query reads the body: ``{"found": "yes"}`` present, ``"no"``
    absent."""
    return {
        "pay": http_target(
            url + "/v1",
            reconcile={
                "path": "/charges/{invocation_id}",
                "committed_if": "json:/found=yes",
                "rejected_if": "json:/found=no",
                "settle": "0s",
            },
            **extra,
        )
    }


def _lookup_api(answer: Reply | Callable[[Any], Reply]) -> Script:
    """POST: taken, then the connection drops (unknown); every GET: ``answer`` (or what it
    makes of the request)."""

    async def script(peer: Peer) -> None:
        while True:
            req = await peer.read_request()
            if req is None:
                return
            if req.method == "POST":
                await peer.close()
                return
            await peer.respond(answer if isinstance(answer, Reply) else answer(req))

    return script


async def _inconclusive(b: Broker, reason: str) -> dict[str, Any]:
    """An unknown POST on ``pay``, queried once: nothing settled, for ``reason``; the query's
    envelope."""
    with trio.fail_after(10):
        env = await b.call({"target": "pay", "method": "POST", "path": "/charges", "body": "{}"})
        assert env["error"]["outcome"] == "unknown"
        iid = env["invocation_id"]
        answer = await b.reconcile(iid, query=True)
    assert answer["reconciled"] is False
    env = answer["envelope"]
    assert (env["error"]["outcome"], env["error"]["retry"]) == ("unknown", "reconcile")
    [tried] = env["evidence"]["reconcile_queries"]
    assert tried["reason"] == reason
    kinds = event_kinds(b, iid)
    assert E.RECONCILED not in kinds and kinds[-1] is E.RECONCILE_INCONCLUSIVE
    verify_ok(b)
    query: dict[str, Any] = answer["query"]
    return query


@pytest.mark.parametrize("found", ["yes", "no"], ids=["present", "absent"])
async def test_a_query_whose_gzip_body_is_cut_settles_nothing(
    tmp_path: Path, token: str, found: str
) -> None:
    # A complete 200 whose gzip lacks its CRC/length trailer: body_withheld corrupt_encoding,
    # body_truncated.  The decoded prefix parses and matches committed_if (or rejected_if,
    # which would invite a resend): neither may settle the charge.
    cut = gzip.compress(json.dumps({"found": found}).encode())[:-8]
    reply = Reply(200, headers=[("Content-Encoding", "gzip")], body=cut)
    async with (
        HostileServer.running(_lookup_api(reply)) as srv,
        open_broker(write_config(tmp_path, _lookup_target(srv.url))) as b,
    ):
        query = await _inconclusive(b, service.PARTIAL_BODY)
    assert query["result"]["body_withheld"]["reason"] == "corrupt_encoding"
    assert query["result"]["body_truncated"] is True


async def test_a_query_whose_body_is_withheld_settles_nothing_even_by_status(
    tmp_path: Path, token: str
) -> None:
    # A coding the broker cannot scan (br): nothing of the body is stored, no truncation flag
    # -- a status-only condition would match, but the answer was not received whole.
    reply = Reply(200, headers=[("Content-Encoding", "br")], body=b"\x0b\x02\x80{}\x03")
    async with HostileServer.running(_lookup_api(reply)) as srv:
        target = _lookup_target(srv.url)
        target["pay"]["reconcile"]["committed_if"] = "status:200"
        async with open_broker(write_config(tmp_path, target)) as b:
            query = await _inconclusive(b, service.PARTIAL_BODY)
    assert query["result"]["body_withheld"]["reason"] == "unsupported_content_encoding"


async def test_a_query_redirected_to_another_origin_settles_nothing(
    tmp_path: Path, token: str
) -> None:
    # The docstring: the query is on the same target, never elsewhere.  A listed
    # redirect_origins lets the broker follow the GET's 302 to origin B (without the
    # credential); B's {"found":"yes"} is not the target's answer.
    async with HostileServer.running(scripts.serve(Reply(200, body=b'{"found":"yes"}'))) as other:
        moved = Reply(302, headers=[("Location", other.url + "/anything")])
        async with HostileServer.running(_lookup_api(moved)) as srv:
            cfg = _lookup_target(srv.url, follow_redirects=True, redirect_origins=[other.url])
            async with open_broker(write_config(tmp_path, cfg)) as b:
                query = await _inconclusive(b, service.OTHER_ORIGIN)
    assert [h["origin"] for h in query["result"]["hops"]] == [srv.url, other.url]
    assert [r.header("Authorization") for r in other.requests] == [None]


def _moved_api(moved: Reply, answer: Reply) -> Script:
    """POST: taken, then the connection drops (unknown); the query's GET: ``moved`` (a 3xx to
    another path of the same origin); any other GET: ``answer``."""

    async def script(peer: Peer) -> None:
        while True:
            req = await peer.read_request()
            if req is None:
                return
            if req.method == "POST":
                await peer.close()
                return
            await peer.respond(moved if req.target.startswith("/v1/charges/") else answer)

    return script


@pytest.mark.parametrize(
    ("moved", "answer", "rules", "path"),
    [
        # A gateway's 301 to a maintenance page, whose 404 reads like the API's own not-found:
        # taken as the charge's absence, "rejected" + after_correction invites a second payment.
        (
            Reply(301, headers=[("Location", "/v1/maintenance")]),
            Reply(404, body=b'{"found":"no"}'),
            {},
            "/v1/maintenance",
        ),
        # A 302 to a login page (its query may carry a session token: never recorded), whose
        # 200 HTML page a status-only committed_if would read as the charge's presence.
        (
            Reply(302, headers=[("Location", "/v1/login?next=/v1/charges&sid=s3ss10n-t0k3n")]),
            Reply(200, headers=[("Content-Type", "text/html")], body=b"<html>Sign in</html>"),
            {"committed_if": "status:200"},
            "/v1/login",
        ),
    ],
    ids=["maintenance_404", "login_200"],
)
async def test_a_query_redirected_on_the_targets_own_origin_settles_nothing(
    tmp_path: Path,
    token: str,
    moved: Reply,
    answer: Reply,
    rules: dict[str, Any],
    path: str,
) -> None:
    # docs/design-notes.md: only an answer to the request itself decides.  The final hop is on
    # the target's origin, in its base path, with the credential -- still another resource's
    # answer, not the queried one's.
    async with HostileServer.running(_moved_api(moved, answer)) as srv:
        cfg = _lookup_target(srv.url, follow_redirects=True)
        cfg["pay"]["reconcile"].update(rules)
        async with open_broker(write_config(tmp_path, cfg)) as b:
            query = await _inconclusive(b, service.REDIRECTED.format(path=path))
    hops = query["result"]["hops"]
    assert [h["status"] for h in hops] == [moved.status, answer.status]
    assert [h.get("path") for h in hops] == [None, path]
    assert "s3ss10n" not in json.dumps(query)


def _echo_api(echo: str | None, **extra: str) -> Script:
    """POST: taken, then the connection drops (unknown); GET ``/v1/charges/ID``: 200
    ``{"id": ..., "found": "yes", **extra}`` naming ``echo``, or the ID asked for when None."""

    def answer(req: Any) -> Reply:
        asked = req.target.rpartition("/")[2]
        return Reply(200, body=json.dumps({"id": echo or asked, "found": "yes", **extra}).encode())

    return _lookup_api(answer)


@pytest.mark.parametrize(
    ("echo", "settles"), [(None, True), ("act_SOMEONE-ELSES", False)], ids=["own", "other"]
)
async def test_a_condition_compares_the_answers_echo_with_the_invocations_bound_value(
    tmp_path: Path, token: str, echo: str | None, settles: bool
) -> None:
    # An answer about another request -- another key's record, a cached page -- says nothing
    # of this one: a condition VALUE takes the path's placeholders, filled with the
    # invocation's own values and compared exactly.
    rule = ["status:200", "json:/id={invocation_id}", "json:/found=yes"]
    async with HostileServer.running(_echo_api(echo)) as srv:
        cfg = _lookup_target(srv.url)
        cfg["pay"]["reconcile"]["committed_if"] = rule
        async with open_broker(write_config(tmp_path, cfg)) as b:
            if not settles:
                await _inconclusive(b, service.NEITHER)
                return
            with trio.fail_after(10):
                env = await b.call(
                    {"target": "pay", "method": "POST", "path": "/charges", "body": "{}"}
                )
                answer = await b.reconcile(env["invocation_id"], query=True)
            assert answer["reconciled"] is True
            reconciliation = answer["envelope"]["evidence"]["reconciliation"]
            assert reconciliation["matched"] == " and ".join(rule)


async def test_an_ambiguous_condition_leaves_the_invocation_unknown_with_its_reason(
    tmp_path: Path, token: str
) -> None:
    # {"deleted": "true"}: the text comparison met json:/deleted=true (both sides matched:
    # inconclusive), the typed one does not -- which must not hand the other side a win.
    deleted = "json:/deleted=true"
    async with HostileServer.running(_echo_api(None, deleted="true")) as srv:
        cfg = _lookup_target(srv.url)
        cfg["pay"]["reconcile"]["committed_if"] = ["status:200", "json:/found=yes"]
        cfg["pay"]["reconcile"]["rejected_if"] = ["status:200", deleted]
        async with open_broker(write_config(tmp_path, cfg)) as b:
            await _inconclusive(b, AMBIGUOUS.format(condition=deleted))


@pytest.mark.parametrize(
    ("rules", "body"),
    [
        # Python's parser keeps the last "found" (no: absent, send it again), another reader
        # the first (yes: applied).
        ({}, b'{"found": "yes", "found": "no"}'),
        # A status condition must not win by the body's silence: read leniently, both sides
        # matched (inconclusive); read as "no JSON", committed_if alone would.
        ({"committed_if": "status:200"}, b'{"found": "yes", "found": "no"}'),
        ({}, b'{"found": "yes", "n": NaN}'),
        # Bodies other readers read and Python's does not (read as "no JSON", the status
        # condition alone held: committed): invalid UTF-8 in a string, a number Python gives up
        # on or reads as infinity, nesting its parser gives up on -- and no JSON at all.
        (STATUS, b'{"found": "no", "n": "\xff"}'),
        (STATUS, b'{"found": "no", "n": ' + b"9" * 5000 + b"}"),
        (STATUS, b'{"n": 1e400}'),  # found nowhere: the status alone held
        (STATUS, b'{"found": "no", "n": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
        (STATUS, b"<html>found: no</html>"),
    ],
    ids=[
        "duplicate-field",
        "duplicate-field-beside-a-status",
        "nan",
        "invalid-utf8-beside-a-status",
        "5000-digits-beside-a-status",
        "1e400-beside-a-status",
        "nested-too-deep-beside-a-status",
        "no-json-beside-a-status",
    ],
)
async def test_a_query_whose_json_readers_disagree_on_settles_nothing(
    tmp_path: Path, token: str, rules: dict[str, str], body: bytes
) -> None:
    async with HostileServer.running(_lookup_api(Reply(200, body=body))) as srv:
        target = _lookup_target(srv.url)
        target["pay"]["reconcile"].update(rules)
        async with open_broker(write_config(tmp_path, target)) as b:
            query = await _inconclusive(
                b, "the query's answer matches neither committed_if nor rejected_if"
            )
    assert query["result"]["status"] == 200


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        # The rejection needs no body: a 404 that is no JSON says what it says.
        (404, b"", "rejected"),
        (404, b"Not Found", "rejected"),
        (404, b"<html><body>404 Not Found</body></html>", "rejected"),
        (404, b'{"error": "not found", "n": "\xff"}', "rejected"),
        (200, b'{"status": "succeeded"}', "committed"),
        # The committed side would hold but for its json: condition on an unreadable body.
        (200, b'{"status": "succeeded", "status": "failed"}', None),
        (200, b"succeeded", None),
    ],
    ids=["404-empty", "404-text", "404-html", "404-invalid-utf8", "200", "200-twice", "200-text"],
)
def test_an_unreadable_body_settles_nothing_only_where_a_side_asks_it(
    status: int, body: bytes, expected: str | None
) -> None:
    rq = SimpleNamespace(
        committed_if=(parse_condition("status:200"), parse_condition("json:/status=succeeded")),
        rejected_if=(parse_condition("status:404"),),
    )
    outcome, _why = verdict(
        SimpleNamespace(reconcile=rq), {"status": status, "headers": []}, {"body": body}, {}
    )  # type: ignore[arg-type]
    assert (outcome.value if outcome else None) == expected
