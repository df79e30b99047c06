"""The console's stored result (an invocation's page, its ``result.json``) was read on the event
loop (``Broker.fetch_result``): a read PostgreSQL held stalled every call of the daemon for up
to ``[journal] reconnect``.  A closed record's result is read in a view thread now, as the
console's other pages are.  The stuck read is the daemon test's real one
(``tests/daemon/test_view_read_stuck.py``: a policy waiting on an advisory lock this test holds,
for one invocation's rows); the console reads as the daemon serves it (``threads``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.config import load_config
from affidavit.journal import Journal
from tests.broker.helpers import TOKEN_ENV, http_target, write_config
from tests.daemon.test_view_read_stuck import GET, LIMIT, _keys, gated_journal, stuck_meanwhile
from tests.http.hostile import HostileServer, Reply, scripts
from tests.postgres import Cluster

from .kit import get, log_in_to, served


async def test_a_stored_result_the_database_holds_does_not_stall_the_calls(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)
    async with Journal.open(pg_url, **_keys(tmp_path, "owner")):
        pass  # the schema, created by its owner
    database, journal = gated_journal(pg, pg_url, tmp_path)
    async with HostileServer.running(scripts.serve(Reply(200, body=b"stored"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)}, journal=journal)
        with cfg.open("a") as f:
            f.write(f"[service]\noperator_uids = [{os.geteuid()}]\n")
        with trio.fail_after(LIMIT):
            async with (
                Broker.open(config=load_config(cfg)) as broker,
                served(broker, tmp_path, threads=True) as (origin, console),
            ):

                async def call() -> None:
                    envelope = await broker.call(GET)
                    assert envelope["result"]["status"] == 200, envelope

                gated = str((await broker.call(GET))["invocation_id"])
                await call()  # (the chain's head is not the gated invocation's)
                cookie, _csrf = await log_in_to(console, origin)
                pg.sql("INSERT INTO gated VALUES (%s)", database, (gated,))
                url = f"{origin}/invocations/{gated}/result.json"
                [(status, _, body)] = await stuck_meanwhile(
                    pg_url, lambda: get(url, cookie=cookie), call
                )
    assert status == 200, body
    envelope = json.loads(body)
    assert envelope["invocation_id"] == gated and envelope["result"]["body"] == "stored"
