"""A grant recorded before ``operator.admitted`` was, and one whose ``admitted`` is malformed
(apprfix50c #2).

An older grant's operator, not listed by uid, is placed by the user database's groups, looked
up before the dispatch lease (``Grant.checked``).  A failed lookup (``userdel``, NSS away)
proves neither way: nothing is sent and nothing ended -- the record stays approved for a later
sweep or its expiry (before, it counted as "not disowned" and the request was sent).  A
malformed ``admitted`` admits nobody: APPROVAL_STALE at approval.operator, nothing sent.
``OperatorPolicy.admitted_by`` is patched to record what an older broker (None: no key) or a
hostile row (a malformed value) would.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

import affidavit.engine.approval as approval
from affidavit.approvals import Operator
from affidavit.approvals.operator import OperatorPolicy
from affidavit.statemachine import EventKind
from tests.http.hostile import HostileServer, Reply, scripts

from .approvalkit import approval_config, dispatched_stale, verify_ok
from .helpers import assert_ok, event_kinds, open_broker

E = EventKind
OK = Reply(200, body=b'{"ok": true}')
CHARGE = {"target": "api", "method": "POST", "path": "/v1/charges", "body": '{"amount": 5}'}
GID = 64987
UID = 64986
OPERATOR = Operator(UID, GID, (), None, "socket")
"""Admitted by a group the kernel gave it; its uid is in no user database here."""


async def _granted(cfg: Path, monkeypatch: pytest.MonkeyPatch, admitted: Any) -> str:
    monkeypatch.setattr(OperatorPolicy, "admitted_by", lambda self, who: admitted)
    async with open_broker(cfg) as b:
        env = await b.call(CHARGE)
        assert env["error"]["code"] == "APPROVAL_PENDING", env
        iid = str(env["invocation_id"])
        await b.approve(iid, operator=OPERATOR)
    monkeypatch.undo()
    return iid


async def test_an_older_grant_whose_operator_cannot_be_looked_up_is_neither_sent_nor_ended(
    tmp_path: Path, token: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with HostileServer.running(scripts.serve(OK)) as srv:
        cfg = approval_config(tmp_path, srv.url, service={"operator_gids": [GID]})
        iid = await _granted(cfg, pytest.MonkeyPatch(), None)
        async with open_broker(cfg) as b:
            granted = next(e for e in b.journal.events(iid) if e.kind is E.APPROVAL_GRANTED)
            assert granted.attrs["operator"].get("admitted") is None  # as an older one
            kinds = event_kinds(b, iid)
            with caplog.at_level(logging.WARNING, logger="affidavit"):
                assert await b.dispatch_approved(iid) is None
            assert event_kinds(b, iid) == kinds  # nothing written: no lease, no ending
            assert b.record(iid).state == "approved"  # type: ignore[union-attr]
            assert any("cannot be looked up" in r.getMessage() for r in caplog.records)
            verify_ok(b)
    assert srv.requests == []


async def test_an_older_grant_whose_operator_the_user_database_places_is_sent(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with HostileServer.running(scripts.serve(OK)) as srv:
        cfg = approval_config(tmp_path, srv.url, service={"operator_gids": [GID]})
        iid = await _granted(cfg, pytest.MonkeyPatch(), None)
        # The lookup done once, before the lease; the gate re-checks what it found.
        looked: list[int] = []
        monkeypatch.setattr(approval, "groups_of", lambda uid: looked.append(uid) or [GID])
        async with open_broker(cfg) as b:
            await b.dispatch_approved(iid)
            assert_ok(b, await b.fetch_result(iid) or {})
            verify_ok(b)
        assert looked == [UID]
    assert len(srv.requests) == 1


@pytest.mark.parametrize("admitted", [{"gid": str(GID)}, {"uid": UID, "gid": GID}, [GID]])
async def test_a_grant_with_a_malformed_admitted_is_approval_stale(
    tmp_path: Path, token: str, admitted: Any
) -> None:
    async with HostileServer.running(scripts.serve(OK)) as srv:
        cfg = approval_config(tmp_path, srv.url, service={"operator_gids": [GID]})
        iid = await _granted(cfg, pytest.MonkeyPatch(), admitted)
        async with open_broker(cfg) as b:
            rec = await dispatched_stale(b, iid)
            assert rec.field == "approval.operator"
            verify_ok(b)
    assert srv.requests == []


async def test_a_caller_coming_back_to_such_a_grant_is_answered_without_a_send(
    tmp_path: Path, token: str
) -> None:
    """The same key, called again (``await_grant``'s claim): answered from the record --
    retryable, nothing sent, the record still approved."""
    idem = {"header": "Idempotency-Key", "scope": "charges", "retention": "24h"}
    action = {**CHARGE, "idempotency_key": "charge-older"}
    async with HostileServer.running(scripts.serve(OK)) as srv:
        cfg = approval_config(tmp_path, srv.url, service={"operator_gids": [GID]}, idempotency=idem)
        patch = pytest.MonkeyPatch()
        patch.setattr(OperatorPolicy, "admitted_by", lambda self, who: None)
        async with open_broker(cfg) as b:
            env = await b.call(action)
            assert env["error"]["code"] == "APPROVAL_PENDING", env
            iid = str(env["invocation_id"])
            await b.approve(iid, operator=OPERATOR)
            patch.undo()
            kinds = event_kinds(b, iid)
            again = await b.call(action)
            assert again["invocation_id"] == iid
            assert again["error"]["code"] == "IN_PROGRESS", again  # fetch later, not sent
            assert event_kinds(b, iid) == kinds
            assert b.record(iid).state == "approved"  # type: ignore[union-attr]
    assert srv.requests == []
