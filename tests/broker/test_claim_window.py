"""A linked call's claim and its first rows are one journal write (``engine/takeup.py``): a
claim exists exactly when its call does.  Before, the claim was its own transaction and the
call's ACTION_ACCEPTED another: an asker whose journal write stalled between the two past the
claim's deadline still asked -- meanwhile its claim lapsed, another asker closed it and asked,
and two approval cards waited on the operator's list for one question.

Seed, "Never claim more than the records prove": a claim with no call proves nothing is asked.
Now the stalled asker's claim lands, if at all, with its call's rows, refused together while
the other's is open: one card, and the late asker answered QUERY_PENDING / POLL_PENDING with
nothing asked.  The stall is held deterministically (``trio.Event``): the first asker's write
carrying the call's ACTION_ACCEPTED is stopped before the journal takes it, the clock leases are
judged by moved past the claim's deadline, the second asker asks, then the held write goes on."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.approvals import OperatorError
from affidavit.engine import OperationError
from affidavit.statemachine import Event, EventKind, invocation_of

from .http_rows import LIMIT
from .test_poll_approval import _jobs
from .test_reconcile_approval import _gets, _payments, _pending_queries

E = EventKind
Ask = Callable[[], Awaitable[Any]]


async def _stalled_write(
    broker: Broker,
    monkeypatch: pytest.MonkeyPatch,
    linked: Callable[[Mapping[str, Any]], bool],
    first: Ask,
    second: Ask,
) -> BaseException | Any:
    """Run ``first`` until its journal write carrying a linked call's ACTION_ACCEPTED
    (``linked(link)``) is about to be taken; hold it there while the journal's clock moves past
    every claim's deadline and ``second`` asks; then let the write go on.  Returns ``first``'s
    answer, or the refusal it raised."""
    journal = broker.journal
    real = journal.post_many
    reached, go = trio.Event(), trio.Event()

    held: list[str] = []

    async def post_many(items: Sequence[tuple[Event, Any]], **kwargs: Any) -> Any:
        if not reached.is_set():
            for e, _ in items:
                if e.kind is E.ACTION_ACCEPTED and linked(e.attrs.get("link") or {}):
                    held.append(e.invocation_id)
                    reached.set()
                    await go.wait()
                    break
        return await real(items, **kwargs)

    answers: list[BaseException | Any] = []

    async def ask_first() -> None:
        try:
            answers.append(await first())
        except (OperatorError, OperationError) as exc:
            answers.append(exc)

    monkeypatch.setattr(journal, "post_many", post_many)
    lapse = broker._engine.lease_ttl(next(iter(broker.config.targets.values())), None)
    lapse += broker._engine.settings.lease_margin + 5.0
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask_first)
            await reached.wait()
            # The stall outlasts the claim: the clock leases are judged by, past its deadline.
            monkeypatch.setattr(journal, "_clock", lambda: time.time() + lapse)
            await second()
            go.set()
    assert reached.is_set() and len(answers) == 1
    # Nothing of the late call is on record: its rows were refused with its claim.
    assert broker.events(held[0]) == []
    return answers[0]


async def test_an_asker_stalled_between_claim_and_call_asks_nothing_once_another_asked(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with _payments(tmp_path) as (srv, broker, iid):
        second: list[dict[str, Any]] = []

        async def ask_second() -> None:
            second.append(await broker.reconcile(iid, query=True))

        late = await _stalled_write(
            broker,
            monkeypatch,
            lambda link: link.get("reconciles") == iid,
            lambda: broker.reconcile(iid, query=True),
            ask_second,
        )
        query_id = second[0]["query"]["invocation_id"]
        assert second[0]["query"]["error"]["code"] == "APPROVAL_PENDING"
        assert [c["invocation_id"] for c in broker.approvals()] == [query_id]  # one card
        assert _pending_queries(broker, iid) == [query_id]
        assert isinstance(late, OperatorError), late
        assert late.code == "QUERY_PENDING", late.message
        assert query_id in late.message
    assert _gets(srv) == 0


async def test_a_poll_stalled_between_claim_and_call_asks_nothing_once_another_asked(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with _jobs(tmp_path) as (srv, broker, op_id):
        iid = invocation_of(op_id)
        second: list[dict[str, Any]] = []

        async def ask_second() -> None:
            second.append(await broker.poll_operation(op_id))

        late = await _stalled_write(
            broker,
            monkeypatch,
            lambda link: link.get("operation") == op_id and link.get("invocation") == iid,
            lambda: broker.poll_operation(op_id),
            ask_second,
        )
        poll_id = second[0]["poll"]["invocation_id"]
        assert second[0]["poll"]["error"]["code"] == "APPROVAL_PENDING"
        assert [c["invocation_id"] for c in broker.approvals()] == [poll_id]  # one card
        assert isinstance(late, OperationError), late
        assert late.code == "POLL_PENDING", str(late)
        assert poll_id in str(late)
    assert _gets(srv) == 0
