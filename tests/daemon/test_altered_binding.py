"""A same-key call through the daemon after someone deleted its idempotency binding from the
journal file (journal/bindings.py, docs/journal.md "Idempotency bindings"): the daemon, with
its writer open on the file all along, answers without an envelope -- nothing sent, the remote
sees no second request -- every time the key comes back."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from tests.broker.http_rows import IDEM, POST
from tests.http.hostile import Reply, scripts

from .kit import curl_api, serving


async def test_a_deleted_binding_is_never_sent_again_through_the_daemon(
    tmp_path: Path, token: str, curl: str
) -> None:
    overrides = {"idempotency": IDEM}
    async with serving(tmp_path, scripts.serve(Reply(201)), token=token, overrides=overrides) as (
        srv,
        daemon,
    ):
        body = json.dumps({**POST, "idempotency_key": "key-a"}).encode()
        status, first = await curl_api(curl, daemon.socket, "/v1/calls", body)
        assert status == 200 and "error" not in first and first["result"]["status"] == 201, first
        conn = sqlite3.connect(daemon.journal, isolation_level=None)
        try:
            conn.execute("DELETE FROM idempotency WHERE key = 'key-a'")
        finally:
            conn.close()
        for _ in range(2):
            status, again = await curl_api(curl, daemon.socket, "/v1/calls", body)
            # Not an outage that passes (503 JOURNAL_UNAVAILABLE would invite the retry that
            # meets it again): the journal's own words, which seq names the removed key.
            assert status == 500, again
            problem = again["api_error"]
            assert problem["code"] == "JOURNAL_UNREADABLE", again
            message = problem["message"]
            assert "has no binding row, but the ACTION_ACCEPTED at seq 1 names it" in message
            assert "key-a" not in message  # the key itself is the caller's, never echoed
            # Nor where the journal lives: a socket caller (an agent) has no business knowing.
            assert str(daemon.journal) not in json.dumps(again), message
            assert message.startswith("the call ended without an envelope: the journal: ")
        # The operator's log says which row, too.
        assert "AlteredRow: journal " in daemon.log_text()
        assert "ACTION_ACCEPTED at seq 1 names it" in daemon.log_text()
    assert len(srv.requests) == 1
