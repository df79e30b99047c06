"""An asker stopped after its query's (poll's) first write committed -- the claim, the call's
ACTION_ACCEPTED and PREFLIGHT_VALIDATED -- and before its APPROVAL_REQUESTED: the record
proves the question is being asked, no more (nothing is on the operator's list, nothing was
sent).  The next asker is answered QUERY_PENDING / POLL_PENDING, "being asked" (not "being
sent": no DISPATCH_STARTED is on record), until the stopped call's lease runs out; then
recovery closes it, nothing sent, and the next asker asks anew -- one card.

The stop is a process's death as the broker sees it: the asker's task ends with a
BaseException at its APPROVAL_REQUESTED write (not an ``Exception``, which the engine would
close as an internal failure), its first write settled before."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.approvals import OperatorError
from affidavit.engine import OperationError, recovery
from affidavit.statemachine import Event, EventKind

from .http_rows import LIMIT
from .test_poll_approval import _jobs
from .test_reconcile_approval import _payments

E = EventKind


class Killed(BaseException):
    """The asker's process died here."""


def _asks(flow: str, broker: Broker, key: str) -> Callable[[], Awaitable[dict[str, Any]]]:
    if flow == "query":
        return lambda: broker.reconcile(key, query=True)
    return lambda: broker.poll_operation(key)


def _answer(flow: str, answer: dict[str, Any]) -> dict[str, Any]:
    envelope: dict[str, Any] = answer["query" if flow == "query" else "poll"]
    return envelope


@contextlib.asynccontextmanager
async def _killed_at_request(
    broker: Broker, monkeypatch: pytest.MonkeyPatch, ask: Callable[[], Awaitable[Any]]
) -> AsyncIterator[str]:
    """Run ``ask`` until its APPROVAL_REQUESTED write, its first write committed; yield its
    call's id; on leaving (the body done, or failed), end it there (``Killed``)."""
    recorder = broker._engine.recorder
    real = recorder.write
    reached, kill = trio.Event(), trio.Event()
    ids: list[str] = []

    async def write(event: Event, *args: Any, **kwargs: Any) -> Any:
        if event.kind is E.APPROVAL_REQUESTED and not reached.is_set():
            await recorder.settle()  # the first write committed
            ids.append(event.invocation_id)
            reached.set()
            await kill.wait()
            raise Killed
        return await real(event, *args, **kwargs)

    async def asker() -> None:
        with pytest.raises(Killed):
            await ask()

    monkeypatch.setattr(recorder, "write", write)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(asker)
            await reached.wait()
            try:
                yield ids[0]
            finally:
                kill.set()  # the asker dies
    finally:
        monkeypatch.setattr(recorder, "write", real)


@pytest.mark.parametrize("flow", ["query", "poll"])
async def test_an_asker_stopped_before_asking_holds_the_question_until_its_lease_runs_out(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, flow: str
) -> None:
    fixture = _payments(tmp_path) if flow == "query" else _jobs(tmp_path)
    pending = "QUERY_PENDING" if flow == "query" else "POLL_PENDING"
    async with fixture as (srv, broker, key):
        ask = _asks(flow, broker, key)
        with trio.fail_after(LIMIT):
            async with _killed_at_request(broker, monkeypatch, ask) as stopped:
                kinds = [e.kind for e in broker.events(stopped)]
                assert kinds == [E.ACTION_ACCEPTED, E.PREFLIGHT_VALIDATED]  # not asked yet
            for _ in range(2):  # while its lease runs: being asked, nothing more
                with pytest.raises((OperatorError, OperationError)) as refused:
                    await ask()
                code = getattr(refused.value, "code", None)
                assert code == pending, refused.value
                assert stopped in str(refused.value) and "is being asked" in str(refused.value)
                assert broker.approvals() == []
            # Past its lease -- by the wall clock recovery reads, the boot clock it checks it
            # by, and the clock the journal judges the close by: recovered (nothing was
            # sent), a new one is asked.
            lapse = broker._engine.lease_ttl(next(iter(broker.config.targets.values())), None)
            lapse += broker._engine.settings.lease_margin + 5.0
            later = SimpleNamespace(time=lambda: time.time() + lapse)
            monkeypatch.setattr(recovery, "time", later)
            monkeypatch.setattr(recovery, "boot_lapsed", lambda *_: True)
            monkeypatch.setattr(broker.journal, "_clock", later.time)
            anew = _answer(flow, await ask())
        assert anew["error"]["code"] == "APPROVAL_PENDING"
        assert anew["invocation_id"] != stopped
        assert [c["invocation_id"] for c in broker.approvals()] == [anew["invocation_id"]]
        record = broker.record(stopped)
        assert record is not None and record.final
        assert not record.evidence.get("dispatch_started")
    assert not any(r.method == "GET" for r in srv.requests)
