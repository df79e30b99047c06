"""The daemon's start-up recovery closes the records a stopped broker left open together
(``Engine._close_open``): their writes share the writer's transactions, so a journal left
with many open records is closed in a fraction of a transaction per record -- and each record
is closed exactly as alone (unknown once dispatched), the first failure raised as itself."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

import affidavit.engine.engine as engine_module
from affidavit.journal import Batch, JournalWriteError
from affidavit.statemachine import Outcome
from affidavit.text import NAMED
from tests.journal.helpers import until_dispatch

from .helpers import http_target, open_broker, write_config

OPEN = 64


async def _left_open(broker: Any) -> list[str]:
    """``OPEN`` records dispatched by a broker that stopped: DISPATCH_STARTED, nothing after."""
    iids = [f"inv-open-{i:03d}" for i in range(OPEN)]
    for iid in iids:
        for ev in until_dispatch(iid):
            await broker.journal.append(ev)
    return iids


def _count(broker: Any) -> list[Batch]:
    batches: list[Batch] = []

    @contextlib.contextmanager
    def counted(batch: Batch) -> Iterator[None]:
        batches.append(batch)
        yield

    broker.journal.around_transaction = counted
    return batches


async def test_open_records_are_closed_together_each_as_alone(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, {"payments": http_target("http://127.0.0.1:9")})
    async with open_broker(cfg) as broker:
        iids = await _left_open(broker)
        batches = _count(broker)
        with trio.fail_after(30):
            closed = await broker._engine.recover_orphans()
        assert [r.invocation_id for r in closed] == iids  # oldest first, every one
        for r in closed:
            assert r.final and r.outcome is Outcome.UNKNOWN, r
            assert broker.record(r.invocation_id) == r
        # One by one this took a transaction per record (64); together they share them.
        assert len(batches) <= OPEN // 4, [b.writes for b in batches]
        assert sum(b.writes for b in batches) >= OPEN
        assert await broker._engine.recover_orphans() == []  # nothing left open
        # Each worker is a task of its own: what the recorder kept for it is released when it
        # ends, not held (keyed by a dead task) for the daemon's life.
        recorder = broker._engine.recorder
        assert recorder._writing == {} and recorder._posted == {}


async def test_the_first_failure_stops_the_rest_and_is_raised_as_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = write_config(tmp_path, {"payments": http_target("http://127.0.0.1:9")})
    real = engine_module.recover_stale

    async def recover_stale(recorder: Any, record: Any, **kwargs: Any) -> Any:
        if record.invocation_id == "inv-open-005":
            raise JournalWriteError("journal: write not committed (injected)")
        return await real(recorder, record, **kwargs)

    async with open_broker(cfg) as broker:
        await _left_open(broker)
        monkeypatch.setattr(engine_module, "recover_stale", recover_stale)
        with trio.fail_after(30), pytest.raises(JournalWriteError, match="injected"):
            await broker._engine.recover_orphans()
        assert broker._engine.recorder._writing == {}  # released on the failure's way too


async def test_a_fetch_that_closes_a_stale_record_releases_what_the_recorder_kept(
    tmp_path: Path,
) -> None:
    """``fetch_result`` writes (it closes a record its stopped holder left open): the caller's
    task is not remembered after it, as a call's is not."""
    cfg = write_config(tmp_path, {"payments": http_target("http://127.0.0.1:9")})
    async with open_broker(cfg) as broker:
        for ev in until_dispatch("inv-stale"):
            await broker.journal.append(ev)
        with trio.fail_after(30):
            envelope = await broker.fetch_result("inv-stale")
        assert envelope is not None and envelope["error"]["outcome"] == "unknown", envelope
        assert broker._engine.recorder._writing == {}


async def test_a_recovery_cancelled_part_way_says_what_it_had_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The daemon's start-up stopped by SIGTERM cancels its recovery: the records closed until
    then stay closed, and the log names them -- the caller's own line never comes."""
    cfg = write_config(tmp_path, {"payments": http_target("http://127.0.0.1:9")})
    real = engine_module.recover_stale
    reached = trio.Event()

    async def recover_stale(recorder: Any, record: Any, **kwargs: Any) -> Any:
        if record.invocation_id == "inv-open-005":
            reached.set()
            await trio.sleep_forever()  # a close held until the cancellation
        return await real(recorder, record, **kwargs)

    async with open_broker(cfg) as broker:
        iids = await _left_open(broker)
        monkeypatch.setattr(engine_module, "recover_stale", recover_stale)
        others = [iid for iid in iids if iid != "inv-open-005"]
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(broker._engine.recover_orphans)
                await reached.wait()
                while not all(broker.record(iid).final for iid in others):
                    await trio.sleep(0.01)
                nursery.cancel_scope.cancel()
    stopped = [r.getMessage() for r in caplog.records if "recovery stopped" in r.getMessage()]
    # The first NAMED closed, then how many more: a line, not a page (OPEN - 1 > NAMED).
    closed = ", ".join(f"{iid} unknown" for iid in others[:NAMED])
    more = f" and {OPEN - 1 - NAMED} more"
    assert stopped == [
        f"recovery stopped (cancelled) after closing {OPEN - 1} record(s): {closed}{more}"
    ]
