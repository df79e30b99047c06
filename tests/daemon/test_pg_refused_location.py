"""A PostgreSQL journal that refuses a view's new connection is answered in the driver's own
words, which name the server and the database apart from the URL (``connection to server at
"127.0.0.1", port 5433 failed: FATAL:  database "x" is not currently accepting connections``):
the socket's caller (an agent) hears why, never where (``engine.unplaced``).  The same holds
for ``sorry, too many clients already``, which a busy server answers any new connection."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import trio

from affidavit.api.wire import blocking_request
from tests.broker.helpers import TOKEN_ENV
from tests.broker.test_journal_away_mid_call import journal_table
from tests.http.hostile import Reply, scripts
from tests.postgres import Cluster

from .kit import WAIT, in_process


async def test_a_refused_connection_is_answered_without_the_server_or_database(
    tmp_path: Path, pg: Cluster, pg_url: str, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)
    url = urlsplit(pg_url)
    database = url.path.lstrip("/")
    assert url.hostname and url.port and database
    said = []
    journal = journal_table(tmp_path, pg_url)
    async with in_process(tmp_path, scripts.serve(Reply(200)), journal=journal) as (_, socket):
        # The daemon's own connection stays; each view's reader connects anew and is refused.
        pg.sql(f'ALTER DATABASE "{database}" WITH ALLOW_CONNECTIONS false')
        try:
            with trio.fail_after(WAIT):
                for target in ("/v1/actions", "/v1/sessions", "/v1/metrics?format=json"):
                    answer = await trio.to_thread.run_sync(
                        blocking_request, str(socket), "GET", target
                    )
                    said.append((answer.status, json.loads(answer.body)["api_error"]))
        finally:
            pg.sql(f'ALTER DATABASE "{database}" WITH ALLOW_CONNECTIONS true')
    for status, error in said:
        assert (status, error["code"]) == (500, "JOURNAL_UNREADABLE"), said
        message = error["message"]
        assert "not currently accepting connections" in message, message  # why: kept
        for part in (url.hostname, f"port {url.port}", f'"{database}"', "postgresql://"):
            assert part not in message, (part, message)
        assert url.password and url.password not in message
