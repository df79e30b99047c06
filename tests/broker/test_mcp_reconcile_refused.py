"""A reconciliation query whose finding the record refuses once it ran (a same-key retry took
the lease meanwhile) is answered, not raised: an OperatorError means nothing was invoked, and
the MCP tool turns one into ``refusal()`` -- validation, not_attempted, no invocation -- which
would hide the query that was dispatched and journaled.  The tool's answer keeps its shape
({reconciled: false, envelope, query}) with ``refused`` saying why."""

from __future__ import annotations

import json
from typing import Any

import trio

from affidavit.mcp.backends import Embedded
from affidavit.mcp.tools import is_error
from affidavit.statemachine import EventKind
from tests.http.hostile import HostileServer

from .approvalkit import reconcile_target
from .helpers import open_broker, write_config
from .test_reconcile import RetriedCharges

E = EventKind
CHARGE = {
    "target": "api",
    "method": "POST",
    "path": "/v1/charges",
    "body": json.dumps({"amount": 5}),
    "idempotency_key": "charge-mcp",
}


async def test_an_mcp_reconcile_query_refused_after_the_query_ran_does_not_claim_not_attempted(
    tmp_path: Any, token: str
) -> None:
    api = RetriedCharges()
    async with (
        HostileServer.running(api.script) as srv,
        open_broker(write_config(tmp_path, reconcile_target(srv.url))) as b,
    ):
        first = await b.call(CHARGE)
        assert first["error"]["outcome"] == "unknown", first
        iid = first["invocation_id"]
        mcp = Embedded(b)
        out: dict[str, Any] = {}

        async def reconcile() -> None:
            out["answer"] = await mcp.reconcile_query(iid)

        async def retry() -> None:
            out["retry"] = await b.call(CHARGE)

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(reconcile)
                await srv.event("query_read").wait()
                nursery.start_soon(retry)
                await srv.event("retry_applied").wait()
                srv.event("release_query").set()
                while "answer" not in out:
                    await trio.sleep(0.01)
                srv.event("release_retry").set()
        # The query invocation ran: a linked invocation with its own dispatch.
        queries = [
            r
            for r in b.journal.list_actions()
            if r.invocation_id != iid and r.evidence.get("dispatch_started")
        ]
        assert len(queries) == 1, [r.invocation_id for r in b.journal.list_actions()]
        query_id = queries[0].invocation_id
        assert E.DISPATCH_STARTED in [e.kind for e in b.events(query_id)]
    answer = out["answer"]
    err = answer.get("error") or {}
    # What the agent is told must not say nothing was attempted (the query was dispatched),
    # and must name the query it ran (the tool promises {reconciled, envelope, query}).
    assert (err.get("phase"), err.get("outcome")) != ("validation", "not_attempted"), answer
    assert answer["query"]["invocation_id"] == query_id, answer
    assert answer["reconciled"] is False and answer["refused"]["code"] == "STILL_RUNNING"
    assert answer["envelope"]["invocation_id"] == iid
    assert is_error(answer)  # the tool result says the outcome was not settled
