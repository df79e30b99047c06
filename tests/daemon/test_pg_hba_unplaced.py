"""A PostgreSQL journal whose server turns a view's new connection away by ``pg_hba.conf``
words the refusal with the *client's* address (``pg_hba.conf rejects connection for host
"10.0.0.7", user ...``): the broker's own host, which is not the URL's and which ``unplaced``
does not know.  The socket's caller hears why, never that address (nor the server's: the URL
names the server as ``localhost``, the refusal quotes the address the broker came from)."""

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


async def test_a_connection_refused_by_pg_hba_is_answered_without_the_brokers_address(
    tmp_path: Path, pg: Cluster, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)
    url = pg.database().replace("@127.0.0.1:", "@localhost:")
    database = urlsplit(url).path.lstrip("/")
    hba = pg.data / "pg_hba.conf"
    kept = hba.read_text()
    said = []
    journal = journal_table(tmp_path, url)
    async with in_process(tmp_path, scripts.serve(Reply(200)), journal=journal) as (_, socket):
        # The daemon's own connection stays; each view's reader connects anew and is refused.
        hba.write_text(f"host {database} all 127.0.0.1/32 reject\n" + kept)
        pg.sql("SELECT pg_reload_conf()")
        try:
            with trio.fail_after(WAIT):
                for target in ("/v1/actions", "/v1/sessions"):
                    answer = await trio.to_thread.run_sync(
                        blocking_request, str(socket), "GET", target
                    )
                    said.append((answer.status, json.loads(answer.body)["api_error"]))
        finally:
            hba.write_text(kept)
            pg.sql("SELECT pg_reload_conf()")
    for status, error in said:
        assert (status, error["code"]) == (500, "JOURNAL_UNREADABLE"), said
        message = error["message"]
        assert "pg_hba.conf rejects connection" in message, message  # why: kept
        for part in ("127.0.0.1", "::1", "localhost", f'"{database}"', "postgresql://"):
            assert part not in message, (part, message)
