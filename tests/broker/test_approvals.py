"""Human approval bound to the request fingerprint, through the Python API against a scripted
HTTP server (issue 12).

Seed, "Validation and credential injection finish before dispatch": "Before approval, bind the
normalized target, the credential version, the resolved injection method, and the request
fingerprint to the invocation. ... The broker must confirm the fingerprint of the upcoming
dispatch and re-check it immediately before the write.  A mismatch yields validation/
not_attempted and does not permit sending a new request under the old approval."

Each test asserts the envelope, the durable record and what the server received -- and that
``journal verify`` still passes.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trustme

from affidavit.api.broker import Broker
from affidavit.approvals import Operator, OperatorError
from affidavit.engine import CallControl
from affidavit.journal.sealing import BrokerKey
from affidavit.schema import canonical_json
from affidavit.statemachine import EventKind
from tests.http.hostile import HostileServer, Reply, make_tls, scripts

from .approvalkit import (
    OPS,
    OPS_UID,
    approval_config,
    dispatched_stale,
    reseal_accepted,
    verify_ok,
)
from .helpers import (
    TOKEN_ENV,
    GateStall,
    assert_error,
    assert_ok,
    assert_redirected,
    event_kinds,
    open_broker,
)

E = EventKind
OK = Reply(200, body=b'{"ok": true}')
CHARGE = {"target": "api", "method": "POST", "path": "/v1/charges", "body": '{"amount": 5}'}
LIMIT = 20
STALE_FIRST = (
    "The request, its credential or its target's configuration changed after approval; "
    "nothing was sent under the old approval."
)
STALE_RETRY = (
    "The request, its credential or its target's configuration changed after approval; "
    "this retry sent nothing; an earlier attempt's outcome stands."
)
EXPIRED_RETRY = (
    "The approval window ran out before the request was dispatched; "
    "this retry sent nothing; an earlier attempt's outcome stands."
)


async def _pending(broker: Broker, count: int = 1) -> list[dict[str, Any]]:
    """Wait (bounded) until ``count`` requests wait for a decision."""
    with trio.fail_after(LIMIT):
        while len(broker.approvals()) < count:
            await trio.sleep(0.02)
    return broker.approvals()


async def _approved_with_caller_gone(broker: Broker) -> str:
    """A request answered APPROVAL_PENDING (its caller goes away), then approved."""
    env = await broker.call(CHARGE)
    assert env["error"]["code"] == "APPROVAL_PENDING"
    await broker.approve(env["invocation_id"], operator=OPS)
    return str(env["invocation_id"])


async def _decided_while_waiting(
    broker: Broker, action: dict[str, Any], decide: Callable[[dict[str, Any]], Awaitable[Any]]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Call ``action`` -- its caller waits -- and once it waits for a decision, run
    ``decide(the approval as listed)``; return the caller's envelope and that approval."""
    got: dict[str, Any] = {}

    async def caller() -> None:
        got["env"] = await broker.call(action)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(caller)
        [waiting] = await _pending(broker)
        await decide(waiting)
    return got["env"], waiting


async def _approved_while_waiting(broker: Broker, action: dict[str, Any]) -> dict[str, Any]:
    """``_decided_while_waiting`` with OPS granting it: the caller's envelope."""

    async def approve(waiting: dict[str, Any]) -> None:
        await broker.approve(waiting["invocation_id"], operator=OPS)

    env, _ = await _decided_while_waiting(broker, action, approve)
    return env


