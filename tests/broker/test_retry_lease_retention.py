"""A same-key retry whose lease could outlive the key's retention is not sent.

Seed, "Idempotency is defined by the remote contract": "If the service forgets keys after a
day, a later retry may create a new effect ... Store the earliest safe deadline, stop automatic
retries before it arrives, and then perform reconciliation."  The retry is judged when it takes
its lease, but it may send at any moment that lease runs (its timeout, plus ``[service]
lease_margin``), and the remote checks the key when the request arrives.  A key with 150 s of
retention left passes the 60 s margin now; under a 130 s lease it may reach the remote with
20 s left -- or, on a slow connection, after the remote forgot it.  It was resent; now the
retry is answered from the record (reconcile) and nothing is sent.  A shorter lease (the
caller's own timeout) that ends within the margin is still retried.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.statemachine import EventKind as E
from tests.http.hostile import HostileServer, Peer, Reply

from .helpers import event_kinds, http_target, open_broker, write_config
from .http_rows import IDEM

LIMIT = 30  # seconds: the bound on each scenario
CHARGE = {"target": "api", "method": "POST", "path": "/v1/x", "idempotency_key": "charge"}
TOTAL = 100  # the target's timeout.total: with lease_margin 30, a 130 s lease


def _journal(tmp: Path, backend: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    if backend == "sqlite":
        return {"path": str(tmp / "journal.db")}
    url = request.getfixturevalue("pg_url")
    return {"url": url, "key_file": str(tmp / "k"), "signing_key": str(tmp / "s")}


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
@pytest.mark.parametrize(
    ("timeout", "resent"),
    [(None, False), (5.0, True)],
    ids=["lease_outlives_retention", "lease_within_retention"],
)
async def test_a_same_key_retry_is_not_sent_when_its_lease_could_outlive_the_keys_retention(
    tmp_path: Path,
    token: str,
    request: pytest.FixtureRequest,
    backend: str,
    timeout: float | None,
    resent: bool,
) -> None:
    received: list[str] = []

    async def script(peer: Peer) -> None:
        # The first request closed unanswered (unknown outcome), any later one answered 201.
        while (req := await peer.read_request()) is not None:
            received.append(req.target)
            if peer.index == 0:
                await peer.close()
                return
            await peer.respond(Reply(201, body=b'{"ok": true}'))

    async with HostileServer.running(script) as srv:
        target = http_target(
            srv.url,
            timeout={"connect": 2, "total": TOTAL},
            idempotency={**IDEM, "retention": "150s"},
        )
        cfg = write_config(tmp_path, {"api": target}, journal=_journal(tmp_path, backend, request))
        with trio.fail_after(LIMIT):
            async with open_broker(cfg) as broker:
                first = await broker.call(CHARGE)
                # Well within retention now (150 s left, the margin is 60 s): retry same key.
                assert first["error"]["outcome"] == "unknown", first
                assert first["error"]["retry"] == "same_idempotency_key", first
                again = await broker.call(CHARGE, timeout=timeout)
                kinds = event_kinds(broker, first["invocation_id"])
    if resent:
        # 5 s + lease_margin 30 s: the key still has 115 s left when the lease ends.
        assert "error" not in again, again
        assert received == ["/v1/x", "/v1/x"]
        return
    # 100 s + 30 s: the lease would end with 20 s left, inside the margin -- not sent, and the
    # answer is the record's hint at the lease's end: reconcile, never "retry the same key".
    assert received == ["/v1/x"]
    err = again["error"]
    assert (err["outcome"], err["retry"]) == ("unknown", "reconcile"), again
    assert again["invocation_id"] == first["invocation_id"]
    assert E.RETRY_LEASE_ACQUIRED not in kinds, kinds  # nothing was written for it
