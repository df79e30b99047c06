"""``Engine.call(claim=...)`` refuses a claim that would not head a new invocation it names,
before anything is written (``takeup.ClaimInvalid``, a stable code) -- design every interface
as if the caller were hostile.  Before, a claim naming another call was written as given, and
one heading a call whose idempotency key named a bound invocation was dropped (the call
resumed, taken over or fetched under the bound id): an approval asked with no claim naming it,
a card no claim accounts for -- and the resumed call sent again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.engine import new_invocation_id
from affidavit.engine.takeup import ClaimInvalid
from affidavit.reconcile import approved

from .http_rows import LIMIT
from .test_reconcile_approval import _payments

CHARGE = {
    "target": "api",
    "method": "POST",
    "path": "/v1/charges",
    "body": json.dumps({"drop": True}),
    "idempotency_key": "k1",  # the key _payments' unknown charge is bound to
}


async def _refused(
    broker: Broker, iid: str, action: dict[str, Any], call_id: str | None, names: str
) -> None:
    engine = broker._engine
    record = broker.record(iid)
    assert record is not None
    claim = approved.claim(engine, record, names)
    before = len(broker.journal.events(iid))
    with trio.fail_after(LIMIT), pytest.raises(ClaimInvalid) as refused:
        await engine.call(action, link={"reconciles": iid}, invocation_id=call_id, claim=claim)
    assert refused.value.code == "CLAIM_INVALID" and refused.value.field == "claim"
    assert len(broker.journal.events(iid)) == before  # no claim row
    for named in {names, call_id} - {None}:
        assert broker.events(named) == []  # nothing of the call
    assert broker.approvals() == []


@pytest.mark.parametrize(
    "which", ["names-another-call", "names-an-undrawn-id", "key-names-a-bound-invocation"]
)
async def test_a_claim_that_would_not_head_a_new_invocation_it_names_is_refused_unwritten(
    tmp_path: Path, token: str, which: str
) -> None:
    async with _payments(tmp_path) as (srv, broker, iid):
        posts = len(srv.requests)
        query = {"target": "api", "method": "GET", "path": "/v1/charges"}
        mine, other = new_invocation_id(), new_invocation_id()
        if which == "names-another-call":
            await _refused(broker, iid, query, mine, other)
        elif which == "names-an-undrawn-id":
            await _refused(broker, iid, query, None, other)
        else:
            # The key resolves to the unknown charge: resumed, it would be sent again, and
            # asked (if at all) under its own id, with no claim naming it.
            await _refused(broker, iid, CHARGE, mine, mine)
        assert len(srv.requests) == posts  # nothing sent
