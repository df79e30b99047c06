"""A linked call refused with its claim (``takeup.ClaimRefused``) is answered at once: nothing of
it was written, so ``Engine._answered`` passes it to its asker untouched -- never through
``internal_close``, which settles, reads, and waits up to ``INTERNAL_CLOSE_WAIT`` (5 s) on a
stalled journal, then logs that the close of a record no journal holds was "left to
recovery".  ``internal_close`` is watched (never called), not timed: a bound of a second would
also catch a real claim write (an fsync) on a loaded machine."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.engine import engine as engine_module
from affidavit.engine import invocation, new_invocation_id
from affidavit.engine.takeup import ClaimRefused
from affidavit.reconcile import approved

from .http_rows import LIMIT
from .test_reconcile_approval import _payments

QUERY = {"target": "api", "method": "GET", "path": "/v1/charges"}


async def test_a_refused_claim_on_a_stalled_journal_answers_at_once_and_logs_no_close(
    tmp_path: Path, token: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with _payments(tmp_path) as (srv, broker, iid):
        with trio.fail_after(LIMIT):
            answer = await broker.reconcile(iid, query=True)  # another asker's query: open
        assert answer["query"]["error"]["code"] == "APPROVAL_PENDING"
        engine, recorder = broker._engine, broker._engine.recorder
        record = broker.record(iid)
        assert record is not None
        mine = new_invocation_id()
        claim = approved.claim(engine, record, mine)
        real_run, real_settle, real_read = invocation.run, recorder.settle, recorder.read
        stalled = trio.Event()
        closes: list[str | None] = []

        async def internal_close(recorder: Any, iid: str | None, holder: str) -> None:
            closes.append(iid)  # recorded only: the real one would wait on the stalled journal

        async def run(*args: Any, **kwargs: Any) -> Any:
            try:
                return await real_run(*args, **kwargs)
            finally:
                stalled.set()  # the call's writes are answered (its claim refused) ...

        async def settle(*args: Any, **kwargs: Any) -> None:
            if stalled.is_set():
                await trio.sleep_forever()  # ... and from then on the journal answers nothing
            await real_settle(*args, **kwargs)

        async def read(*args: Any, **kwargs: Any) -> Any:
            if stalled.is_set():
                await trio.sleep_forever()
            return await real_read(*args, **kwargs)

        patch = pytest.MonkeyPatch()  # undone before the broker closes on the stalled journal
        try:
            patch.setattr(invocation, "run", run)
            patch.setattr(recorder, "settle", settle)
            patch.setattr(recorder, "read", read)
            patch.setattr(engine_module, "internal_close", internal_close)
            caplog.set_level(logging.DEBUG)
            # A generous bound: a wait on the stalled journal would never end.
            with trio.fail_after(LIMIT), pytest.raises(ClaimRefused):
                await engine.call(QUERY, link={"reconciles": iid}, invocation_id=mine, claim=claim)
        finally:
            patch.undo()
        assert stalled.is_set()
        assert closes == []  # the refusal is answered, never closed as a failure
        assert broker.events(mine) == []  # nothing of the refused call
        logged = [r.getMessage() for r in caplog.records]
        assert not [line for line in logged if mine in line], logged
    assert not any(r.method == "GET" for r in srv.requests)  # nothing asked or sent
