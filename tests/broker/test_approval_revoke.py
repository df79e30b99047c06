"""``approvals revoke``: an operator takes a grant back before its request is sent.

APPROVAL_REVOKED is accepted only while the invocation is ``approved`` and no live dispatch
lease holds it -- both checked in the writing transaction -- so a revoke and a dispatch never
both happen: one wins, and the journal shows which.  Revoked, the invocation ends as a denied
one (APPROVAL_DENIED, credential_injection, not_attempted, retry ``never``), the view says
``revoked`` with who and why, and nothing is sent.  Real broker, real loopback server.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.approvals import Operator, OperatorError
from affidavit.statemachine import Code, EventKind
from tests.http.hostile import HostileServer, Reply, scripts

from .approvalkit import OPS, approval_config, verify_ok
from .helpers import event_kinds, open_broker

E = EventKind
OK = Reply(200, body=b'{"ok": true}')
CHARGE = {"target": "api", "method": "POST", "path": "/v1/charges", "body": '{"amount": 5}'}
LIMIT = 20
ROUNDS = 6
"""Races of a revoke against the dispatcher's send, each on a fresh approved request."""


async def _approved(broker: Broker) -> str:
    """A request answered APPROVAL_PENDING (its caller goes away), then approved."""
    env = await broker.call(CHARGE)
    assert env["error"]["code"] == "APPROVAL_PENDING", env
    await broker.approve(env["invocation_id"], operator=OPS)
    return str(env["invocation_id"])


async def _refused(code: str, revoking: object) -> None:
    with pytest.raises(OperatorError) as refused:
        await revoking  # type: ignore[misc]
    assert refused.value.code == code, refused.value.message


async def test_a_revoked_grant_is_never_sent_and_ends_as_denied(tmp_path: Path, token: str) -> None:
    async with (
        HostileServer.running(scripts.serve(OK)) as srv,
        open_broker(approval_config(tmp_path, srv.url)) as b,
    ):
        iid = await _approved(b)
        view = await b.revoke(iid, note="the amount was wrong", operator=OPS)
        assert (view["approval"], view["state"]) == ("revoked", "approval_denied"), view
        assert view["operator"] == OPS.attrs() and view["note"] == "the amount was wrong"
        revoked = [e for e in b.events(iid) if e.kind is E.APPROVAL_REVOKED]
        assert [e.attrs["operator"] for e in revoked] == [OPS.attrs()]
        # What the caller coming back is answered, and what the dispatcher does: nothing.
        assert await b.approvals_ready() == []
        assert await b.dispatch_approved(iid) is None
        record = b.record(iid)
        assert record is not None
        answer = (record.phase.value, record.outcome.value, record.retry.value, record.code)
        assert answer == ("credential_injection", "not_attempted", "never", Code.APPROVAL_DENIED)
        assert E.DISPATCH_LEASE_ACQUIRED not in event_kinds(b, iid)
        verify_ok(b)
    assert srv.requests == []


async def test_a_revoke_is_refused_unless_approved_undispatched_by_an_operator_with_a_note(
    tmp_path: Path, token: str
) -> None:
    async with (
        HostileServer.running(scripts.serve(OK)) as srv,
        open_broker(approval_config(tmp_path, srv.url)) as b,
    ):
        pending = (await b.call(CHARGE))["invocation_id"]
        await _refused("NOT_APPROVED", b.revoke(pending, note="x", operator=OPS))
        iid = await _approved(b)
        await _refused("NOTE_REQUIRED", b.revoke(iid, note=None, operator=OPS))
        agent = Operator(4343, 4343, (), "agent")
        await _refused("NOT_AN_OPERATOR", b.revoke(iid, note="x", operator=agent))
        # A dispatcher holds it (another process's live lease): refused, nothing written.
        await b.journal.acquire_lease(iid, "elsewhere", 30, kind=E.DISPATCH_LEASE_ACQUIRED)
        await _refused("DISPATCHING", b.revoke(iid, note="x", operator=OPS))
        assert E.APPROVAL_REVOKED not in event_kinds(b, iid)
        # Sent: nothing to take back.
        other = await _approved(b)
        assert await b.dispatch_approved(other) is not None
        await _refused("NOT_APPROVED", b.revoke(other, note="x", operator=OPS))
    assert len(srv.requests) == 1


