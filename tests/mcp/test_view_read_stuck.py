"""The embedded MCP server's views (``record``, ``actions``) read the journal on the event loop:
a read PostgreSQL held stalled every call of the process for up to ``[journal] reconnect``.
They read in view threads of their own now (``Broker.view``).  The stuck read is the daemon
test's real one (``tests/daemon/test_view_read_stuck.py``: a policy waiting on an advisory lock
this test holds, for one invocation's rows)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

import affidavit.api.readers
from affidavit.api.broker import Broker
from affidavit.config import load_config
from affidavit.journal import Journal
from affidavit.mcp.backends import Embedded
from tests.broker.helpers import TOKEN_ENV, http_target, write_config
from tests.daemon.test_view_read_stuck import (
    GET,
    LIMIT,
    _held,
    _keys,
    gated_journal,
    stuck_meanwhile,
)
from tests.http.hostile import HostileServer, Reply, scripts
from tests.postgres import Cluster


@pytest.mark.parametrize("view", ["record", "actions"])
async def test_an_embedded_view_the_database_holds_does_not_stall_the_calls(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str, view: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)
    async with Journal.open(pg_url, **_keys(tmp_path, "owner")):
        pass  # the schema, created by its owner
    database, journal = gated_journal(pg, pg_url, tmp_path)
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)}, journal=journal)
        with trio.fail_after(LIMIT):
            async with Broker.open(config=load_config(cfg)) as broker:
                embedded = Embedded(broker)

                async def call() -> None:
                    envelope = await broker.call(GET)
                    assert envelope["result"]["status"] == 200, envelope

                gated = str((await broker.call(GET))["invocation_id"])
                await call()  # (the chain's head is not the gated invocation's)
                pg.sql("INSERT INTO gated VALUES (%s)", database, (gated,))

                async def read() -> dict[str, Any]:
                    if view == "record":
                        return await embedded.record(gated)
                    return await embedded.actions(None, None, 50)

                [answer] = await stuck_meanwhile(pg_url, read, call)
    assert isinstance(answer, dict), answer
    if view == "record":
        assert answer["record"]["invocation_id"] == gated, answer
    else:
        assert gated in [a["invocation_id"] for a in answer["actions"]], answer
        assert answer["total"] == 2, answer  # as of the view's start: not the calls meanwhile


async def test_an_embedded_record_view_the_database_holds_is_declined_after_the_bound(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The view waits a bounded time for the lock (``readers.VIEW_WAIT``), then is answered
    as the daemon answers it: ``JOURNAL_READ_DECLINED`` (``tests/daemon/test_view_waits.py``)."""
    monkeypatch.setenv(TOKEN_ENV, token)
    monkeypatch.setattr(affidavit.api.readers, "VIEW_WAIT", 0.5)
    async with Journal.open(pg_url, **_keys(tmp_path, "owner")):
        pass  # the schema, created by its owner
    database, journal = gated_journal(pg, pg_url, tmp_path)
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)}, journal=journal)
        with trio.fail_after(LIMIT):
            async with Broker.open(config=load_config(cfg)) as broker:
                embedded = Embedded(broker)
                gated = str((await broker.call(GET))["invocation_id"])
                await broker.call(GET)  # (the chain's head is not the gated invocation's)
                pg.sql("INSERT INTO gated VALUES (%s)", database, (gated,))
                with _held(pg_url):  # (held past the bound: a view that waits on never ends)
                    answer = await embedded.record(gated)
    error = answer["api_error"]
    assert error["code"] == "JOURNAL_READ_DECLINED", answer
    assert "lock timeout" in error["message"], answer
