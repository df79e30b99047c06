"""Fetching a stored result while a shared journal's database is away (beyond ``[journal]
reconnect``) is JOURNAL_UNAVAILABLE -- never RESULT_UNVERIFIED, which says the stored result
failed verification: a claim about the record that nobody could read.

A result is stored (the remote answered, the call committed); PostgreSQL is stopped; the daemon
(``Client.fetch_result``, the HTTP API's ``GET .../result``) and the embedded MCP server
(``fetch_result``) are asked for it.  Once the database is back, the same fetch reads it whole.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from affidavit.api.client import Client
from affidavit.api.wire import ApiError
from tests.daemon.kit import WAIT
from tests.external import require_module
from tests.http.hostile import HostileServer, Reply, scripts
from tests.postgres import Cluster

from .awaykit import daemon_on, database_stopped, mcp_on
from .test_journal_away_mid_call import ACTION

BODY = b'{"id":"ch_1"}'


def _away(code: str, message: str) -> None:
    assert code == "JOURNAL_UNAVAILABLE", (code, message)
    assert "verif" not in message, message


async def test_the_daemon_answers_503_journal_unavailable_not_result_unverified(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(201, body=BODY))) as srv:
        async with daemon_on(tmp_path, srv.url, pg_url, token) as (socket, daemon):
            with trio.fail_after(WAIT * 2):
                async with Client.open(socket) as client:
                    env = await client.call(ACTION)
                    assert env["result"]["body"] == BODY.decode(), env
                    iid = env["invocation_id"]
                    async with database_stopped(pg):
                        with pytest.raises(ApiError) as info:
                            await client.fetch_result(iid)
                    assert info.value.status == 503, info.value
                    _away(info.value.code, info.value.message)
                    assert iid in info.value.message
                    again = await client.fetch_result(iid)
                    assert again is not None and again["result"] == env["result"]
        assert "Traceback" not in daemon.log_text()


async def test_mcp_embedded_answers_journal_unavailable_not_result_unverified(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str
) -> None:
    require_module("mcp", "dev")
    from tests.mcp.kit import structured

    async with HostileServer.running(scripts.serve(Reply(201, body=BODY))) as srv:
        log = tmp_path / "mcp.log"
        async with mcp_on(tmp_path, srv.url, pg_url, token) as mcp:
            called = structured(await mcp.call("http_request", dict(ACTION)))
            iid = called["invocation_id"]
            async with database_stopped(pg):
                result = await mcp.call("fetch_result", {"invocation_id": iid})
            answer = structured(result)
            assert result.is_error is True, answer
            _away(answer["api_error"]["code"], answer["api_error"]["message"])
            assert iid in answer["api_error"]["message"]
            again = structured(await mcp.call("fetch_result", {"invocation_id": iid}))
            assert again["result"] == called["result"], again
    text = log.read_text(encoding="utf-8", errors="replace")
    assert "Traceback" not in text and pg.password not in text
