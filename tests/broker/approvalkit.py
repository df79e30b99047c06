"""Shared pieces of the approval and reconciliation tests: configs with operators, an operator
identity that is not the test's own uid, and a scripted payments API that remembers what it
applied (its reconciliation query reads it back)."""

from __future__ import annotations

import json
import sqlite3
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from affidavit.api.broker import Broker
from affidavit.approvals import Operator
from affidavit.journal.chain import canonical_json
from affidavit.journal.sealing import BrokerKey, payload_aad
from affidavit.statemachine import Record
from tests.http.hostile import Peer, Reply, Script

from .helpers import assert_error, http_target, write_config

__all__ = [
    "OPS",
    "OPS_UID",
    "PaymentsApi",
    "approval_config",
    "dispatched_stale",
    "reconcile_target",
    "verify_ok",
]

OPS_UID = 4242
OPS = Operator(OPS_UID, OPS_UID, (), "ops")
"""An operator who is not the requester: this process's uid asks, uid 4242 decides."""


def approval_config(
    tmp: Path,
    url: str,
    *,
    approval: Any = "always",
    service: Mapping[str, Any] | None = None,
    name: str = "affidavit.toml",
    journal: Mapping[str, Any] | None = None,
    **target: Any,
) -> Path:
    """A config with target ``api`` (``approval`` as given) and ``[service]`` naming
    ``OPS_UID`` an operator (plus ``service``); ``journal``: as ``write_config``'s."""
    api = {"api": http_target(url, approval=approval, **target)}
    path = write_config(tmp, api, name=name, journal=journal)
    lines = ["[service]", f"operator_uids = [{OPS_UID}]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in (service or {}).items()]
    with path.open("a", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return path


def reconcile_target(url: str, *, settle: str | None = "0s", **extra: Any) -> dict[str, Any]:
    """Target ``api`` with a key contract and the payments API's reconciliation query; its
    ``settle`` window ``"0s"`` (the payments API has no queue a dropped request could still
    wait in) unless given (None: the default)."""
    window = {} if settle is None else {"settle": settle}
    return {
        "api": http_target(
            url,
            idempotency={"header": "Idempotency-Key", "scope": "charges", "retention": "24h"},
            reconcile={
                "path": "/v1/charges?idempotency_key={idempotency_key}",
                # The payments API echoes the key it was asked for ({"key": ...}): only its own
                # answer about this key settles (a status alone is refused for rejected_if,
                # warned of for committed_if).
                "committed_if": ["status:200", "json:/key={idempotency_key}"],
                "rejected_if": ["status:404", "json:/key={idempotency_key}"],
                **window,
            },
            **extra,
        )
    }


class PaymentsApi:
    """``POST /v1/charges``: applies a charge under its Idempotency-Key; with the body
    ``{"drop": true}`` it applies it and closes without answering, with ``{"refuse": true}``
    it closes without applying, with ``{"late": true}`` it closes and applies it only at
    ``release_late()`` (a request that waited in the remote's queue after the broker gave up).
    ``GET /v1/charges?idempotency_key=K``: 200 if K was applied, 404 if not -- unless K is
    ``drop`` (closed unanswered) or ``boom`` (a 500)."""

    def __init__(self) -> None:
        self.applied: list[str] = []
        self.queued: list[str] = []

    def release_late(self) -> None:
        self.applied += self.queued
        self.queued.clear()

    @property
    def script(self) -> Script:
        async def script(peer: Peer) -> None:
            while True:
                req = await peer.read_request()
                if req is None:
                    return
                if req.method == "POST":
                    body = json.loads(req.body or b"{}")
                    key = req.header("idempotency-key") or ""
                    if body.get("late"):
                        self.queued.append(key)
                    elif not body.get("refuse"):
                        self.applied.append(key)
                    if body.get("drop") or body.get("refuse") or body.get("late"):
                        await peer.close()
                        return
                    await peer.respond(Reply(201, body=b'{"id": "ch_1"}'))
                    continue
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(req.target).query)
                key = query.get("idempotency_key", [""])[0]
                if key == "drop":
                    await peer.close()
                    return
                status = 500 if key == "boom" else 200 if key in self.applied else 404
                await peer.respond(Reply(status, body=json.dumps({"key": key}).encode()))

        return script


async def dispatched_stale(broker: Broker, iid: str) -> Record:
    """The approved ``iid`` handed to the dispatcher and refused APPROVAL_STALE at its gate:
    validation, not attempted, after correction, in the envelope and the record; the record."""
    await broker.dispatch_approved(iid)
    return assert_error(
        broker,
        await broker.fetch_result(iid) or {},
        phase="validation",
        outcome="not_attempted",
        retry="after_correction",
        code="APPROVAL_STALE",
    )


def verify_ok(broker: Broker) -> None:
    report = broker.journal.verify()
    assert report.ok, report.reason


def reseal_accepted(journal: Path, iid: str, action: Mapping[str, Any], key: BrokerKey) -> None:
    """Replace the action sealed with ACTION_ACCEPTED by ``action`` sealed with ``key``: what
    the dispatcher (or the console's content download) reads back then differs from what was
    approved.  Whoever edits the file drops the append-only trigger first
    (tests/journal/test_tamper) -- and reopening the journal puts it back.  (A row's hash
    covers its sealed payload: ``journal verify`` finds the edit -- afterwards.)"""
    conn = sqlite3.connect(journal)
    try:
        (seq,) = conn.execute(
            "SELECT seq FROM events WHERE invocation_id = ? AND kind = 'ACTION_ACCEPTED'", (iid,)
        ).fetchone()
        conn.execute("DROP TRIGGER events_no_update")
        sealed = key.seal(
            canonical_json({"action": dict(action)}).encode(), payload_aad(iid, "ACTION_ACCEPTED")
        )
        conn.execute("UPDATE events SET payload = ? WHERE seq = ?", (sealed, seq))
        conn.commit()
    finally:
        conn.close()
