"""A same-key retry is invited only while the broker will send it, and sent only while its
lease ends within the key's retention.

Seed, "Idempotency is defined by the remote contract": "If the service forgets keys after a
day, a later retry may create a new effect ... Store the earliest safe deadline, stop automatic
retries before it arrives, and then perform reconciliation."  A retry may send at any moment
its lease runs (its timeout, plus ``[service] lease_margin``), and the remote checks the key
when the request arrives, so a retry whose lease could outlast the key (less its 60 s margin)
is not sent (journal/leases.py).  The hint judged the key only at the moment: a key with 150 s
left under a 130 s lease was shown ``same_idempotency_key`` -- in the first envelope, a fetch
and the actions view -- and the same-key retry it invited was answered ``reconcile`` with
nothing sent.  The send window (the lease a default retry takes) is now recorded at
acceptance and the hint keeps it free: with 150 s left it says ``reconcile`` everywhere, as the
retry is then answered; with 200 s it says ``same_idempotency_key`` and the retry is sent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.mcp.backends import Embedded
from affidavit.statemachine import EventKind as E
from tests.http.hostile import HostileServer, Peer, Reply

from .helpers import event_kinds, http_target, open_broker, write_config
from .http_rows import IDEM

LIMIT = 30  # seconds: the bound on each scenario
CHARGE = {"target": "api", "method": "POST", "path": "/v1/x", "idempotency_key": "charge"}
TOTAL = 100  # the target's timeout.total: with lease_margin 30, a 130 s send window


def _journal(tmp: Path, backend: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    if backend == "sqlite":
        return {"path": str(tmp / "journal.db")}
    url = request.getfixturevalue("pg_url")
    return {"url": url, "key_file": str(tmp / "k"), "signing_key": str(tmp / "s")}


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
@pytest.mark.parametrize(
    ("retention", "hint", "resent"),
    [("150s", "reconcile", False), ("200s", "same_idempotency_key", True)],
    ids=["lease_outlives_retention", "lease_within_retention"],
)
async def test_the_hint_invites_a_same_key_retry_only_while_the_broker_sends_it(
    tmp_path: Path,
    token: str,
    request: pytest.FixtureRequest,
    backend: str,
    retention: str,
    hint: str,
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
            idempotency={**IDEM, "retention": retention},
        )
        cfg = write_config(tmp_path, {"api": target}, journal=_journal(tmp_path, backend, request))
        with trio.fail_after(LIMIT):
            async with open_broker(cfg) as broker:
                first = await broker.call(CHARGE)
                iid = first["invocation_id"]
                assert first["error"]["outcome"] == "unknown", first
                # 100 s + lease_margin 30 s: with 150 s left a retry taken now would end its
                # lease inside the 60 s margin; with 200 s, 10 s before it.
                assert first["error"]["retry"] == hint, first
                fetched = await broker.fetch_result(iid)
                assert fetched is not None and fetched["error"]["retry"] == hint, fetched
                (listed,) = broker.journal.list_actions()
                assert listed.retry == hint
                shown = (await Embedded(broker).record(iid))["record"]
                assert shown["retry"] == hint, shown
                again = await broker.call(CHARGE)
                kinds = event_kinds(broker, iid)
    assert again["invocation_id"] == iid
    if resent:
        assert "error" not in again, again
        assert received == ["/v1/x", "/v1/x"]
        return
    # The retry the hint no longer invites: answered from the record, nothing sent or written.
    assert received == ["/v1/x"]
    err = again["error"]
    assert (err["outcome"], err["retry"]) == ("unknown", "reconcile"), again
    assert E.RETRY_LEASE_ACQUIRED not in kinds, kinds
