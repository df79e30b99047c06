"""The dispatch of an *approved* request whose caller went away (``Broker.dispatch_approved``,
the daemon's approvals dispatcher) on a shared journal whose database goes away beyond
``[journal] reconnect``: it raises ``CallNotRecorded`` naming the invocation -- the error every
other call path raises when the journal could not record a call (``Broker.call``) -- never the
plain ``JournalUnavailable`` of whichever read failed last (it used to).  Once the database is
back, the record tells the rest, and nothing is sent twice.

Two moments: the database stopped before the dispatch reads the record (nothing is sent), and
stopped once the remote holds the request (DISPATCH_STARTED durable; the result can be neither
stored nor its failure read back).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.config import load_config
from affidavit.engine import CallNotRecorded, EngineSettings, unrecorded
from affidavit.journal import JournalError
from affidavit.statemachine import EventKind
from tests.http.hostile import HostileServer, Reply, scripts
from tests.postgres import Cluster

from .approvalkit import OPS, OPS_UID
from .awaykit import clean, database_stopped, state_of
from .helpers import http_target, write_config
from .test_journal_away_mid_call import (
    ACTION,
    LIMIT,
    ended_while_away,
    journal_table,
    remote,
)


@asynccontextmanager
async def _approved(
    tmp: Path, url: str, pg_url: str, **target: object
) -> AsyncIterator[tuple[Broker, str]]:
    """A broker on ``pg_url`` (leases that end with the call) and one approved request whose
    caller went away: the daemon's to dispatch."""
    journal = journal_table(tmp, pg_url)
    cfg = write_config(
        tmp, {"api": http_target(url, approval={"methods": ["POST"]}, **target)}, journal=journal
    )
    with cfg.open("a", encoding="utf-8") as f:
        f.write(f"[service]\noperator_uids = [{OPS_UID}]\n")
    settings = EngineSettings(lease_margin=0.0)
    async with Broker.open(config=load_config(cfg), settings=settings) as broker:
        env = await broker.call(ACTION)
        assert env["error"]["code"] == "APPROVAL_PENDING", env
        iid = str(env["invocation_id"])
        await broker.approve(iid, note="ok", operator=OPS)
        yield broker, iid


def _not_recorded(exc: BaseException, iid: str, password: str) -> None:
    assert isinstance(exc, CallNotRecorded), repr(exc)
    assert isinstance(exc, JournalError)  # what the dispatcher's callers catch
    assert (exc.code, exc.invocation_id) == ("JOURNAL_UNAVAILABLE", iid)
    assert str(exc) == unrecorded(iid)
    clean(repr(exc), password)


async def test_an_approved_dispatch_with_the_database_away_is_call_not_recorded(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(201, body=b"{}"))) as srv:
        with trio.fail_after(LIMIT):
            async with _approved(tmp_path, srv.url, pg_url) as (broker, iid):
                async with database_stopped(pg):
                    with pytest.raises(JournalError) as info:
                        await broker.dispatch_approved(iid)
                _not_recorded(info.value, iid, pg.password)
                assert srv.requests == []  # nothing was sent
                assert state_of(pg_url, iid) == "approved"
                # Back: the same dispatch sends it, once.
                env = await broker.dispatch_approved(iid)
                assert env is not None and env["result"]["status"] == 201, env
    assert len(srv.requests) == 1


async def test_an_approved_dispatch_the_journal_lost_after_dispatch_is_call_not_recorded(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str
) -> None:
    async with HostileServer.running(remote("result_store")) as srv:
        with trio.fail_after(LIMIT):
            async with _approved(tmp_path, srv.url, pg_url) as (broker, iid):
                _, failure = await ended_while_away(pg, srv, lambda: broker.dispatch_approved(iid))
                (exc,) = failure
                _not_recorded(exc, iid, pg.password)
                # Back: once the lease ran out, a read closes the record with what it proves.
                lease = broker.journal.lease(iid)
                assert lease is not None
                while time.time() <= lease.expires_at:
                    await trio.sleep(0.1)
                env = await broker.fetch_result(iid)
                assert env is not None and "result" not in env, env
                assert env["error"]["outcome"] == "unknown", env
                kinds = [e.kind for e in broker.events(iid)]
                assert EventKind.DISPATCH_STARTED in kinds, kinds
                assert await broker.dispatch_approved(iid) is None  # never sent again
    assert len(srv.requests) == 1


async def test_an_approved_request_unread_for_the_journal_away_is_not_given_up(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record read, then the database gone before the accepted action's sealed copy: the
    dispatch is not recorded (``CallNotRecorded``) -- never "its action is not readable",
    which drops the approval from the dispatcher's watch for good."""
    async with HostileServer.running(scripts.serve(Reply(201, body=b"{}"))) as srv:
        with trio.fail_after(LIMIT):
            async with _approved(tmp_path, srv.url, pg_url) as (broker, iid):
                broker.watch_approvals()
                journal = broker.journal
                payload = journal.payload
                stopped: list[bool] = []

                def stopped_first(seq: int) -> object:
                    if not stopped:  # once: a read is tried again within [journal] reconnect
                        pg.stop()
                        stopped.append(True)
                    return payload(seq)

                monkeypatch.setattr(journal, "payload", stopped_first)
                try:
                    with pytest.raises(JournalError) as info:
                        await broker.dispatch_approved(iid)
                finally:
                    monkeypatch.setattr(journal, "payload", payload)  # not undo(): the token too
                    await trio.to_thread.run_sync(pg.start)
                _not_recorded(info.value, iid, pg.password)
                assert srv.requests == []
                assert await broker.approvals_ready() == [iid]  # still the dispatcher's
                broker.forget_dispatch(iid)
                env = await broker.dispatch_approved(iid)
                assert env is not None and env["result"]["status"] == 201, env
    assert len(srv.requests) == 1
