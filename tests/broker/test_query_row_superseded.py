"""The row an asker writes once its query returned (``open``: the query awaits an operator) is
refused while another query is open, and that one closes before the refusal reads the record.
The first query was asked -- its record stays, linked, and the answer shows it under ``query``
-- so the refusal says what the record shows: ``QUERY_SUPERSEDED``, naming the row that closed
the query (what it says of the query stands: another asker may have sent it and recorded its
real answer) and saying only that this answer was not recorded -- never "nothing was asked or
sent" (that is a refused claim's answer, ``test_claim_refused_closed``), nor the projection's
bare ``ImpossibleEvent`` (a 500).

The interleaving, forced: A's query Q comes back APPROVAL_PENDING; before A's row lands an
operator denies Q and B takes Q up -- closes it unsent, asks Q2; A's row is refused (Q2 open).
Either Q2 is still open when A reads the record (named), or it was closed (unsent, as an older
broker would) by then -- or before A's row landed: no query is open then, and A's row is refused
all the same, for naming a query a row already closed (before, it reopened Q, denied)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.approvals import OperatorError
from affidavit.reconcile import approved, refusals
from affidavit.statemachine import Event, EventKind, ImpossibleEvent, open_query

from .approvalkit import OPS
from .http_rows import LIMIT
from .test_reconcile_approval import _payments

E = EventKind


async def _close_unsent(broker: Broker, iid: str, query_id: str) -> None:
    record = broker.record(iid)
    assert record is not None
    attrs = {"query_invocation": query_id, "code": None, "reason": approved.UNSENT}
    row = Event(E.RECONCILE_INCONCLUSIVE, iid, {**attrs, "generation": record.generation})
    await broker.journal.append(row, barrier=True)


@pytest.mark.parametrize("q2_closed", ["open", "since", "before"], ids=lambda w: f"q2-{w}")
async def test_a_returned_query_whose_row_is_refused_by_another_query_is_superseded(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, q2_closed: str
) -> None:
    async with _payments(tmp_path) as (srv, broker, iid):
        recorder = broker._engine.recorder
        real_append, real_record = recorder.append, recorder.record
        raced: list[str] = []  # Q, then Q2
        refused = trio.Event()

        async def b_asks() -> None:
            answer = await broker.reconcile(iid, query=True)
            assert answer["query"]["error"]["code"] == "APPROVAL_PENDING"
            raced.append(answer["query"]["invocation_id"])

        async def append(event: Event, *args: Any, **kwargs: Any) -> Any:
            if not raced and event.invocation_id == iid and event.attrs.get("open") is True:
                raced.append(event.attrs["query_invocation"])  # A's row for Q, about to land
                await broker.deny(raced[0], note="not now", operator=OPS)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(b_asks)  # B: takes Q up (denied), closes it, asks Q2
                if q2_closed == "before":
                    await _close_unsent(broker, iid, raced.pop())  # Q2 closes before A's row
                try:
                    return await real_append(event, *args, **kwargs)
                except ImpossibleEvent:
                    refused.set()
                    raise
            return await real_append(event, *args, **kwargs)

        async def record(invocation_id: str, *args: Any, **kwargs: Any) -> Any:
            if (
                q2_closed == "since"
                and refused.is_set()
                and len(raced) == 2
                and invocation_id == iid
            ):
                await _close_unsent(broker, iid, raced.pop())  # Q2 closes before A reads
            return await real_record(invocation_id, *args, **kwargs)

        monkeypatch.setattr(recorder, "append", append)
        monkeypatch.setattr(recorder, "record", record)
        with trio.fail_after(LIMIT):
            answer = await broker.reconcile(iid, query=True)  # A
        assert refused.is_set() and raced and raced[0] == answer["query"]["invocation_id"]
        assert answer["query"]["error"]["code"] == "APPROVAL_PENDING"  # Q was asked
        assert answer["reconciled"] is False
        code, message = answer["refused"]["code"], answer["refused"]["message"]
        assert code == "QUERY_SUPERSEDED", message
        assert "nothing" not in message and raced[0] in message, message
        # The row that closed Q is named, with what it says; only A's answer is disowned.
        closer = [
            e
            for e in broker.events(iid)
            if e.attrs.get("query_invocation") == raced[0] and "open" not in e.attrs
        ]
        assert len(closer) == 1, closer
        assert f"closed since by seq {closer[0].seq}: " in message, message
        assert approved.UNSENT in message, message
        assert "this answer of it (APPROVAL_PENDING) was not recorded" in message, message
        assert "not taken into the record" not in message, message
        assert broker.events(raced[0])  # Q's record stays
        after = broker.record(iid)
        assert after is not None
        now = open_query(after.evidence["reconcile_queries"], after.generation)
        if q2_closed != "open":
            assert now is None and "has closed since" in message, message
        else:
            assert now is not None and now != raced[0], now
            assert f"another query {now} is open" in message, message
    assert not any(r.method == "GET" for r in srv.requests)  # nothing sent


async def test_a_refused_row_that_is_no_claim_is_never_answered_query_pending(
    tmp_path: Path, token: str
) -> None:
    # QUERY_PENDING says "nothing more was asked or sent": true of a refused claim only.  A
    # query's closing row refused while another query is open (no race the projection has:
    # a bug) answers ROW_REFUSED -- never a retryable QUERY_PENDING for a query that was sent.
    async with _payments(tmp_path) as (srv, broker, iid):
        record = broker.record(iid)
        assert record is not None
        at = {"generation": record.generation}
        other = {"query_invocation": "act_q2", "code": None, "reason": "asking", "open": True}
        await broker.journal.append(Event(E.RECONCILE_INCONCLUSIVE, iid, {**other, **at}))
        closing = {"query_invocation": "act_q1", "code": None, "reason": "no match", **at}
        refused = ImpossibleEvent(Event(E.RECONCILE_INCONCLUSIVE, iid, closing), "x", "a bug")
        answer = await refusals.refusal(broker._engine, refused)
        assert getattr(answer, "code", None) == "ROW_REFUSED", answer
        claim = ImpossibleEvent(
            Event(E.RECONCILE_INCONCLUSIVE, iid, {**closing, "open": True}), "x", "r"
        )
        answer = await refusals.refusal(broker._engine, claim, claim=True)
        assert getattr(answer, "code", None) == "QUERY_PENDING", answer  # a claim's, as before
    assert not any(r.method == "GET" for r in srv.requests)


async def test_a_returned_query_whose_row_no_race_explains_is_refused_keeps_its_answer(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The query was sent and came back; its row is refused for a reason the record as read
    # does not explain (forced here: a bug).  Before, the bare ImpossibleEvent was raised out
    # of Broker.reconcile -- a traceback from the CLI, INTERNAL from MCP -- and the query's
    # answer was lost.  Now: answered, ``refused`` ROW_REFUSED beside the query's answer.
    async with _payments(tmp_path) as (srv, broker, iid):
        recorder = broker._engine.recorder
        real_append = recorder.append

        async def append(event: Event, *args: Any, **kwargs: Any) -> Any:
            if event.invocation_id == iid and event.attrs.get("code") == "APPROVAL_PENDING":
                raise ImpossibleEvent(event, "interrupted", "forced: a bug")
            return await real_append(event, *args, **kwargs)

        monkeypatch.setattr(recorder, "append", append)
        with trio.fail_after(LIMIT):
            answer = await broker.reconcile(iid, query=True)
        assert answer["reconciled"] is False
        assert answer["query"]["error"]["code"] == "APPROVAL_PENDING"  # the answer, kept
        refused = answer["refused"]
        assert refused["code"] == "ROW_REFUSED", refused
        query_id = answer["query"]["invocation_id"]
        assert "forced: a bug" in refused["message"]
        assert f"the query {query_id} was asked" in refused["message"]  # it ran: asked
        assert broker.events(query_id)  # the query's record stays
    assert not any(r.method == "GET" for r in srv.requests)  # awaits an operator: not sent


async def test_a_refused_row_closing_an_unsent_query_never_says_it_was_asked(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The row that closes an open query nothing was sent for (``approved._close``: denied) is
    # refused for a reason no race explains (forced: a bug).  ROW_REFUSED names the query but
    # never says it "was asked": this request ran nothing, and nothing was sent.
    async with _payments(tmp_path) as (srv, broker, iid):
        with trio.fail_after(LIMIT):
            first = await broker.reconcile(iid, query=True)
            query_id = first["query"]["invocation_id"]
            await broker.deny(query_id, note="not now", operator=OPS)
        recorder = broker._engine.recorder
        real_append = recorder.append

        async def append(event: Event, *args: Any, **kwargs: Any) -> Any:
            if event.invocation_id == iid and event.attrs.get("reason") == approved.UNSENT:
                raise ImpossibleEvent(event, "interrupted", "forced: a bug")
            return await real_append(event, *args, **kwargs)

        monkeypatch.setattr(recorder, "append", append)
        with trio.fail_after(LIMIT), pytest.raises(OperatorError) as refused:
            await broker.reconcile(iid, query=True)
        assert refused.value.code == "ROW_REFUSED"
        message = refused.value.message
        assert "forced: a bug" in message and query_id in message
        assert "was asked" not in message, message
    assert not any(r.method == "GET" for r in srv.requests)  # nothing sent


async def test_a_returned_query_closed_meanwhile_with_no_query_opened_since_names_none(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A's Q comes back APPROVAL_PENDING; before A's row lands, Q is approved and B takes it
    # up, sends it, reads an inconclusive answer and closes Q without asking again.  A's row
    # is refused QUERY_SUPERSEDED -- and no other query was ever opened: the message says no
    # query is open now, never "another query was opened meanwhile".
    async with _payments(tmp_path) as (srv, broker, iid):
        recorder = broker._engine.recorder
        real_append = recorder.append
        raced: list[str] = []

        async def append(event: Event, *args: Any, **kwargs: Any) -> Any:
            if not raced and event.invocation_id == iid and event.attrs.get("open") is True:
                raced.append(event.attrs["query_invocation"])  # A's row for Q, about to land
                record = broker.record(iid)
                assert record is not None
                closing = {"query_invocation": raced[0], "code": "HTTP_STATUS"}
                row = {**closing, "reason": "no match", "generation": record.generation}
                await real_append(Event(E.RECONCILE_INCONCLUSIVE, iid, row), barrier=True)
            return await real_append(event, *args, **kwargs)

        monkeypatch.setattr(recorder, "append", append)
        with trio.fail_after(LIMIT):
            answer = await broker.reconcile(iid, query=True)  # A
        assert raced and raced[0] == answer["query"]["invocation_id"]
        code, message = answer["refused"]["code"], answer["refused"]["message"]
        assert code == "QUERY_SUPERSEDED", message
        assert "no query is open now" in message, message
        assert "another query" not in message, message
    assert not any(r.method == "GET" for r in srv.requests)  # A's query awaits an operator
