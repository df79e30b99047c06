"""A shared journal's database goes away mid-call, after dispatch, for longer than the broker's
``[journal] reconnect`` window: ``Broker.call`` cannot render an envelope from a durable record,
and says so -- a stable error naming the invocation, never a traceback of whatever read failed
last, never a claim the record does not prove.  Once the database is back, the record tells
the truth: recovery closes the dispatched attempt unknown, and nothing was sent twice.

Two points of the call, each on a real PostgreSQL stopped with ``pg_ctl`` while the remote (a
real socket) holds its answer:

* ``result_store``: the remote answers in full; storing the result fails, and so does reading
  the record to say so (``delivery._store_failed``);
* ``journal_refused``: the remote closes without an answer; recording the interruption fails,
  and so does reading what the journal holds (``recovery.journal_refused``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.config import load_config
from affidavit.engine import CallNotRecorded, EngineSettings, delivery
from affidavit.engine import engine as engine_module
from affidavit.journal import JournalError
from affidavit.statemachine import EventKind
from tests.http.hostile import HostileServer, Peer, Reply, Script
from tests.postgres import Cluster

from .helpers import http_target, until_lease_lapsed, write_config

LIMIT = 60
RECONNECT = 0.5
POINTS = ["result_store", "journal_refused"]
ACTION = {"target": "api", "method": "POST", "path": "/v1/charges", "body": "{}"}


def unrecorded(iid: str) -> str:
    """What every surface says (the daemon's 503 JOURNAL_UNAVAILABLE words)."""
    return (
        f"the journal could not record the call ({iid}: `affidavit result {iid}` once it is "
        "back tells whether it was sent)"
    )


def remote(point: str) -> Script:
    """Reads the request, sets ``received``; once ``release`` is set answers in full
    (``result_store``) or closes without a word (``journal_refused``)."""

    async def script(peer: Peer) -> None:
        if await peer.read_request() is None:
            return
        peer.server.event("received").set()
        await peer.server.event("release").wait()
        if point == "result_store":
            await peer.respond(Reply(201, body=b'{"id":"ch_1"}'))
        else:
            await peer.close()

    return script


def journal_table(tmp: Path, url: str) -> dict[str, Any]:
    return {
        "url": url,
        "key_file": str(tmp / "journal.key"),
        "signing_key": str(tmp / "journal.sk"),
        "reconnect": RECONNECT,
    }


@asynccontextmanager
async def database_away(pg: Cluster, srv: HostileServer) -> AsyncIterator[None]:
    """Once the remote holds the request (DISPATCH_STARTED is durable): stop PostgreSQL, let
    the remote go on; the body runs with the database away.  Started again on the way out,
    whatever happened (the cluster is the session's)."""
    await srv.event("received").wait()
    await trio.to_thread.run_sync(pg.stop)
    try:
        srv.event("release").set()
        yield
    finally:
        await trio.to_thread.run_sync(pg.start)


async def ended_while_away(
    pg: Cluster, srv: HostileServer, run: Callable[[], Awaitable[Any]]
) -> tuple[list[Any], list[BaseException]]:
    """``run()`` with the database stopped once the remote holds its request (``database_away``),
    waited for until it ends, the database still away: (what it returned, what it raised)."""
    returned: list[Any] = []
    raised: list[BaseException] = []
    done = trio.Event()

    async def go() -> None:
        try:
            returned.append(await run())
        except Exception as exc:
            raised.append(exc)
        finally:
            done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(go)
        async with database_away(pg, srv):
            await done.wait()
    return returned, raised


def spy(monkeypatch: pytest.MonkeyPatch, reached: list[str], module: Any, name: str) -> None:
    """Record in ``reached`` that ``module.name`` (an async function) was reached; run it."""
    real: Callable[..., Awaitable[Any]] = getattr(module, name)

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        reached.append(name)
        return await real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)


@pytest.mark.parametrize("point", POINTS)
async def test_broker_call_names_the_invocation_and_the_record_tells_the_rest(
    tmp_path: Path,
    token: str,
    pg: Cluster,
    pg_url: str,
    point: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reached: list[str] = []
    spy(monkeypatch, reached, delivery, "_store_failed")
    spy(monkeypatch, reached, engine_module, "journal_refused")
    target = http_target("http://127.0.0.1:1", timeout={"connect": 2, "total": 3})
    async with HostileServer.running(remote(point)) as srv:
        target["url"] = srv.url
        cfg = load_config(
            write_config(tmp_path, {"api": target}, journal=journal_table(tmp_path, pg_url))
        )
        settings = EngineSettings(lease_margin=0.0)
        with trio.fail_after(LIMIT):
            async with Broker.open(config=cfg, settings=settings) as b:
                envelopes, failure = await ended_while_away(pg, srv, lambda: b.call(ACTION))
                assert not envelopes, envelopes
                (exc,) = failure
                assert {"result_store": "_store_failed", "journal_refused": "journal_refused"}[
                    point
                ] in reached, reached
                (action,) = b.journal.list_actions()
                iid = action.invocation_id
                assert isinstance(exc, CallNotRecorded), repr(exc)
                assert isinstance(exc, JournalError)  # what a journal that cannot be used raises
                assert (exc.code, exc.invocation_id) == ("JOURNAL_UNAVAILABLE", iid)
                assert str(exc) == unrecorded(iid)
                assert pg.password not in repr(exc)
                # The database is back: once the call's lease ran out, a read closes the record
                # with what it proves -- dispatched, no result: unknown.
                (accepted,) = [e for e in b.events(iid) if e.kind is EventKind.ACTION_ACCEPTED]
                await until_lease_lapsed(accepted)
                env = await b.fetch_result(iid)
                assert env is not None and "result" not in env, env
                err = env["error"]
                assert (err["code"], err["phase"], err["outcome"]) == (
                    "REMOTE_OUTCOME_UNKNOWN",
                    "remote_execution",
                    "unknown",
                ), err
                assert env["evidence"]["dispatch_started"] is True
                record = b.record(iid)
                assert record is not None and record.final and record.state == "interrupted"
                kinds = [e.kind for e in b.events(iid)]
                assert EventKind.RESULT_COMMITTED not in kinds
                assert b.journal.verify().ok
    assert len(srv.requests) == 1  # sent once, never again
