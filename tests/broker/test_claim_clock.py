"""A linked call's claim -- the row naming a reconciliation query before it is asked -- lapses
by a deadline recorded in, and judged by, the clock leases are (rvG finding 2): the database's on
a shared journal (``Txn._expiry`` moves ``expires_at``), this broker's own on SQLite.  Before,
the lapse was the claim row's time label, written by its broker's clock, compared with the
reading broker's ``time.time()``: a writer running an hour behind (or a reader an hour ahead)
had its live claim closed by the other broker, and the same question asked twice.

Seed, "Never claim more than the records prove": a claim whose query has no record yet proves
only that it is being asked -- QUERY_PENDING until its deadline, closed and asked anew after.
An operation's poll is claimed, and lapses, the same way."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

import affidavit.engine.takeup as takeup
from affidavit.api.broker import Broker
from affidavit.approvals import OperatorError
from affidavit.config import load_config
from affidavit.engine import OperationError
from affidavit.engine.operations import ASKING as POLL_ASKING
from affidavit.reconcile import approved
from affidavit.reconcile.approved import ASKING, UNSENT
from affidavit.statemachine import Event, EventKind, invocation_of
from tests.http.hostile import HostileServer

from .approvalkit import OPS, PaymentsApi, reconcile_target
from .helpers import write_config
from .http_rows import LIMIT
from .test_poll_approval import _jobs
from .test_reconcile_approval import _gets, _payments, _pending_queries

E = EventKind
BEHIND = 3600.0
CHARGE = {
    "target": "api",
    "method": "POST",
    "path": "/v1/charges",
    "body": '{"drop": true}',
    "idempotency_key": "k1",
}


def _claim(iid: str, generation: int, expires_at: float) -> Event:
    attrs = {"query_invocation": "act_claimed", "code": None, "reason": ASKING, "open": True}
    return Event(
        E.RECONCILE_INCONCLUSIVE, iid, {**attrs, "generation": generation, "expires_at": expires_at}
    )


async def test_a_claim_with_no_record_is_pending_until_its_deadline_then_asked_anew(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with _payments(tmp_path) as (srv, broker, iid):
        record = broker.record(iid)
        assert record is not None
        deadline = time.time() + 60.0
        await broker.journal.append(_claim(iid, record.generation, deadline), barrier=True)
        with trio.fail_after(LIMIT), pytest.raises(OperatorError) as refused:
            await broker.reconcile(iid, query=True)
        assert refused.value.code == "QUERY_PENDING"
        assert "act_claimed" in refused.value.message and "is being asked" in refused.value.message
        assert _pending_queries(broker, iid) == []
        # The clock leases are judged by (SQLite: this broker's) past the deadline: its asker
        # is gone; the claim is closed and a new query asked.
        monkeypatch.setattr(broker.journal, "_clock", lambda: deadline + 1.0)
        with trio.fail_after(LIMIT):
            answer = await broker.reconcile(iid, query=True)
        assert answer["query"]["error"]["code"] == "APPROVAL_PENDING"
        rows = answer["envelope"]["evidence"]["reconcile_queries"]
        assert [(r["query_invocation"], r["reason"]) for r in rows[:2]] == [
            ("act_claimed", ASKING),
            ("act_claimed", UNSENT),
        ]
        assert _pending_queries(broker, iid) == [answer["query"]["invocation_id"]]
    assert _gets(srv) == 0


class _Behind:
    @staticmethod
    def time() -> float:
        return time.time() - BEHIND


@asynccontextmanager
async def _two_brokers(tmp: Path, url: str, pg_url: str) -> AsyncIterator[tuple[Broker, Broker]]:
    cfg = []
    for n in "ab":
        journal = {"url": pg_url, "key_file": str(tmp / "k"), "signing_key": str(tmp / n)}
        targets = reconcile_target(url, approval={"methods": ["GET"], "wait": "0s"})
        path = write_config(tmp, targets, journal=journal, name=f"{n}.toml")
        with path.open("a", encoding="utf-8") as f:
            f.write(f"[service]\noperator_uids = [{OPS.uid}]\n")
        cfg.append(load_config(path))
    async with (
        Broker.open(config=cfg[0], holder="worker-A") as a,
        Broker.open(config=cfg[1], holder="worker-B") as b,
    ):
        yield a, b


async def test_a_broker_behind_keeps_its_live_claim_on_a_shared_journal(
    tmp_path: Path, pg_url: str, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A claim with no record yet: an older broker's, written before its query's first rows
    # (``takeup``: today's claims head them).  Written by A, whose host clock runs an hour
    # behind; B, on the real clock, must see it live -- not close it and ask again.
    async with (
        HostileServer.running(PaymentsApi().script) as srv,
        _two_brokers(tmp_path, srv.url, pg_url) as (a, b),
    ):
        with trio.fail_after(LIMIT):
            iid = (await a.call(CHARGE))["invocation_id"]
        record = a.record(iid)
        assert record is not None
        with monkeypatch.context() as patch:  # A's host clock, an hour behind
            patch.setattr(a.journal._writer, "clock", _Behind.time)
            patch.setattr(takeup, "time", _Behind)
            claim = approved.claim(a._engine, record, "act_claimed")
            with trio.fail_after(LIMIT):
                await a.journal.append(claim, barrier=True)
        with trio.fail_after(LIMIT), pytest.raises(OperatorError) as refused:  # B: real clock
            await b.reconcile(iid, query=True)
        assert refused.value.code == "QUERY_PENDING", refused.value.message
        assert "act_claimed" in refused.value.message and "is being asked" in refused.value.message
        after = b.record(iid)
        assert after is not None
        rows = after.evidence["reconcile_queries"]
        assert [r["reason"] for r in rows] == [ASKING]  # B closed nothing of A's
        assert _pending_queries(b, iid) == []
    assert _gets(srv) == 0


async def test_a_poll_claim_with_no_record_is_pending_until_its_deadline_then_asked_anew(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with _jobs(tmp_path) as (srv, broker, op_id):
        iid = invocation_of(op_id)
        assert iid is not None
        deadline = time.time() + 60.0
        attrs = {"operation_id": op_id, "poll_invocation": "act_claimed", "code": None}
        claim = {**attrs, "reason": POLL_ASKING, "open": True, "expires_at": deadline}
        await broker.journal.append(Event(E.OPERATION_POLL_FAILED, iid, claim), barrier=True)
        with trio.fail_after(LIMIT), pytest.raises(OperationError) as refused:
            await broker.poll_operation(op_id)
        assert refused.value.code == "POLL_PENDING"
        assert "act_claimed" in str(refused.value) and "is being asked" in str(refused.value)
        monkeypatch.setattr(broker.journal, "_clock", lambda: deadline + 1.0)
        with trio.fail_after(LIMIT):
            answer = await broker.poll_operation(op_id)
        assert answer["poll"]["error"]["code"] == "APPROVAL_PENDING"
        assert answer["poll"]["invocation_id"] != "act_claimed"
        assert answer["operation"]["polls"] == 0  # nothing sent: neither is a poll of the job
        assert [c["invocation_id"] for c in broker.approvals()] == [answer["poll"]["invocation_id"]]
    assert _gets(srv) == 0