async def test_an_approved_request_is_sent_once_by_its_waiting_caller(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(OK)) as srv:
        cfg = approval_config(tmp_path, srv.url, approval={"methods": ["POST"], "wait": "20s"})
        async with open_broker(cfg) as b:

            async def approve(waiting: dict[str, Any]) -> None:
                assert srv.requests == []  # nothing leaves before the yes
                # What the operator is shown: what, where, which credential by name -- no value.
                assert waiting["request"]["method"] == "POST"
                assert waiting["request"]["url"] == f"{srv.url}/v1/charges"
                assert waiting["request"]["body"] == '{"amount": 5}'
                assert waiting["credential"] == "env:AFFIDAVIT_TEST_TOKEN"
                assert waiting["requester"] == {"uid": os.getuid()}
                assert token not in json.dumps(waiting)
                decided = await b.approve(waiting["invocation_id"], note="amount ok", operator=OPS)
                assert decided["approval"] == "granted" and decided["note"] == "amount ok"

            env, waiting = await _decided_while_waiting(b, CHARGE, approve)
            rec = assert_ok(b, env)
            # A GET on the same target needs no approval: only POST was listed.
            plain = await b.call({"target": "api", "method": "GET", "path": "/v1/balance"})
            assert_ok(b, plain)
            assert E.APPROVAL_REQUESTED not in event_kinds(b, plain["invocation_id"])
            kinds = event_kinds(b, env["invocation_id"])
            seen = json.dumps([env, [e.attrs for e in b.events(env["invocation_id"])]])
            verify_ok(b)
    assert [r.method for r in srv.requests] == ["POST", "GET"]
    assert srv.requests[0].header("authorization") == f"Bearer {token}"
    assert kinds[:6] == [
        E.ACTION_ACCEPTED,
        E.PREFLIGHT_VALIDATED,
        E.APPROVAL_REQUESTED,
        E.APPROVAL_GRANTED,
        E.DISPATCH_LEASE_ACQUIRED,
        E.CREDENTIAL_AUTHORIZED,
    ]
    assert kinds.count(E.DISPATCH_STARTED) == 1
    approval = rec.evidence["approval"]
    assert approval["operator"] == {
        "uid": OPS_UID,
        "name": "ops",
        "via": "embedded",
        "admitted": {"uid": OPS_UID},  # what admitted it, for the gate to re-check
    }
    assert approval["fingerprint"] == waiting["fingerprint"]
    # The operator saw the reference (sealed for them); the caller's evidence has none.
    assert "AFFIDAVIT_TEST_TOKEN" not in seen


async def test_a_denied_request_is_never_sent_and_says_never(tmp_path: Path, token: str) -> None:
    async with HostileServer.running(scripts.serve(OK)) as srv:
        cfg = approval_config(tmp_path, srv.url, approval={"wait": "20s"})
        async with open_broker(cfg) as b:

            async def deny(waiting: dict[str, Any]) -> None:
                await b.deny(waiting["invocation_id"], note="not this week", operator=OPS)

            env, waiting = await _decided_while_waiting(b, CHARGE, deny)
            rec = assert_error(
                b,
                env,
                phase="credential_injection",
                outcome="not_attempted",
                retry="never",
                code="APPROVAL_DENIED",
            )
            assert rec.evidence["approval"]["note"] == "not this week"
            assert b._engine.recorder._writing == {}  # nothing kept for the deciding task
            with pytest.raises(OperatorError) as info:  # decided once, for good
                await b.approve(waiting["invocation_id"], operator=OPS)
            assert info.value.code == "NOT_PENDING"
            verify_ok(b)
    assert srv.requests == []


async def test_no_decision_within_wait_is_approval_pending_and_nothing_is_sent(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(OK)) as srv:
        cfg = approval_config(tmp_path, srv.url)  # "always": wait 0s
        async with open_broker(cfg) as b:
            env = await b.call(CHARGE)
            err = env["error"]
            assert (err["code"], err["phase"], err["outcome"], err["retry"]) == (
                "APPROVAL_PENDING",
                "credential_injection",
                "not_attempted",
                "fetch_result",
            )
            fetched = await b.fetch_result(env["invocation_id"])
            assert fetched is not None and fetched["error"]["code"] == "APPROVAL_PENDING"
            assert [a["invocation_id"] for a in b.approvals()] == [env["invocation_id"]]
    assert srv.requests == []


async def test_an_approval_after_its_expiry_is_refused_and_recorded_expired(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(OK)) as srv:
        cfg = approval_config(tmp_path, srv.url, approval={"ttl": "1s"})
        async with open_broker(cfg) as b:
            env = await b.call(CHARGE)
            await trio.sleep(1.1)
            with pytest.raises(OperatorError) as info:
                await b.approve(env["invocation_id"], operator=OPS)
            assert (info.value.code, info.value.status) == ("APPROVAL_EXPIRED", 409)
            fetched = await b.fetch_result(env["invocation_id"])
            assert fetched is not None
            assert_error(
                b,
                fetched,
                phase="validation",
                outcome="not_attempted",
                retry="after_correction",
                code="APPROVAL_EXPIRED",
            )
            assert b.approvals() == []
            verify_ok(b)
    assert srv.requests == []


