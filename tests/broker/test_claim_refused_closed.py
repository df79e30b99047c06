"""A claim refused while another asker's query (or poll) was open, that one closed by the time
the refusal reads the record: a race like the others, answered QUERY_PENDING / POLL_PENDING
(409: ask again -- nothing was asked or sent), never the projection's bare ``ImpossibleEvent``
(the daemon's 500) nor OPERATION_ERROR (422: nothing for the caller to fix).

The interleaving is forced: the late asker's first write is held (``_held``) while the other
asks, then goes on and is refused; the read that follows the refusal first closes the other's
query or poll (an older broker closing it unsent, as ``_another_opened`` does)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.approvals import OperatorError
from affidavit.engine import OperationError, credential
from affidavit.engine import operations as ops
from affidavit.engine.takeup import ClaimRefused
from affidavit.reconcile import approved
from affidavit.secrets.credentials import CredentialError
from affidavit.statemachine import Code, Event, EventKind, invocation_of, open_query

from .http_rows import LIMIT
from .test_poll_approval import _jobs
from .test_reconcile_approval import _payments
from .test_reconcile_races import _held

E = EventKind
Close = Callable[[Broker, str], Awaitable[None]]


async def _refused_then_closed(
    broker: Broker,
    monkeypatch: pytest.MonkeyPatch,
    iid: str,
    reason: str,
    rival: Callable[[Broker, str], Awaitable[None]],
    ask: Callable[[], Awaitable[Any]],
    close: Close,
) -> tuple[Exception, list[str]]:
    engine = broker._engine
    real_call, real_record = engine.call, engine.recorder.record
    armed, closed = trio.Event(), trio.Event()

    async def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return await real_call(*args, **kwargs)
        except ClaimRefused:
            armed.set()
            raise

    async def record(invocation_id: str, *args: Any, **kwargs: Any) -> Any:
        if armed.is_set() and not closed.is_set() and invocation_id == iid:
            closed.set()
            await close(broker, iid)
        return await real_record(invocation_id, *args, **kwargs)

    monkeypatch.setattr(engine, "call", call)
    monkeypatch.setattr(engine.recorder, "record", record)
    async with _held(broker, monkeypatch, reason, rival, iid) as calls:
        with pytest.raises((OperatorError, OperationError)) as refused:
            await ask()
    assert armed.is_set() and closed.is_set()  # the race was run
    assert len(calls) == 2  # the late call's first write (held), then the other's
    assert broker.events(calls[0]) == []  # nothing of the late call
    assert isinstance(refused.value, Exception)
    return refused.value, calls


async def test_a_query_claim_refused_by_a_query_closed_since_answers_query_pending(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def rival(broker: Broker, iid: str) -> None:
        answer = await broker.reconcile(iid, query=True)
        assert answer["query"]["error"]["code"] == "APPROVAL_PENDING"

    async def close(broker: Broker, iid: str) -> None:
        record = broker.record(iid)
        assert record is not None
        query_id = open_query(record.evidence["reconcile_queries"], record.generation)
        attrs = {"query_invocation": query_id, "code": None, "reason": approved.UNSENT}
        row = Event(E.RECONCILE_INCONCLUSIVE, iid, {**attrs, "generation": record.generation})
        await broker.journal.append(row, barrier=True)

    async with _payments(tmp_path) as (srv, broker, iid):
        with trio.fail_after(LIMIT):
            refused, _ = await _refused_then_closed(
                broker,
                monkeypatch,
                iid,
                approved.ASKING,
                rival,
                lambda: broker.reconcile(iid, query=True),
                close,
            )
        assert isinstance(refused, OperatorError), refused
        assert (refused.code, refused.status) == ("QUERY_PENDING", 409), refused.message
    assert not any(r.method == "GET" for r in srv.requests)


async def test_a_poll_claim_refused_by_a_poll_closed_since_answers_poll_pending(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with _jobs(tmp_path) as (srv, broker, op_id):

        async def rival(broker: Broker, iid: str) -> None:
            answer = await broker.poll_operation(op_id)
            assert answer["poll"]["error"]["code"] == "APPROVAL_PENDING"

        async def close(broker: Broker, iid: str) -> None:
            record = broker.record(iid)
            assert record is not None and record.operation is not None
            poll_id = record.operation["open_poll"]
            attrs = {"operation_id": op_id, "poll_invocation": poll_id, "code": None}
            row = Event(E.OPERATION_POLL_FAILED, iid, {**attrs, "reason": ops.UNSENT})
            await broker.journal.append(row, barrier=True)

        with trio.fail_after(LIMIT):
            refused, _ = await _refused_then_closed(
                broker,
                monkeypatch,
                invocation_of(op_id),
                ops.ASKING,
                rival,
                lambda: broker.poll_operation(op_id),
                close,
            )
        assert isinstance(refused, OperationError), refused
        assert (refused.code, refused.status, refused.field) == ("POLL_PENDING", 409, None)
    assert not any(r.method == "GET" for r in srv.requests)


async def test_a_query_refused_with_its_claim_logs_no_credential_failure(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The late asker's credential fails (its first write then goes with CREDENTIAL_FAILED)
    # while another's query is open: its claim is refused, and every row of its call with it.
    # The operator's CREDENTIAL_FAILED line names the call and the credential's detail: logged
    # for a call never written, it claimed one (before, the line came ahead of the write).
    real = credential.prepare_request
    detail = "env:NOT_SET_FOR_THIS_TEST is not set"

    def prepare(*args: Any, **kwargs: Any) -> Any:
        if not failed:
            failed.append(True)
            raise CredentialError(Code.CREDENTIAL_MISSING, "no credential", detail=detail)
        return real(*args, **kwargs)

    failed: list[bool] = []

    async def rival(broker: Broker, iid: str) -> None:
        answer = await broker.reconcile(iid, query=True)
        assert answer["query"]["error"]["code"] == "APPROVAL_PENDING"

    async with _payments(tmp_path) as (srv, broker, iid):
        monkeypatch.setattr(credential, "prepare_request", prepare)
        caplog.set_level(logging.WARNING)
        with trio.fail_after(LIMIT):
            async with _held(broker, monkeypatch, approved.ASKING, rival, iid) as calls:
                with pytest.raises(OperatorError) as refused:
                    await broker.reconcile(iid, query=True)
        assert refused.value.code == "QUERY_PENDING", refused.value.message
        assert failed and len(calls) == 2 and broker.events(calls[0]) == []
        logged = [r.getMessage() for r in caplog.records]
        assert not [line for line in logged if calls[0] in line or detail in line], logged
    assert not any(r.method == "GET" for r in srv.requests)
