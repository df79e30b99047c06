"""``Engine.call(claim=...)`` refuses a claim that would not head a new invocation it names,
before anything is written (``takeup.ClaimInvalid``, a stable code) -- design every interface
as if the caller were hostile.  Before, a claim naming another call was written as given, and
one heading a call whose idempotency key named a bound invocation was dropped (the call
resumed, taken over or fetched under the bound id): an approval asked with no claim naming it,
a card no claim accounts for -- and the resumed call sent again."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.engine import new_invocation_id
from affidavit.engine.takeup import ClaimInvalid, ClaimRefused, check_claim
from affidavit.reconcile import approved
from affidavit.statemachine import Event, EventKind, open_query

from .approvalkit import OPS
from .http_rows import LIMIT
from .test_query_row_superseded import _close_unsent
from .test_reconcile_approval import _gets, _payments

CHARGE = {
    "target": "api",
    "method": "POST",
    "path": "/v1/charges",
    "body": json.dumps({"drop": True}),
    "idempotency_key": "k1",  # the key _payments' unknown charge is bound to
}


async def _refused(
    broker: Broker,
    iid: str,
    action: dict[str, Any],
    call_id: str | None,
    names: str,
    *,
    shape: Callable[[Event], Event] = lambda claim: claim,
    link: dict[str, str] | None = None,
) -> None:
    """``engine.call`` with a query's claim naming ``names`` (altered by ``shape``) under
    ``link`` (a query's of ``iid``) is refused CLAIM_INVALID, nothing written or asked."""
    engine = broker._engine
    record = broker.record(iid)
    assert record is not None
    claim = shape(approved.claim(engine, record, names))
    link = link if link is not None else {"reconciles": iid}
    before = len(broker.journal.events(iid))
    with trio.fail_after(LIMIT), pytest.raises(ClaimInvalid) as refused:
        await engine.call(action, link=link, invocation_id=call_id, claim=claim)
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


def _as_poll(claim: Event, op_id: str = "op_1") -> Event:
    """``claim`` reshaped as a poll's: OPERATION_POLL_FAILED naming ``poll_invocation``."""
    attrs = {k: v for k, v in claim.attrs.items() if k != "query_invocation"}
    named = {"operation_id": op_id, "poll_invocation": claim.attrs["query_invocation"]}
    return Event(EventKind.OPERATION_POLL_FAILED, claim.invocation_id, {**attrs, **named})


def _renamed(claim: Event) -> Event:
    """A query's row naming its call by a poll's attribute."""
    attrs = {k: v for k, v in claim.attrs.items() if k != "query_invocation"}
    named = {"poll_invocation": claim.attrs["query_invocation"]}
    return Event(claim.kind, claim.invocation_id, {**attrs, **named})


@pytest.mark.parametrize(
    "which",
    [
        "a-poll-claim-under-a-query-link",
        "a-query-row-naming-by-poll_invocation",
        "a-query-claim-under-a-poll-link",
        "a-poll-claim-of-another-operation",
    ],
)
async def test_a_claim_whose_kind_and_name_do_not_match_the_link_is_refused_unwritten(
    tmp_path: Path, token: str, which: str
) -> None:
    # A query's claim is a RECONCILE_INCONCLUSIVE naming query_invocation under a link
    # ``reconciles``; a poll's an OPERATION_POLL_FAILED naming poll_invocation of the
    # operation its link (``operation``, ``invocation``) names -- any other pairing would put
    # on the record a row no asker of that call looks for.
    async with _payments(tmp_path) as (srv, broker, iid):
        posts = len(srv.requests)
        query = {"target": "api", "method": "GET", "path": "/v1/charges"}
        mine = new_invocation_id()
        poll_link = {"operation": "op_1", "invocation": iid}
        if which == "a-poll-claim-under-a-query-link":
            await _refused(broker, iid, query, mine, mine, shape=_as_poll)
        elif which == "a-query-row-naming-by-poll_invocation":
            await _refused(broker, iid, query, mine, mine, shape=_renamed)
        elif which == "a-query-claim-under-a-poll-link":
            await _refused(broker, iid, query, mine, mine, link=poll_link)
        else:
            record = broker.record(iid)
            assert record is not None
            poll = _as_poll(approved.claim(broker._engine, record, mine))
            check_claim(poll, mine, poll_link)  # its own operation's: the claim a poll makes
            shape = lambda c: _as_poll(c, "op_2")  # noqa: E731
            await _refused(broker, iid, query, mine, mine, shape=shape, link=poll_link)
        assert len(srv.requests) == posts  # nothing sent


async def test_a_claim_naming_a_call_that_has_a_record_is_refused_unwritten(
    tmp_path: Path, token: str
) -> None:
    # A claim names a new call (``new_invocation_id``): one naming a query a row already
    # closed would, folded as written, reopen it (a denied query open again).  The writer
    # refuses it -- the id it names has a record -- and nothing of the call is written.
    async with _payments(tmp_path) as (srv, broker, iid):
        query = {"target": "api", "method": "GET", "path": "/v1/charges"}
        with trio.fail_after(LIMIT):
            first = await broker.reconcile(iid, query=True)
            closed = first["query"]["invocation_id"]
            await broker.deny(closed, note="not now", operator=OPS)
            await _close_unsent(broker, iid, closed)  # as the next asker closes it
            record = broker.record(iid)
            assert record is not None
            claim = approved.claim(broker._engine, record, closed)
            before, theirs = len(broker.journal.events(iid)), len(broker.events(closed))
            with pytest.raises(ClaimRefused) as refused:
                await broker._engine.call(
                    query, link={"reconciles": iid}, invocation_id=closed, claim=claim
                )
        assert f"{closed} already has a record" in str(refused.value)
        assert len(broker.journal.events(iid)) == before  # no claim row
        assert len(broker.events(closed)) == theirs  # nothing of the call
        record = broker.record(iid)
        assert record is not None
        assert open_query(record.evidence["reconcile_queries"], record.generation) is None
        assert broker.approvals() == [] and _gets(srv) == 0
