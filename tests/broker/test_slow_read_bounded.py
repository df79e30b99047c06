"""A call's journal reads on a shared PostgreSQL journal run on the event loop (``Recorder.read``,
the dispatch gate's clock, a fetch's record): a read the database keeps waiting -- another
session holding a lock on ``events``, a server stalled -- stalled every call of the broker for as
long, without bound.  The broker's own reader is bounded now: ``statement_timeout`` of ``[journal]
reconnect`` (the bound a write already waits for the chain head), after which the read is
declined (``ReadFailed``: JOURNAL_READ_DECLINED, "try again"), not waited for.

Proved by order, not by a clock: the fetch ends while the other session still holds the lock;
unbounded, it ended only once the lock was let go (``HOLD`` seconds later)."""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg
import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.config import load_config
from affidavit.journal import ReadFailed
from tests.http.hostile import HostileServer, Reply, scripts
from tests.postgres import Cluster

from .helpers import http_target, write_config
from .test_journal_away_mid_call import LIMIT, journal_table

HOLD = 10.0
"""Seconds the other session holds its lock at most (far past ``[journal] reconnect``)."""
GET = {"target": "api", "method": "GET", "path": "/r"}


def _hold_events(
    url: str, locked: threading.Event, release: threading.Event, seen: list[str]
) -> None:
    """Another session's transaction that holds ``events`` (ACCESS EXCLUSIVE: no read passes)
    until ``release`` is set or ``HOLD`` runs out."""
    with psycopg.connect(url) as conn:
        conn.execute("LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
        locked.set()
        release.wait(HOLD)
        seen.append("lock released")
        conn.rollback()


async def test_a_read_the_database_keeps_waiting_is_declined_within_the_bound(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        cfg = write_config(
            tmp_path, {"api": http_target(srv.url)}, journal=journal_table(tmp_path, pg_url)
        )
        with trio.fail_after(LIMIT):
            async with Broker.open(config=load_config(cfg)) as broker:
                env = await broker.call(GET)
                iid = str(env["invocation_id"])
                seen: list[str] = []
                locked, release = threading.Event(), threading.Event()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(
                        trio.to_thread.run_sync, _hold_events, pg_url, locked, release, seen
                    )
                    while not locked.is_set():
                        await trio.sleep(0.01)
                    try:
                        with pytest.raises(ReadFailed) as info:
                            await broker.fetch_result(iid)
                        seen.append("read ended")
                    finally:
                        release.set()
                # Ended while the lock was still held: the read did not wait for it.
                assert seen == ["read ended", "lock released"], seen
                assert "statement timeout" in str(info.value), info.value
                assert pg.password not in str(info.value)
                # The lock gone, the same read answers.
                again = await broker.fetch_result(iid)
                assert again is not None and again["result"]["status"] == 200, again
