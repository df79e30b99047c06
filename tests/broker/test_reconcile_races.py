"""A reconciliation query's own rows -- the one naming it before it is asked (``claim``), the one
closing it unsent, the one naming it still open -- raced by an operator's attestation, a same-key
retry, another asker: each answers a stable code, never a bare ImpossibleEvent (rvG finding 1).
Before, ``claim`` and the closing row re-raised the projection's refusal when no other query was
open, and the daemon answered it 500 INTERNAL.  Seed, "Never claim more than the records prove":
what the record shows now is the answer -- NOT_UNKNOWN, RETRIED_MEANWHILE, STILL_RUNNING,
QUERY_PENDING, or QUERY_SUPERSEDED for the row left open by a query that was asked.

Each race is held deterministically: the write is stopped just before the journal takes it
(``trio.Event``), the rival's write lands, and the held one goes on."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.approvals import OperatorError
from affidavit.reconcile.approved import ASKING, UNSENT, WAITING
from affidavit.statemachine import Event, EventKind

from .approvalkit import OPS
from .http_rows import LIMIT
from .test_reconcile_approval import _gets, _payments, _pending_queries

E = EventKind
Rival = Callable[[Broker, str], Awaitable[None]]


@contextlib.asynccontextmanager
async def _held(
    broker: Broker, monkeypatch: pytest.MonkeyPatch, reason: str, rival: Rival, iid: str
) -> AsyncIterator[list[str]]:
    """Hold the first row of ``iid`` with ``reason`` just before the journal takes it -- alone,
    or heading a call's first write (a claim: ``engine/takeup.py``) -- run ``rival`` meanwhile
    (its own task), then let the row go on.  Yields the ids of the calls whose first write
    (ACTION_ACCEPTED) was submitted meanwhile, filled as they are."""
    recorder = broker._engine.recorder
    real, real_many = recorder.append, recorder.write_many
    reached, done = trio.Event(), trio.Event()
    calls: list[str] = []

    async def hold(events: list[Event]) -> None:
        if not reached.is_set() and any(
            e.invocation_id == iid and e.attrs.get("reason") == reason for e in events
        ):
            reached.set()
            await done.wait()

    async def append(event: Event, *args: Any, **kwargs: Any) -> Any:
        await hold([event])
        return await real(event, *args, **kwargs)

    async def write_many(items: Any, **kwargs: Any) -> Any:
        calls.extend(event.invocation_id for event, _ in items if event.kind is E.ACTION_ACCEPTED)
        await hold([event for event, _ in items])
        return await real_many(items, **kwargs)

    async def race() -> None:
        await reached.wait()
        await rival(broker, iid)
        done.set()

    monkeypatch.setattr(recorder, "append", append)
    monkeypatch.setattr(recorder, "write_many", write_many)
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(race)
            yield calls
    assert reached.is_set() and done.is_set()  # the race was run, not skipped


async def _attested(broker: Broker, iid: str) -> None:
    await broker.reconcile(iid, attest="committed", note="found it", operator=OPS)


async def _retried(broker: Broker, iid: str, *, ended: bool) -> None:
    lease = await broker.journal.acquire_lease(iid, "worker-2", 60.0)
    if ended:  # the retry stopped in setup: unknown and at rest again, a newer generation
        setup = {"code": "CONNECTION_REFUSED", "stage": "tcp_connect"}
        event = Event(E.SETUP_FAILED, iid, {**setup, "generation": lease.generation})
        await broker.journal.append(event, barrier=True)


async def _retried_ended(broker: Broker, iid: str) -> None:
    await _retried(broker, iid, ended=True)


async def _retry_runs(broker: Broker, iid: str) -> None:
    await _retried(broker, iid, ended=False)


RACES = [
    (_attested, "NOT_UNKNOWN"),
    (_retried_ended, "RETRIED_MEANWHILE"),
    (_retry_runs, "STILL_RUNNING"),
]
IDS = ["an-operator-attests", "a-retry-ended-unknown", "a-retry-runs"]


@pytest.mark.parametrize(("rival", "code"), RACES, ids=IDS)
async def test_a_claim_raced_by_the_record_moving_answers_what_it_shows(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, rival: Rival, code: str
) -> None:
    async with _payments(tmp_path) as (srv, broker, iid):
        async with _held(broker, monkeypatch, ASKING, rival, iid) as calls:
            with pytest.raises(OperatorError) as refused:
                await broker.reconcile(iid, query=True)
        assert refused.value.code == code, refused.value.message
        assert _pending_queries(broker, iid) == []  # nothing asked
        # The late query's rows were refused with its claim: no record of it at all (with
        # its ACTION_ACCEPTED written alone, an open record asking nothing was left).
        assert len(calls) == 1 and broker.events(calls[0]) == []
    assert _gets(srv) == 0


@pytest.mark.parametrize(("rival", "code"), RACES, ids=IDS)
async def test_closing_an_unsent_query_raced_by_the_record_moving_answers_what_it_shows(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, rival: Rival, code: str
) -> None:
    async with _payments(tmp_path) as (srv, broker, iid):
        with trio.fail_after(LIMIT):
            await broker.reconcile(iid, query=True)  # waits for an operator: open
            (query_id,) = _pending_queries(broker, iid)
            await broker.deny(query_id, note="not now", operator=OPS)
        async with _held(broker, monkeypatch, UNSENT, rival, iid) as calls:
            with pytest.raises(OperatorError) as refused:
                await broker.reconcile(iid, query=True)  # takes the denied one up: closes it
        assert refused.value.code == code, refused.value.message
        assert _pending_queries(broker, iid) == []  # nothing asked anew
        assert all(broker.events(late) == [] for late in calls)  # nor any call begun
    assert _gets(srv) == 0


async def _another_opened(broker: Broker, iid: str) -> None:
    """Another broker closed the open query (its lease ran out, by that broker's judgement)
    and named its own."""
    record = broker.record(iid)
    assert record is not None
    rows = record.evidence["reconcile_queries"]
    mine = rows[-1]["query_invocation"]
    gen = {"generation": record.generation}
    closed = {"query_invocation": mine, "code": None, "reason": UNSENT, **gen}
    opened = {"query_invocation": "q-of-another-broker", "code": None, "reason": ASKING}
    for attrs in (closed, {**opened, "open": True, **gen}):
        await broker.journal.append(Event(E.RECONCILE_INCONCLUSIVE, iid, attrs), barrier=True)


async def test_a_query_left_open_while_another_is_open_answers_query_superseded(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The query was asked (it awaits an operator): never "nothing was asked" (QUERY_PENDING)
    # beside it -- superseded, naming the row that closed it and the query open now.
    async with _payments(tmp_path) as (srv, broker, iid):
        async with _held(broker, monkeypatch, WAITING, _another_opened, iid):
            answer = await broker.reconcile(iid, query=True)
        assert answer["reconciled"] is False
        assert answer["query"]["error"]["code"] == "APPROVAL_PENDING"
        message = answer["refused"]["message"]
        assert answer["refused"]["code"] == "QUERY_SUPERSEDED", answer["refused"]
        assert "another query q-of-another-broker is open" in message, message
        assert "nothing" not in message and UNSENT in message, message
    assert _gets(srv) == 0
