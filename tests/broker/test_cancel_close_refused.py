"""A caller's cancellation whose closing record the journal refuses (``run_tries``'s shielded
close meets a full disk): the refusal, not the cancellation, leaves the engine, and the call is
answered as the gate's refused DISPATCH_STARTED is -- from what is durable (``Engine._answered``,
``journal_refused``): not_attempted while nothing was dispatched, ``unknown`` once it was.
Never a claim the record cannot back, never a traceback, nothing left hanging."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.engine import attempt as attempt_module
from affidavit.journal import Batch
from tests.http.hostile import HostileServer, Peer

from .helpers import http_target, open_broker, write_config

LIMIT = 20
POST = {"target": "api", "method": "POST", "path": "/charge", "body": "{}"}


@pytest.mark.parametrize("dispatched", [True, False], ids=["after_dispatch", "before_dispatch"])
async def test_a_cancelled_call_whose_close_is_refused_answers_from_the_durable_record(
    tmp_path: Path, token: str, dispatched: bool
) -> None:
    got = trio.Event()

    async def script(peer: Peer) -> None:  # takes the request, never answers
        if await peer.read_request() is None:
            return
        got.set()
        await trio.sleep(LIMIT)

    async with HostileServer.running(script) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        with trio.fail_after(LIMIT):
            async with open_broker(cfg) as broker:
                full = False
                token = trio.lowlevel.current_trio_token()
                conn = broker.journal.write_connection
                authorized = "SELECT 1 FROM events WHERE kind = 'CREDENTIAL_AUTHORIZED'"

                def disk(batch: Batch) -> None:
                    if full:
                        raise sqlite3.OperationalError("database or disk is full")
                    if not dispatched and conn.execute(authorized).fetchone() is not None:
                        # The call's record durable up to its credential, nothing dispatched:
                        # cancelled before this batch is answered, so before the gate.
                        token.run_sync_soon(stop)

                def stop() -> None:
                    nonlocal full
                    full = True  # from now on: the cancellation's close included
                    caller.cancel()

                broker.journal.before_commit = disk
                answer: dict[str, Any] = {}
                caller = trio.CancelScope()

                async def cancel() -> None:
                    if dispatched:
                        await got.wait()  # DISPATCH_STARTED is durable, the request out
                        stop()

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(cancel)
                    with caller:
                        answer["env"] = await broker.call(POST)
                env = answer["env"]
                err, evidence = env["error"], env["evidence"]
                if dispatched:
                    assert (err["phase"], err["outcome"], err["code"]) == (
                        "remote_execution",
                        "unknown",
                        "REMOTE_OUTCOME_UNKNOWN",
                    ), env
                    assert evidence["dispatch_started"] is True
                else:
                    assert (err["phase"], err["outcome"]) == ("connection_setup", "not_attempted")
                    assert evidence["dispatch_started"] is False
        assert len(srv.requests) == (1 if dispatched else 0)
        async with open_broker(cfg) as broker:  # the durable record says no more
            rec = broker.record(env["invocation_id"])
            assert rec is not None
            assert rec.outcome.value == ("unknown" if dispatched else "not_attempted")


async def test_an_interrupt_whose_close_is_refused_still_stops_the_caller(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a cancellation but an interrupt (a ``KeyboardInterrupt`` reaching the call's task
    after dispatch) whose close the journal refuses: the interrupt propagates -- the process is
    being stopped -- rather than being turned into an envelope by the refusal that replaced
    it.  The record stays what is durable (dispatched: unknown) for recovery to close."""
    full = False
    observe = attempt_module._observer

    def interrupting(attempt: Any) -> Any:
        inner = observe(attempt)

        def observer(step: Any, facts: Any) -> None:
            nonlocal full
            inner(step, facts)
            if attempt.dispatch_recorded and not full:  # once, at the first step after it
                full = True
                raise KeyboardInterrupt

        return observer

    monkeypatch.setattr(attempt_module, "_observer", interrupting)

    async def script(peer: Peer) -> None:
        if await peer.read_request() is None:
            return
        await trio.sleep(LIMIT)

    async with HostileServer.running(script) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        with trio.fail_after(LIMIT):
            async with open_broker(cfg) as broker:

                def disk(batch: Batch) -> None:
                    if full:
                        raise sqlite3.OperationalError("database or disk is full")

                broker.journal.before_commit = disk
                with pytest.raises(KeyboardInterrupt):
                    await broker.call(POST)
                (rec,) = broker.journal.list_actions()
                assert rec.state == "dispatched" and rec.outcome.value == "unknown", rec
