"""What each caller surface answers when a shared journal's database goes away mid-call, after
dispatch, for longer than ``[journal] reconnect`` (tests/broker/test_journal_away_mid_call.py
has the story and ``Broker.call``): the CLI embedded and through the daemon, and the MCP server
embedded -- each a real process, on a real PostgreSQL stopped with ``pg_ctl`` while the remote
holds its answer.

Every surface gives the same stable error: code JOURNAL_UNAVAILABLE (the CLI: exit 2 and one
line on stderr, as for any journal it cannot use; MCP: an ``api_error``), and the words the
daemon answers with -- naming the invocation, and where its record says, once the journal is
back, whether it was sent.  No envelope (nothing durable to render it from), no traceback, no
password.  The record, read once the database is back, is the named invocation's: dispatched.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.journal import JournalReader
from tests.daemon.kit import (
    WAIT,
    Run,
    client_env,
    run,
    write_daemon_config,
)
from tests.external import require_module
from tests.http.hostile import HostileServer
from tests.postgres import Cluster

from .awaykit import daemon_on, mcp_on
from .helpers import TOKEN_ENV, http_target
from .test_journal_away_mid_call import ACTION, POINTS, journal_table, remote, unrecorded

PYTHON_M = [sys.executable, "-m", "affidavit"]


async def _away_during(
    pg: Cluster, srv: HostileServer, caller: Callable[[], Awaitable[Any]]
) -> Any:
    """Run ``caller`` (a surface's whole call); once the remote holds the request stop
    PostgreSQL and let the remote go on; start it again once the call is over."""
    out: list[Any] = []

    async def call() -> None:
        out.append(await caller())

    with trio.fail_after(WAIT * 3):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            await srv.event("received").wait()
            await trio.to_thread.run_sync(pg.stop)
            try:
                srv.event("release").set()
                while not out:
                    await trio.sleep(0.05)
            finally:
                await trio.to_thread.run_sync(pg.start)
    return out[0]


def _only_invocation(url: str) -> str:
    """The one invocation the journal holds: dispatched, nothing more proven (its lease still
    runs; recovery closes it later, test_journal_away_mid_call.py)."""
    with JournalReader.open(url) as r:
        (rec,) = r.list_actions()
    assert rec.evidence["dispatch_started"] is True
    assert rec.outcome.value == "unknown" and not rec.final, rec
    return rec.invocation_id


def _cli_says(result: Run, iid: str, pg: Cluster) -> None:
    assert result.returncode == 2, result
    assert result.stdout == b"", result  # no envelope: nothing durable to render it from
    assert result.stderr.decode() == f"affidavit: JOURNAL_UNAVAILABLE: {unrecorded(iid)}\n", result
    assert pg.password.encode() not in result.stderr


@pytest.mark.parametrize("point", POINTS)
async def test_cli_embedded_exits_2_with_the_daemons_words(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str, point: str
) -> None:
    async with HostileServer.running(remote(point)) as srv:
        cfg = write_daemon_config(
            tmp_path,
            {"api": http_target(srv.url)},
            socket=tmp_path / "unused.sock",
            journal=journal_table(tmp_path, pg_url),
        )
        env = {**client_env(), TOKEN_ENV: token}
        argv = [*PYTHON_M, "call", "-", "--config", str(cfg)]
        result = await _away_during(
            pg, srv, lambda: run(argv, stdin=json.dumps(ACTION).encode(), env=env)
        )
    _cli_says(result, _only_invocation(pg_url), pg)


@pytest.mark.parametrize("point", POINTS)
async def test_cli_through_the_daemon_says_the_same(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str, point: str
) -> None:
    async with HostileServer.running(remote(point)) as srv:
        async with daemon_on(tmp_path, srv.url, pg_url, token) as (socket, daemon):
            argv = [*PYTHON_M, "call", "-", "--socket", str(socket)]
            result = await _away_during(
                pg, srv, lambda: run(argv, stdin=json.dumps(ACTION).encode(), env=client_env())
            )
        assert "Traceback" not in daemon.log_text()
    _cli_says(result, _only_invocation(pg_url), pg)


@pytest.mark.parametrize("point", POINTS)
async def test_mcp_embedded_answers_journal_unavailable_naming_the_invocation(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str, point: str
) -> None:
    require_module("mcp", "dev")
    from tests.mcp.kit import structured

    async with HostileServer.running(remote(point)) as srv:
        log = tmp_path / "mcp.log"
        async with mcp_on(tmp_path, srv.url, pg_url, token) as mcp:
            args = dict(ACTION)
            result = await _away_during(pg, srv, lambda: mcp.call("http_request", args))
            answer = structured(result)
            assert result.is_error is True, answer
    iid = _only_invocation(pg_url)
    assert answer == {
        "api_error": {
            "code": "JOURNAL_UNAVAILABLE",
            "message": unrecorded(iid),
            "outcome": "unknown",  # named and maybe dispatched: never resent blind
            "retry": "reconcile",
        }
    }
    text = log.read_text(encoding="utf-8", errors="replace")
    assert "Traceback" not in text and pg.password not in text
