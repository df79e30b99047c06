"""A view read the database keeps waiting stalls that view alone, never the calls: the record
route (``GET /v1/invocations/{id}``) read the journal on the event loop, so a read PostgreSQL
held (a lock another session holds, a stalled server) stalled every call of the daemon for up
to ``[journal] reconnect`` (its reader's ``statement_timeout``).  It reads in a view thread now,
on a connection of its own (``Broker.view``).

The stuck read is real: a row-level security policy (the test's, on its own database) makes
reading the events of one invocation wait for an advisory lock this test holds; the calls never
read that invocation's rows.  The daemon runs in this process (``Daemon.run``), its role an
ordinary one (a superuser is not subject to the policy)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from affidavit.api.client import Client
from affidavit.journal import Journal
from affidavit.journal.postgres import grant_statements
from tests.broker.helpers import TOKEN_ENV
from tests.http.hostile import Reply, scripts
from tests.postgres import Cluster

from .kit import in_process
from .test_view_threads import _get

GATE = 4242
"""The advisory lock the policy waits for on a gated invocation's rows."""
CALLS = 5
RECONNECT = 8.0
"""The daemon's ``[journal] reconnect``: its own reader's ``statement_timeout``.  A read on
the event loop would hold every call this long, past ``GUARD``."""
GUARD = 6.0
"""Bounds the calls made while the view is stuck (a guard, not a measure of speed)."""
LIMIT = 60.0
GET = {"target": "api", "method": "GET", "path": "/r"}

_POLICY = """
CREATE TABLE gated (invocation_id TEXT PRIMARY KEY);
CREATE FUNCTION view_gate() RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  PERFORM pg_advisory_lock_shared({gate});
  PERFORM pg_advisory_unlock_shared({gate});
  RETURN true;
END $$;
ALTER TABLE events ENABLE ROW LEVEL SECURITY;
CREATE POLICY everyone ON events USING (true) WITH CHECK (true);
CREATE POLICY gate ON events AS RESTRICTIVE FOR SELECT USING (
  CASE WHEN EXISTS (SELECT 1 FROM gated g WHERE g.invocation_id = events.invocation_id)
       THEN view_gate() ELSE true END);
"""


def _keys(tmp: Path, who: str) -> dict[str, Any]:
    return {"key_file": tmp / "shared.key", "signing_key": tmp / f"{who}.sk"}


@contextlib.contextmanager
def _held(url: str) -> Iterator[psycopg.Connection[Any]]:
    """This test's session holding the gate (exclusive) until the block ends."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"SELECT pg_advisory_lock({GATE})")
        try:
            yield conn
        finally:
            conn.execute(f"SELECT pg_advisory_unlock({GATE})")


def _waiting(url: str) -> int:
    """Sessions waiting for the gate."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        ).fetchone()
    return int(row[0]) if row else 0


def gated_journal(pg: Cluster, pg_url: str, tmp: Path) -> tuple[str, dict[str, Any]]:
    """A fresh journal whose tables its owner created, with the gate's policy on ``events``;
    its database's name and the ``[journal]`` table of a broker role subject to the policy."""
    database = pg_url.rsplit("/", 1)[1]
    role = f"viewer_{database}"
    pg.sql(f"CREATE ROLE \"{role}\" LOGIN PASSWORD 'viewer-pw'")
    for statement in grant_statements(role):
        pg.sql(statement, database)
    pg.sql(_POLICY.format(gate=GATE), database)
    pg.sql(f'GRANT SELECT ON gated TO "{role}"', database)
    return database, {
        "url": pg.url(database, user=role, password="viewer-pw"),
        **{k: str(v) for k, v in _keys(tmp, "broker").items()},
        "reconnect": RECONNECT,
    }


async def stuck_meanwhile(
    pg_url: str, view: Callable[[], Awaitable[object]], call: Callable[[], Awaitable[None]]
) -> list[object]:
    """``view()`` started while this test holds the gate; once it waits there, ``CALLS``
    calls (``call()``), all within ``GUARD`` counted from the view's start -- a view read on
    the event loop holds the loop until the database declines it (``RECONNECT``, past the
    guard).  The view must not have ended meanwhile; the gate let go, its answer."""
    answers: list[object] = []

    async def viewing() -> None:
        answers.append(await view())

    async with trio.open_nursery() as nursery:
        with _held(pg_url), trio.fail_after(GUARD):
            nursery.start_soon(viewing)
            for _ in range(int(GUARD / 0.05)):  # until the view waits on the gate
                if await trio.to_thread.run_sync(_waiting, pg_url):
                    break
                await trio.sleep(0.05)
            else:
                raise AssertionError("the view never reached the gate")
            for _ in range(CALLS):
                await call()
            assert answers == [], "the view ended while the gate was held"
    return answers


async def test_a_record_view_the_database_holds_does_not_stall_the_calls(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)
    async with Journal.open(pg_url, **_keys(tmp_path, "owner")):
        pass  # the schema, created by its owner
    database, journal = gated_journal(pg, pg_url, tmp_path)
    ok = scripts.serve(Reply(200, body=b"ok"))
    async with in_process(tmp_path, ok, journal=journal) as (_, socket):
        with trio.fail_after(LIMIT):
            async with Client.open(socket) as client:

                async def call() -> None:
                    envelope = await client.call(GET)
                    assert envelope["result"]["status"] == 200, envelope

                gated = str((await client.call(GET))["invocation_id"])
                await call()  # (the chain's head is not the gated invocation's)
                pg.sql("INSERT INTO gated VALUES (%s)", database, (gated,))
                answers = await stuck_meanwhile(
                    pg_url, lambda: _get(socket, f"/v1/invocations/{gated}"), call
                )
    [(status, body)] = answers
    assert status == 200, body
    assert json.loads(body)["record"]["invocation_id"] == gated
