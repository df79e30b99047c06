"""The daemon's views reuse their read-only readers (``Broker.view``, ``ViewReaders``): every
record view opened a PostgreSQL session of its own (a connection and its set-up queries), so a
caller paging records drove one new session per request.  Now N sequential views open at most
the views' thread count of sessions, a reader whose session the server ended still answers the
next view (replaced, never kept broken), and a reused reader reads the journal as it is at each
view (a call made between two views is in the second).

The daemon runs in this process (``Daemon.run``) against a real PostgreSQL server; sessions are
counted at the backend's ``connect`` (the role a read-only reader opens with, ``tool``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.client import Client
from affidavit.daemon.app import VIEW_THREADS
from affidavit.journal.postgres import PostgresBackend
from tests.broker.helpers import TOKEN_ENV
from tests.http.hostile import Reply, scripts
from tests.postgres import Cluster

from .kit import in_process
from .test_view_threads import _get

VIEWS = 3 * VIEW_THREADS
"""Sequential record views: each opened a session before."""
LIMIT = 60.0
GET = {"target": "api", "method": "GET", "path": "/r"}


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The backend pid of every read-only reader's session opened from now on."""
    pids: list[int] = []
    connect = PostgresBackend.connect

    def counted(self: PostgresBackend, role: str) -> Any:
        conn = connect(self, role)
        if role == "tool":
            pids.append(conn.info.backend_pid)
        return conn

    monkeypatch.setattr(PostgresBackend, "connect", counted)
    return pids


async def _record(socket: Path, invocation_id: str) -> dict[str, Any]:
    status, body = await _get(socket, f"/v1/invocations/{invocation_id}")
    assert status == 200, body
    record: dict[str, Any] = json.loads(body)["record"]
    assert record["invocation_id"] == invocation_id
    return record


async def _actions(socket: Path) -> list[Any]:
    status, body = await _get(socket, "/v1/actions")
    assert status == 200, body
    actions: list[Any] = json.loads(body)["actions"]
    return actions


async def test_record_views_reuse_their_readers_and_replace_a_lost_one(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)
    pids = _counting(monkeypatch)
    database = pg_url.rsplit("/", 1)[1]
    journal = {"url": pg_url, "key_file": str(tmp_path / "k.key")}
    journal["signing_key"] = str(tmp_path / "k.sk")
    ok = scripts.serve(Reply(200, body=b"ok"))
    async with in_process(tmp_path, ok, journal=journal) as (_, socket):
        with trio.fail_after(LIMIT):
            async with Client.open(socket) as client:
                first = str((await client.call(GET))["invocation_id"])
                before = len(pids)
                for _ in range(VIEWS):
                    await _record(socket, first)
                opened = len(pids) - before
                assert 1 <= opened <= VIEW_THREADS, f"{opened} sessions for {VIEWS} views"

                # The server ends every idle reader's session: the next views still answer.
                for pid in set(pids):
                    pg.terminate(pid, database)
                for _ in range(3):
                    await _record(socket, first)

                # A reused reader reads the journal as it is now: a call made between two
                # views is in the second.
                seen = len(await _actions(socket))
                second = str((await client.call(GET))["invocation_id"])
                after = await _actions(socket)
                assert len(after) == seen + 1, (seen, after)
                assert second in json.dumps(after)
