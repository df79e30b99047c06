"""MCP's ``reconcile_query`` on a shared journal whose database is away (beyond ``[journal]
reconnect``), embedded and through the daemon: a tool error, ``api_error`` JOURNAL_UNAVAILABLE
naming the record that could not be read -- the daemon's 503 words, whichever broker answers.
Embedded it used to be ``INTERNAL`` "the broker failed (JournalUnavailable)".  Nothing is
queried or recorded, the MCP server lives on (the same connection reads the record once the
database is back), and neither its log nor the daemon's holds a traceback or the password.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from affidavit.engine import unread
from tests.daemon.kit import WAIT
from tests.external import require_module
from tests.http.hostile import HostileServer, Reply, scripts
from tests.postgres import Cluster

from .awaykit import MCP_MODES, clean, database_stopped, event_count
from .test_journal_away_mid_call import ACTION

BODY = b'{"id":"ch_1"}'


@pytest.mark.parametrize("mode", sorted(MCP_MODES))
async def test_reconcile_query_answers_journal_unavailable_and_the_server_lives_on(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str, mode: str
) -> None:
    require_module("mcp", "dev")
    from tests.mcp.kit import structured

    async with HostileServer.running(scripts.serve(Reply(201, body=BODY))) as srv:
        with trio.fail_after(WAIT * 3):
            async with MCP_MODES[mode](tmp_path, srv.url, pg_url, token) as mcp:
                called = structured(await mcp.call("http_request", dict(ACTION)))
                iid = called["invocation_id"]
                before = event_count(pg_url, iid)
                async with database_stopped(pg):
                    result = await mcp.call("reconcile_query", {"invocation_id": iid})
                answer = structured(result)
                assert result.is_error is True, answer
                assert answer == {
                    "api_error": {
                        "code": "JOURNAL_UNAVAILABLE",
                        "message": unread(f"the record of {iid}"),
                        "outcome": "unknown",
                        "retry": "backoff",
                    }
                }, answer
                clean(str(result.content), pg.password)
                assert event_count(pg_url, iid) == before  # nothing recorded
                # The server lives on: the same connection reads, and reconciles, once back.
                again = structured(await mcp.call("get_record", {"invocation_id": iid}))
                assert again["record"]["invocation_id"] == iid, again
                settled = structured(await mcp.call("reconcile_query", {"invocation_id": iid}))
                # Read and refused as the daemon refuses it (not unknown), no longer away.
                assert settled["api_error"]["code"] == "NOT_UNKNOWN", settled
    assert len(srv.requests) == 1  # the call itself; no query was sent
    clean((tmp_path / "mcp.log").read_text(encoding="utf-8", errors="replace"), pg.password)
