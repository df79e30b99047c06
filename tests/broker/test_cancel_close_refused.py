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