async def test_a_revoke_racing_the_dispatch_one_wins_and_the_journal_says_which(
    tmp_path: Path, token: str
) -> None:
    async with (
        HostileServer.running(scripts.serve(OK)) as srv,
        open_broker(approval_config(tmp_path, srv.url)) as b,
    ):
        sent = 0
        with trio.fail_after(LIMIT):
            for _ in range(ROUNDS):
                iid = await _approved(b)
                outcome: dict[str, object] = {}

                async def dispatch(iid: str = iid, outcome: dict[str, object] = outcome) -> None:
                    outcome["dispatch"] = await b.dispatch_approved(iid)

                async def revoke(iid: str = iid, outcome: dict[str, object] = outcome) -> None:
                    try:
                        outcome["revoke"] = await b.revoke(iid, note="race", operator=OPS)
                    except OperatorError as exc:
                        outcome["revoke"] = exc.code

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(dispatch)
                    nursery.start_soon(revoke)
                kinds = event_kinds(b, iid)
                revoked = isinstance(outcome["revoke"], dict)
                assert kinds.count(E.APPROVAL_REVOKED) == int(revoked), (kinds, outcome)
                assert kinds.count(E.DISPATCH_STARTED) == int(not revoked), (kinds, outcome)
                if not revoked:
                    assert outcome["revoke"] in ("DISPATCHING", "NOT_APPROVED"), outcome
                    sent += 1
                else:
                    assert outcome["dispatch"] is None or (
                        outcome["dispatch"]["error"]["code"] == "APPROVAL_DENIED"  # type: ignore[index]
                    ), outcome
        verify_ok(b)
    assert len(srv.requests) == sent


async def test_a_same_key_retry_after_a_revoke_is_answered_denied_and_sends_nothing(
    tmp_path: Path, token: str
) -> None:
    """The caller coming back with its key after the revoke: APPROVAL_DENIED, retry ``never``
    -- the revoked invocation's answer, not a new approval asked -- and nothing sent."""
    idem = {"header": "Idempotency-Key", "scope": "charges", "retention": "24h"}
    async with HostileServer.running(scripts.serve(OK)) as srv:
        cfg = approval_config(tmp_path, srv.url, idempotency=idem)
        async with open_broker(cfg) as b:
            action = {**CHARGE, "idempotency_key": "charge-revoked"}
            first = await b.call(action)
            assert first["error"]["code"] == "APPROVAL_PENDING", first
            iid = first["invocation_id"]
            await b.approve(iid, operator=OPS)
            await b.revoke(iid, note="the amount was wrong", operator=OPS)
            again = await b.call(action)
            assert again["invocation_id"] == iid
            error = again["error"]
            assert (error["code"], error["retry"], error["outcome"]) == (
                "APPROVAL_DENIED",
                "never",
                "not_attempted",
            ), again
            assert b.approvals() == []  # no new approval asked under the key
            assert E.DISPATCH_LEASE_ACQUIRED not in event_kinds(b, iid)
            verify_ok(b)
    assert srv.requests == []


async def test_revoking_a_revoked_grant_again_answers_the_recorded_revoke(
    tmp_path: Path, token: str
) -> None:
    """Idempotent, as an operator retrying after a lost answer needs: the second revoke (by
    another operator, another note) writes nothing and answers the revoke on record."""
    async with (
        HostileServer.running(scripts.serve(OK)) as srv,
        open_broker(approval_config(tmp_path, srv.url, service={"operator_gids": [4245]})) as b,
    ):
        iid = await _approved(b)
        first = await b.revoke(iid, note="the amount was wrong", operator=OPS)
        other = Operator(4244, 4245, (), "ops2", "socket")  # another operator, by group
        again = await b.revoke(iid, note="retried", operator=other)
        assert again == first
        assert (again["approval"], again["note"]) == ("revoked", "the amount was wrong")
        assert event_kinds(b, iid).count(E.APPROVAL_REVOKED) == 1
        # Still an operator's action: a non-operator is refused, the note still required.
        agent = Operator(4343, 4343, (), "agent")
        await _refused("NOT_AN_OPERATOR", b.revoke(iid, note="x", operator=agent))
        await _refused("NOTE_REQUIRED", b.revoke(iid, note=None, operator=OPS))
        verify_ok(b)
    assert srv.requests == []