async def test_only_an_operator_decides_and_never_on_their_own_request(
    tmp_path: Path, token: str
) -> None:
    me = Operator.current()
    async with HostileServer.running(scripts.serve(OK)) as srv:
        # This process's uid asks and is an operator too: self-approval stays off.
        cfg = approval_config(tmp_path, srv.url, service={"operator_gids": [me.gid]})
        async with open_broker(cfg) as b:
            env = await b.call(CHARGE)
            iid = env["invocation_id"]
            stranger = Operator(OPS_UID + 1, OPS_UID + 1, ())
            for who, code in ((stranger, "NOT_AN_OPERATOR"), (me, "SELF_APPROVAL")):
                with pytest.raises(OperatorError) as info:
                    await b.approve(iid, operator=who)
                assert (info.value.code, info.value.status) == (code, 403)
            assert b.approval(iid)["approval"] == "pending"
        cfg = approval_config(
            tmp_path,
            srv.url,
            service={"operator_gids": [me.gid], "allow_self_approval": True},
            name="self.toml",
        )
        async with open_broker(cfg) as b:
            assert (await b.approve(iid, operator=me))["approval"] == "granted"
    assert srv.requests == []


async def test_an_approved_request_whose_caller_left_is_dispatched_once(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(OK)) as srv:
        cfg = approval_config(tmp_path, srv.url)
        async with open_broker(cfg) as b:
            iid = await _approved_with_caller_gone(b)
            assert await b.approvals_ready() == [iid]
            # What the daemon's dispatcher does: twice at once, one send.
            results: list[Any] = []

            async def dispatch() -> None:
                results.append(await b.dispatch_approved(iid))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(dispatch)
                nursery.start_soon(dispatch)
            assert sum(r is not None for r in results) == 1
            stored = b.record(iid)
            assert stored is not None and stored.state == "stored_committed"  # not delivered
            fetched = await b.fetch_result(iid)  # the caller comes back: a read
            assert fetched is not None
            assert_ok(b, fetched)
            assert await b.dispatch_approved(iid) is None
            verify_ok(b)
    assert len(srv.requests) == 1


