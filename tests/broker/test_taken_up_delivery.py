"""A poll taken up -- asked by one request, approved, sent by the daemon's dispatcher (stored,
reaching no one), its answer carried by the next poll -- is delivered by that answer when its
asker is the one who asked (seed: "Mark RESULT_DELIVERED only after the protocol has confirmed
complete transfer"): RESULT_DELIVERED (channel ``deliver``) once written whole.  Another uid's
take-up reads it, recording nothing -- a poll asked in-process is this process's uid's.
Before, a taken-up poll was never recorded delivered, whoever's answer carried it.  A
reconciliation query taken up the same way (asked, approved, sent by the dispatcher, its answer
carried by the next query) goes through the same ``taken_up`` (reconcile/service.py): the same
cases."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from .approvalkit import OPS
from .http_rows import LIMIT
from .test_poll_approval import _jobs
from .test_reconcile_approval import _payments

ASKER = 5151


async def _written(answer: dict[str, Any]) -> None:
    """The answer went out whole."""


CASES = pytest.mark.parametrize(
    ("asker", "taker", "recorded"),
    [
        (ASKER, ASKER, ["RESULT_DELIVERED"]),
        (ASKER, ASKER + 1, []),
        (None, ASKER, []),
        (None, None, ["RESULT_DELIVERED"]),
    ],
    ids=["its-asker", "another-uid", "in-process-asker-another-uid", "in-process-both"],
)


@CASES
async def test_a_taken_up_poll_is_delivered_only_to_its_asker(
    tmp_path: Path, token: str, asker: int | None, taker: int | None, recorded: list[str]
) -> None:
    """``None``: in-process, this process's uid -- a daemon peer of another uid taking up a poll
    asked in-process reads it (before, the in-process poll named no requester, and any
    taker's answer recorded its delivery)."""
    async with _jobs(tmp_path) as (_srv, broker, op_id):
        with trio.fail_after(LIMIT):
            first = await broker.poll_operation(op_id, requester=asker)
            poll_id = first["poll"]["invocation_id"]
            await broker.approve(poll_id, note="read it", operator=OPS)
            assert await broker.dispatch_approved(poll_id) is not None  # stored, reaching no one
            answer = await broker.poll_operation(op_id, requester=taker, deliver=_written)
            await broker.settled()
        assert answer["poll"]["invocation_id"] == poll_id  # taken up, not asked again
        rows = [e.kind.value for e in broker.events(poll_id)]
        assert [k for k in rows if k.startswith("RESULT_DELIVER")] == recorded


@CASES
async def test_a_taken_up_query_is_delivered_only_to_its_asker(
    tmp_path: Path, token: str, asker: int | None, taker: int | None, recorded: list[str]
) -> None:
    async with _payments(tmp_path) as (_srv, broker, iid):
        with trio.fail_after(LIMIT):
            first = await broker.reconcile(iid, query=True, requester=asker)
            query_id = first["query"]["invocation_id"]
            await broker.approve(query_id, note="read it", operator=OPS)
            assert await broker.dispatch_approved(query_id) is not None  # stored, reaching no one
            answer = await broker.reconcile(iid, query=True, requester=taker, deliver=_written)
            await broker.settled()
        assert answer["query"]["invocation_id"] == query_id  # taken up, not asked again
        assert answer["reconciled"] is True
        rows = [e.kind.value for e in broker.events(query_id)]
        assert [k for k in rows if k.startswith("RESULT_DELIVER")] == recorded


async def _gone(answer: dict[str, Any]) -> None:
    raise ConnectionError("the caller hung up")


async def test_a_taken_up_poll_whose_fetch_failed_is_delivered_by_the_next_answer(
    tmp_path: Path, token: str
) -> None:
    """Its asker's fetch of the poll was cut (RESULT_DELIVERY_FAILED: the result stays stored,
    fetchable); its next poll takes the poll up and that answer is written whole: delivered,
    as a fetch would have been (any state awaiting delivery, not only one just stored).
    Before, only a result just stored was recorded delivered by the carrying answer: nothing
    was recorded, the journal kept saying its asker never got it.  (Two polls taking up the
    same poll, the first one's answer cut, meet the same code.)"""
    async with _jobs(tmp_path) as (_srv, broker, op_id):
        with trio.fail_after(LIMIT):
            first = await broker.poll_operation(op_id, requester=ASKER)
            poll_id = first["poll"]["invocation_id"]
            await broker.approve(poll_id, note="read it", operator=OPS)
            assert await broker.dispatch_approved(poll_id) is not None  # stored, reaching no one
            await broker.fetch_result(poll_id, reader=ASKER, deliver=_gone)
            answer = await broker.poll_operation(op_id, requester=ASKER, deliver=_written)
            await broker.settled()
        assert answer["poll"]["invocation_id"] == poll_id  # taken up, not asked again
        rows = [e.kind.value for e in broker.events(poll_id)]
        assert [k for k in rows if k.startswith("RESULT_DELIVER")] == [
            "RESULT_DELIVERY_FAILED",
            "RESULT_DELIVERED",
        ]
