"""A same-key retry after a retry that has finished is a retry, not IN_PROGRESS.

Broker A's POST is sent and cut off (unknown, ``same_idempotency_key``); broker B retries it
under a retry lease and is cut off again -- its call has answered, its attempt is closed, the
record says ``same_idempotency_key``.  Broker C then calls with the same key.  B's lease row
still ran (timeout + margin), and the journal took it for a live holder: C was told
``IN_PROGRESS`` / ``fetch_result`` ("has not finished ... never send it again") for the rest of
it, against a record that had finished.  The same after a daemon's start-up closed a crashed
retry (found by ``test_crash_matrix.py``, ``post_retry``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from affidavit import Broker
from tests.http.hostile import HostileServer, Peer, Reply

from .helpers import TOKEN_ENV, http_target, write_config


async def test_a_same_key_call_after_a_finished_retry_retries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, "lease-token")
    seen: list[str] = []

    async def api(peer: Peer) -> None:
        while (req := await peer.read_request()) is not None:
            seen.append(req.header("Idempotency-Key") or "")
            if len(seen) <= 2:  # A's and B's attempts: sent, never answered
                await peer.reset()
                return
            await peer.respond(Reply(201, body=b'{"id":"pay_1"}'))

    async with HostileServer.running(api) as srv:
        cfg = write_config(
            tmp_path,
            {
                "t": http_target(
                    srv.url,
                    methods=["POST"],
                    idempotent=[],
                    timeout={"connect": 2, "total": 10},
                    idempotency={"header": "Idempotency-Key", "scope": "p", "retention": "1h"},
                )
            },
        )
        action = {"target": "t", "method": "POST", "path": "/p", "body": "{}"}
        action["idempotency_key"] = "pay-1"
        envelopes = []
        with trio.fail_after(30):
            for _ in "ABC":  # three brokers, three holders
                async with Broker.open(cfg) as broker:
                    envelopes.append(await broker.call(action))
    a, b, c = envelopes
    assert a["error"]["retry"] == b["error"]["retry"] == "same_idempotency_key"
    assert b["evidence"]["generation"] == 1
    assert "error" not in c, c["error"]
    assert c["result"]["status"] == 201
    assert c["invocation_id"] == a["invocation_id"]
    assert c["evidence"]["generation"] == 2
    assert seen == ["pay-1"] * 3
