"""A journal written before rows named an open query (rvG finding 3): a query that awaited an
operator at the upgrade was recorded only by its asker's last RECONCILE_INCONCLUSIVE -- code
APPROVAL_PENDING, no ``open``.  It was taken up then; it is taken up now: the record folds it as
the open query of its generation, and the next query neither asks again nor puts a second card
on the operator's list.  Once approved, its answer is read once."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from affidavit.approvals import OperatorError
from affidavit.reconcile.approved import WAITING
from affidavit.statemachine import Event, EventKind, open_query

from .approvalkit import OPS
from .http_rows import LIMIT
from .test_reconcile_approval import _gets, _payments, _pending_queries

E = EventKind
QUERY = {"target": "api", "method": "GET", "path": "/v1/charges?idempotency_key=k1"}


async def test_a_query_awaiting_approval_at_the_upgrade_is_taken_up(
    tmp_path: Path, token: str
) -> None:
    async with _payments(tmp_path) as (srv, broker, iid):
        record = broker.record(iid)
        assert record is not None
        with trio.fail_after(LIMIT):  # the query as the old code asked it: no claim
            asked = await broker._engine.call(QUERY, link={"reconciles": iid})
        assert asked["error"]["code"] == "APPROVAL_PENDING"
        query_id = asked["invocation_id"]
        legacy = {"query_invocation": query_id, "code": "APPROVAL_PENDING", "reason": WAITING}
        row = Event(E.RECONCILE_INCONCLUSIVE, iid, {**legacy, "generation": record.generation})
        await broker.journal.append(row, barrier=True)
        folded = broker.record(iid)
        assert folded is not None
        rows = folded.evidence["reconcile_queries"]
        assert open_query(rows, folded.generation) == query_id
        with trio.fail_after(LIMIT), pytest.raises(OperatorError) as refused:
            await broker.reconcile(iid, query=True)
        assert refused.value.code == "QUERY_PENDING"
        assert _pending_queries(broker, iid) == [query_id]  # no second card
        with trio.fail_after(LIMIT):
            await broker.approve(query_id, note="read it", operator=OPS)
            answer = await broker.reconcile(iid, query=True)
        assert answer["reconciled"] is True
        assert answer["query"]["invocation_id"] == query_id
    assert _gets(srv) == 1