async def test_an_approved_action_the_database_declines_to_read_once_stays_approved(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read of the accepted action the database declined this once (a statement timeout, a
    lock not granted: ``ReadFailed``) is raised for the next sweep -- not taken for an action
    that cannot be read, which drops the approval from the dispatcher until a restart.  One
    the broker truly cannot open is still given up (logged), as before."""
    from affidavit.journal import JournalError, ReadFailed

    async with HostileServer.running(scripts.serve(OK)) as srv:
        cfg = approval_config(tmp_path, srv.url)
        async with open_broker(cfg) as b:
            iid = await _approved_with_caller_gone(b)
            real = b.journal.payload
            failures = [ReadFailed("canceling statement due to statement timeout")]

            def payload(seq: int) -> Any:
                if failures:
                    raise failures.pop()
                return real(seq)

            monkeypatch.setattr(b.journal, "payload", payload)
            assert await b.approvals_ready() == [iid]
            with pytest.raises(ReadFailed):
                await b.dispatch_approved(iid)
            assert srv.requests == []
            assert await b.approvals_ready() == [iid]  # still watched: the next sweep
            assert await b.dispatch_approved(iid) is not None
            assert len(srv.requests) == 1
            rec = b.record(iid)
            assert rec is not None and rec.state == "stored_committed"

            other = await _approved_with_caller_gone(b)
            failures.append(JournalError("sealed blob is not a broker-key blob"))
            assert await b.approvals_ready() == [other]
            assert await b.dispatch_approved(other) is None  # not readable: given up
            assert await b.approvals_ready() == []
            verify_ok(b)
    assert len(srv.requests) == 1


async def test_a_read_declined_once_is_unread_on_every_approval_surface(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The approval view and the content download meet the same ``ReadFailed``: it is raised
    (503 JOURNAL_READ_DECLINED on every surface, ``read_failure``), never shown as a request
    "sealed to a key this broker lacks" nor as a journal that is altered (500)."""
    from affidavit.approvals import service
    from affidavit.engine import READ_DECLINED, read_failure
    from affidavit.journal import ReadFailed

    async with HostileServer.running(scripts.serve(OK)) as srv:
        cfg = approval_config(tmp_path, srv.url)
        async with open_broker(cfg) as b:
            env = await b.call({**CHARGE, "body": json.dumps({"pad": "x" * 20000})})
            iid = env["invocation_id"]
            assert env["error"]["code"] == "APPROVAL_PENDING"
            declined = ReadFailed("canceling statement due to statement timeout")

            def payload(seq: int) -> Any:
                raise declined

            monkeypatch.setattr(b.journal, "payload", payload)
            for read in (lambda: service.show(b.journal, iid),
                         lambda: service.content(b.journal, iid, "body")):  # fmt: skip
                with pytest.raises(ReadFailed):
                    read()
            status, code, message = read_failure(declined, "the pending approvals")
            assert (status, code) == (503, READ_DECLINED) and "try again" in message
            monkeypatch.undo()
            assert len(service.content(b.journal, iid, "body")) > 20000  # read again: whole
    assert srv.requests == []


async def test_a_config_reloaded_after_approval_is_not_sent_under_the_old_approval(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(OK)) as srv:
        cfg = approval_config(tmp_path, srv.url)
        async with open_broker(cfg) as b:
            iid = await _approved_with_caller_gone(b)
            # The operator approved this target as it was; now it is edited.
            text = cfg.read_text().replace("total = 5", "total = 6")
            time.sleep(0.01)  # a new mtime for the broker's re-check
            cfg.write_text(text)
            rec = await dispatched_stale(b, iid)
            assert rec.field == "approval"
            assert E.DISPATCH_STARTED not in event_kinds(b, iid)
        async with open_broker(cfg) as b:
            iid = await _approved_with_caller_gone(b)
        cfg.write_text(text.replace("total = 6", "total = 7"))
        async with open_broker(cfg) as b:
            # A broker started on another config cannot send it as approved.  An embedded one
            # does not hold the SQLite file alone (``Journal.exclusive``: only the daemon's
            # lock does): another broker on the approved config may send it, so it is left
            # approved, nothing written (review 50 item 2: it ended APPROVAL_STALE).  The
            # daemon's case (APPROVAL_STALE at once): tests/daemon/test_approvals.py; a shared
            # journal's: test_approval_not_sendable_here.
            rows = len(b.events(iid))
            assert await b.dispatch_approved(iid) is None
            record = b.record(iid)
            assert record is not None and record.state == "approved"
            assert len(b.events(iid)) == rows
            verify_ok(b)
        assert srv.requests == []
        cfg.write_text(text)  # the configuration it was approved under: sent as approved
        async with open_broker(cfg) as b:
            assert await b.dispatch_approved(iid) is not None
            record = b.record(iid)
            assert record is not None and record.state == "stored_committed", record.state
    assert len(srv.requests) == 1


async def test_a_credential_rotated_after_approval_is_approval_stale(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("first-token\n")
    secret.chmod(0o600)  # a credential file is refused if others can read it
    async with HostileServer.running(scripts.serve(OK)) as srv:
        cfg = approval_config(tmp_path, srv.url, credential=f"file:{secret}")
        async with open_broker(cfg) as b:
            iid = await _approved_with_caller_gone(b)
            secret.write_text("second-token-rotated\n")  # a new version of the credential
            await b.dispatch_approved(iid)
            fetched = await b.fetch_result(iid)
            assert fetched is not None and fetched["error"]["code"] == "APPROVAL_STALE"
            verify_ok(b)
    assert srv.requests == []


async def test_a_ca_file_edited_after_approval_is_approval_stale(
    tmp_path: Path, token: str
) -> None:
    """The target's CA file holding other bytes at the dispatch than when the approval was
    granted (its account recorded their digest) is a change of the configuration the operator
    approved: ``APPROVAL_STALE`` at ``approval``, as the gate answers every other change --
    not ``CONFIG_CHANGED`` -- and nothing is sent, even though the new content still vouches
    for the server."""
    tls = make_tls(tmp_path)
    ca = Path(tls.ca_file)
    async with HostileServer.running(scripts.serve(OK), tls=tls.good) as srv:
        cfg = approval_config(tmp_path, srv.url, ca_file=str(ca))
        async with open_broker(cfg) as b:
            iid = await _approved_with_caller_gone(b)
            ca.write_bytes(ca.read_bytes() + trustme.CA().cert_pem.bytes())  # one more CA
            with trio.fail_after(LIMIT):
                await b.dispatch_approved(iid)
            env = await b.fetch_result(iid) or {}
            rec = assert_error(
                b,
                env,
                phase="validation",
                outcome="not_attempted",
                retry="after_correction",
                code="APPROVAL_STALE",
            )
            assert rec.field == "approval" and env["error"]["field"] == "approval"
            assert rec.message == STALE_FIRST, rec.message
            # The gate's answer is the approval's; the driver's refusal stays as it happened
            # (docs/approvals.md, under the table).
            http = env["evidence"]["http"]
            assert (http["code"], http["error"], http["stage"]) == (
                "CONFIG_CHANGED",
                "ca_file_changed",
                "ca_file",
            ), http
            assert E.DISPATCH_STARTED not in event_kinds(b, iid)
            verify_ok(b)
    assert srv.requests == []


async def test_a_retry_refused_stale_over_an_edited_ca_file_claims_nothing_of_the_first(
    tmp_path: Path, token: str
) -> None:
    """An approved keyed POST the server got but never answered (unknown), its CA file then
    edited, the same key retried under the reused approval: ``APPROVAL_STALE``, the outcome
    still unknown -- and the message says this retry sent nothing, never that nothing was sent
    (the first attempt was)."""
    tls = make_tls(tmp_path)
    ca = Path(tls.ca_file)
    idem = {"header": "Idempotency-Key", "scope": "charges", "retention": "24h"}
    async with HostileServer.running(scripts.apply_then_close(), tls=tls.good) as srv:
        cfg = approval_config(
            tmp_path, srv.url, approval={"wait": "20s"}, idempotency=idem, ca_file=str(ca)
        )
        async with open_broker(cfg) as b:
            action = {**CHARGE, "idempotency_key": "charge-ca"}

            first = await _approved_while_waiting(b, action)
            assert first["error"]["outcome"] == "unknown", first
            ca.write_bytes(ca.read_bytes() + trustme.CA().cert_pem.bytes())  # one more CA
            with trio.fail_after(LIMIT):
                again = await b.call(action)
            rec = assert_error(
                b, again, phase="validation", outcome="unknown", retry="reconcile",
                code="APPROVAL_STALE",
            )  # fmt: skip
            assert again["invocation_id"] == first["invocation_id"]
            assert again["error"]["message"] == rec.message == STALE_RETRY, again
            verify_ok(b)
    assert len(srv.requests) == 1


async def test_a_retry_refused_stale_over_an_edited_config_claims_nothing_of_the_first(
    tmp_path: Path, token: str
) -> None:
    """The same at the dispatch gate's re-read of the config file: the target's settings
    edited after an approved keyed POST ended unknown, its same-key retry is refused
    ``APPROVAL_STALE`` saying only that this retry sent nothing."""
    idem = {"header": "Idempotency-Key", "scope": "charges", "retention": "24h"}
    async with HostileServer.running(scripts.apply_then_close()) as srv:
        cfg = approval_config(tmp_path, srv.url, approval={"wait": "20s"}, idempotency=idem)
        async with open_broker(cfg) as b:
            action = {**CHARGE, "idempotency_key": "charge-cfg"}

            first = await _approved_while_waiting(b, action)
            assert first["error"]["outcome"] == "unknown", first
            cfg.write_text(cfg.read_text().replace("connect = 2", "connect = 3"))
            assert "connect = 3" in cfg.read_text()
            with trio.fail_after(LIMIT):
                again = await b.call(action)
            rec = assert_error(
                b, again, phase="validation", outcome="unknown", retry="reconcile",
                code="APPROVAL_STALE",
            )  # fmt: skip
            assert again["error"]["message"] == rec.message == STALE_RETRY, again
            verify_ok(b)
    assert len(srv.requests) == 1


async def test_an_env_credential_swapped_after_approval_is_approval_stale(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ``env:`` credential's version is a keyed digest of its value: the approval names the
    value it was given for (never the value), and another value in the variable is not it."""
    async with HostileServer.running(scripts.serve(OK)) as srv:
        cfg = approval_config(tmp_path, srv.url)
        async with open_broker(cfg) as b:
            iid = await _approved_with_caller_gone(b)
            rec = b.record(iid)
            assert rec is not None
            version = rec.evidence["approval"]["version"]
            assert token not in version
            monkeypatch.setenv(TOKEN_ENV, token + "-swapped")
            await b.dispatch_approved(iid)
            fetched = await b.fetch_result(iid)
            assert fetched is not None and fetched["error"]["code"] == "APPROVAL_STALE"
            verify_ok(b)
    assert srv.requests == []


async def test_an_env_credential_keeps_its_version_across_a_restart(
    tmp_path: Path, token: str
) -> None:
    """The version is keyed by the journal's broker key, not by a process: the daemon restarted
    on the same journal still sends what was approved for the same value."""
    async with HostileServer.running(scripts.serve(OK)) as srv:
        cfg = approval_config(tmp_path, srv.url)
        async with open_broker(cfg) as b:
            iid = await _approved_with_caller_gone(b)
        async with open_broker(cfg) as b:
            await b.dispatch_approved(iid)
            assert_ok(b, await b.fetch_result(iid) or {})
            verify_ok(b)
    assert len(srv.requests) == 1


async def test_an_approved_request_is_not_redirected_to_a_request_nobody_approved(
    tmp_path: Path, token: str
) -> None:
    """The operator approves the request shown.  A target that follows redirects would send
    another (a 307 repeats the POST and its body, anywhere the target's policy allows) after
    the yes: an approved request follows none -- the complete 3xx is its result, with why, and
    the record says so before anything is sent.  A request needing no approval still follows."""
    routes = {
        "/v1/charges": Reply(307, headers=[("Location", "/v1/elsewhere")], body=b"moved"),
        "/v1/elsewhere": Reply(200, body=b"elsewhere"),
        "/v1/old": Reply(308, headers=[("Location", "/v1/elsewhere")]),
    }
    serve = scripts.serve(lambda r: routes[r.target])
    async with HostileServer.running(serve) as srv:
        cfg = approval_config(
            tmp_path, srv.url, approval={"methods": ["POST"], "wait": "20s"}, follow_redirects=True
        )
        async with open_broker(cfg) as b:

            async def approve(waiting: dict[str, Any]) -> None:
                assert waiting["request"]["redirects"] == "not followed: a 3xx answer is the result"
                await b.approve(waiting["invocation_id"], operator=OPS)

            env, _ = await _decided_while_waiting(b, CHARGE, approve)
            rec = assert_redirected(b, env)
            assert env["result"]["status"] == 307
            events = {e.kind: e.attrs for e in b.events(env["invocation_id"])}
            assert events[E.REMOTE_RESPONSE_COMPLETE]["redirect_not_followed"]["reason"] == (
                "an approved request is sent as approved: its redirect is not followed"
            )
            # ... and the caller reads why in the envelope, not only in the journal.
            assert (
                env["evidence"]["redirect_not_followed"]
                == (events[E.REMOTE_RESPONSE_COMPLETE]["redirect_not_followed"])
            )
            # Bound before anything was sent: in the approval, and in the authorization.
            assert events[E.APPROVAL_REQUESTED]["injection"]["redirects"] == "not_followed"
            assert events[E.CREDENTIAL_AUTHORIZED]["redirects"] == "not_followed"
            assert rec.evidence["approval"]["state"] == "granted"
            plain = await b.call({"target": "api", "method": "GET", "path": "/v1/old"})
            assert_ok(b, plain)
            assert plain["result"]["status"] == 200
            verify_ok(b)
    assert [(r.method, r.target) for r in srv.requests] == [
        ("POST", "/v1/charges"),
        ("GET", "/v1/old"),
        ("GET", "/v1/elsewhere"),
    ]


def _swap_body(cfg: Path, journal: Path, iid: str, body: str) -> None:
    """Replace the action sealed with ACTION_ACCEPTED by one with another body, sealed with the
    broker's own key -- what the dispatcher reads back then differs from what was approved.
    (A row's hash covers its sealed payload: ``journal verify`` finds the edit -- afterwards.
    Before the send, the approval's fingerprint re-checked at the gate is what stops it.)"""
    reseal_accepted(journal, iid, {**CHARGE, "body": body}, BrokerKey.load(Path(f"{journal}.key")))


async def test_a_body_changed_between_approval_and_dispatch_is_stale_and_nothing_is_sent(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(OK)) as srv:
        cfg = approval_config(tmp_path, srv.url)
        async with open_broker(cfg) as b:
            iid = await _approved_with_caller_gone(b)
        _swap_body(cfg, tmp_path / "journal.db", iid, '{"amount": 5000}')
        async with open_broker(cfg) as b:  # the daemon, restarted, picks it up
            assert await b.approvals_ready() == []  # nothing learnt yet: watch first
            b.watch_approvals()
            assert await b.approvals_ready() == [iid]
            await b.dispatch_approved(iid)
            rec = b.record(iid)
            assert rec is not None and rec.code is not None
            assert (rec.code.value, rec.phase.value, rec.outcome.value) == (
                "APPROVAL_STALE",
                "validation",
                "not_attempted",
            )
            assert E.DISPATCH_STARTED not in event_kinds(b, iid)
            assert not b.journal.verify().ok
    assert srv.requests == []  # the server log: nothing, under the old approval or any other


async def test_a_retry_of_an_approved_unknown_request_reuses_the_approval_until_it_expires(
    tmp_path: Path, token: str
) -> None:
    idem = {"header": "Idempotency-Key", "scope": "charges", "retention": "24h"}
    async with HostileServer.running(scripts.apply_then_close()) as srv:
        cfg = approval_config(
            tmp_path, srv.url, approval={"ttl": "3s", "wait": "3s"}, idempotency=idem
        )
        async with open_broker(cfg) as b:
            action = {**CHARGE, "idempotency_key": "charge-1"}

            first = await _approved_while_waiting(b, action)
            assert first["error"]["retry"] == "same_idempotency_key"
            again = await b.call(action)  # within the window: the approval still covers it
            assert again["invocation_id"] == first["invocation_id"]
            assert len(srv.requests) == 2
            assert again["error"]["outcome"] == "unknown"
            await trio.sleep(3.1)
            late = await b.call(action)  # past it: refused at the gate, still unknown
            rec = assert_error(
                b, late, phase="validation", outcome="unknown", retry="reconcile",
                code="APPROVAL_EXPIRED",
            )  # fmt: skip
            assert rec.state == "retry_invalid"
            assert late["error"]["message"] == rec.message == EXPIRED_RETRY, late
            verify_ok(b)
    assert len(srv.requests) == 2
    assert {r.header("idempotency-key") for r in srv.requests} == {"charge-1"}


async def _both_wait_for_the_decision(b: Broker) -> None:
    """Until two callers wait on the broker's approval board for a decision (bounded) -- not
    0.2 s, after which a second caller a loaded machine had not yet brought there would come
    after the approval, and could find the result already stored."""
    board = b._engine.approvals._changed
    with trio.fail_after(LIMIT):
        while board.statistics().tasks_waiting < 2:
            await trio.sleep(0.01)


async def test_two_callers_of_one_approved_request_send_it_once(tmp_path: Path, token: str) -> None:
    idem = {"header": "Idempotency-Key", "scope": "charges", "retention": "24h"}
    async with HostileServer.running(scripts.serve(OK)) as srv:
        cfg = approval_config(tmp_path, srv.url, approval={"wait": "20s"}, idempotency=idem)
        async with open_broker(cfg) as b:
            action = {**CHARGE, "idempotency_key": "charge-2"}
            envs: list[dict[str, Any]] = []

            async def caller() -> None:
                envs.append(await b.call(action))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(caller)
                [waiting] = await _pending(b)
                nursery.start_soon(caller)  # the same key again: it waits for the same decision
                await _both_wait_for_the_decision(b)
                await b.approve(waiting["invocation_id"], operator=OPS)
            assert {e["invocation_id"] for e in envs} == {waiting["invocation_id"]}
            assert sorted("error" in e for e in envs) == [False, True]  # one sent, one busy
            assert event_kinds(b, waiting["invocation_id"]).count(E.DISPATCH_STARTED) == 1
            verify_ok(b)
    assert len(srv.requests) == 1


async def test_a_joiner_hanging_up_detaches_and_never_cancels_the_approved_request(
    tmp_path: Path, token: str
) -> None:
    """Another caller with the same idempotency key joins an approved request -- and, holding
    its dispatch, hangs up before the gate.  It may leave; it may not cancel what an operator
    approved for whoever asked first: the request is sent, its result stored for that caller."""
    idem = {"header": "Idempotency-Key", "scope": "charges", "retention": "24h"}
    async with HostileServer.running(scripts.serve(OK)) as srv:
        cfg = approval_config(tmp_path, srv.url, approval={"wait": "0s"}, idempotency=idem)
        async with open_broker(cfg) as b:
            action = {**CHARGE, "idempotency_key": "charge-3"}
            first = await b.call(action)  # the one who asked: answered pending, fetches later
            assert first["error"]["code"] == "APPROVAL_PENDING"
            iid = first["invocation_id"]
            await b.approve(iid, operator=OPS)
            stall = GateStall(b._engine.bindings["http"], limit=LIMIT / 2)
            b._engine.bindings["http"] = stall
            joiner = CallControl()
            got: dict[str, Any] = {}

            async def join() -> None:
                got["env"] = await b.call(action, control=joiner, timeout=0.5)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(join)
                with trio.fail_after(LIMIT):
                    await stall.stopped.wait()  # the joiner holds the dispatch, before the gate
                withdrawn = joiner.withdraw()  # ... and hangs up
                await trio.sleep(0.6)  # past the joiner's own deadline too
                stall.resume.set()
            assert got["env"]["invocation_id"] == iid
            fetched = await b.fetch_result(iid)
            assert fetched is not None
            assert_ok(b, fetched)
            assert not withdrawn and joiner.detached and joiner.code is None
            assert event_kinds(b, iid).count(E.DISPATCH_STARTED) == 1
            verify_ok(b)
    assert len(srv.requests) == 1


def _fingerprint_of_guess(caller_sees: list[Any], guess: str, v: int) -> str:
    """The approval fingerprint a caller would compute for a guessed credential reference from
    what it reads back: the request fingerprint (ACTION_ACCEPTED), the version, injection and
    config hash (APPROVAL_REQUESTED) -- the doc ``approval_fingerprint`` hashes, the reference
    as written."""
    accepted = next(a for k, a in caller_sees if k == E.ACTION_ACCEPTED.value)
    requested = next(a for k, a in caller_sees if k == E.APPROVAL_REQUESTED.value)
    doc = {
        "v": v,
        "request": accepted["operation"]["fingerprint"],
        "credential": guess,
        "version": requested["version"],
        "injection": requested["injection"],
        "config_hash": requested["config_hash"],
    }
    return "sha256:" + hashlib.sha256(canonical_json(doc)).hexdigest()


async def test_the_approval_fingerprint_does_not_confirm_a_guessed_credential_reference(
    tmp_path: Path, token: str
) -> None:
    """The caller reads an approval's fingerprint back; every other part of what it hashes is
    in the caller's evidence too.  Were the reference hashed as written, a caller could try
    ``env:NAME`` and ``file:/path`` guesses offline until one matched -- learning the
    reference the envelope no longer tells it.  The reference is bound by a digest keyed by
    the journal's key: a guess matches nothing, and a change of reference still changes it."""
    async with HostileServer.running(scripts.serve(OK)) as srv:
        cfg = approval_config(tmp_path, srv.url)
        async with open_broker(cfg) as b:
            env = await b.call(CHARGE)
            assert env["error"]["code"] == "APPROVAL_PENDING"
            iid = env["invocation_id"]
            caller_sees = [(e.kind.value, dict(e.attrs)) for e in b.events(iid)]
            ref = b.config.targets["api"].credential
            assert ref == f"env:{TOKEN_ENV}"
            fingerprint = next(
                a["fingerprint"] for k, a in caller_sees if k == E.APPROVAL_REQUESTED.value
            )
            [waiting] = b.approvals()
            assert waiting["fingerprint"] == fingerprint and waiting["credential"] == ref
    for v in (1, 2, 3):  # the doc as this version and the earlier ones hashed it
        assert _fingerprint_of_guess(caller_sees, ref, v) != fingerprint
    assert srv.requests == []


async def test_a_retry_refused_for_a_removed_operator_claims_nothing_of_the_first(
    tmp_path: Path, token: str
) -> None:
    """An approved keyed POST the server got (unknown), its granting operator then removed
    from ``[service] operator_uids``, the same key retried: APPROVAL_STALE at
    approval.operator, and the message says only this retry sent nothing -- the first attempt
    was sent, its outcome stands -- never that nothing was sent under the approval."""
    idem = {"header": "Idempotency-Key", "scope": "charges", "retention": "24h"}
    async with HostileServer.running(scripts.apply_then_close()) as srv:
        cfg = approval_config(tmp_path, srv.url, approval={"wait": "20s"}, idempotency=idem)
        action = {**CHARGE, "idempotency_key": "charge-op"}
        async with open_broker(cfg) as b:
            first = await _approved_while_waiting(b, action)
            assert first["error"]["outcome"] == "unknown", first
        cfg.write_text(
            cfg.read_text().replace(f"operator_uids = [{OPS_UID}]", "operator_uids = [1]")
        )
        async with open_broker(cfg) as b:
            late = await b.call(action)
            assert late["invocation_id"] == first["invocation_id"]
            error = late["error"]
            assert (error["code"], error["field"]) == ("APPROVAL_STALE", "approval.operator")
            assert error["outcome"] == "unknown", late
            assert error["message"] == (
                f"The approval was granted by uid {OPS_UID}, not an operator by [service] "
                "operator_uids / operator_gids now; this retry sent nothing; an earlier "
                "attempt's outcome stands."
            ), late
            verify_ok(b)
    assert len(srv.requests) == 1
