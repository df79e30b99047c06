"""A fence written before its rules (``fenced`` without ``rules``: ``FENCE_RULES``), read back
from an honest journal and answered from.

A broker from before the fence's rules wrote its ACTION_ACCEPTED, and its binder's preamble rows
landed in the record after it: either nothing was sent (the fence's close then came, and the
binder's LEASE_LOST), or the binder went on to its dispatch and sent (the fence's close was
refused).  Both are correctly chained records of what happened: reading them is never
``AlteredRow`` (the journal was not altered), and the record that proves the dispatch -- the one
an operator needs to find a double charge -- is answered as what it proves, never as "nothing was
sent under the key".  Seed: "Never claim more than the records prove".
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from affidavit.engine.ids import new_invocation_id
from affidavit.statemachine import Event, EvidenceSource
from affidavit.statemachine import EventKind as E
from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import http_target, open_broker, write_config
from .http_rows import IDEM, LIMIT, POST

KEY = "charge-1"
GONE = {
    "why": "window_over",
    "bound_at": 1.0,
    "judged_at": 3.0,
    "window": 1.1,
    "recorded": "nothing",
}
UNSENT = "nothing was sent"
CLOSE = {
    "code": "IDEMPOTENCY_MISMATCH",
    "field": "idempotency_key",
    "message": "a call with a different request under the key closed it here: nothing was sent",
    "binder_gone": GONE,
}
PREAMBLE = [
    (E.PREFLIGHT_VALIDATED, {"config_hash": "hmac-sha256:00"}),
    (E.CREDENTIAL_AUTHORIZED, {"version": 1, "inject": "bearer", "generation": 0}),
]
UNSENT_ROWS = [*PREAMBLE, (E.PREFLIGHT_FAILED, CLOSE), (E.LEASE_LOST, {"generation": 0})]
SENT_ROWS = [
    *PREAMBLE,
    (E.DISPATCH_STARTED, {"generation": 0, "connection": "c1"}),
    (E.REQUEST_SENT, {"generation": 0}),
]


async def _old_fence(broker: object, rows: list[tuple[E, dict[str, object]]]) -> str:
    """The binding and the rows a broker from before the rules wrote, through the journal."""
    iid = new_invocation_id()
    await broker.journal.bind_idempotency(  # type: ignore[attr-defined]
        IDEM["scope"], KEY, "sha256:bound", iid, None, target="api"
    )
    operation = {
        "target": "api",
        "protocol": None,
        "idempotent": False,
        "fingerprint": "sha256:bound",
        "idempotency": {"key": KEY, "scope": IDEM["scope"]},
    }
    recorder = broker._engine.recorder  # type: ignore[attr-defined]
    accepted = Event(E.ACTION_ACCEPTED, iid, {"operation": operation, "fenced": GONE})
    await recorder.write(accepted, barrier=True)
    for kind, attrs in rows:
        await recorder.write(
            Event(kind, iid, attrs, source=EvidenceSource.TRANSPORT_OBSERVED), barrier=True
        )
    return iid


@pytest.mark.parametrize(
    ("rows", "state", "outcome"),
    [(UNSENT_ROWS, "validation_failed", "not_attempted"), (SENT_ROWS, "request_sent", "unknown")],
    ids=["nothing_sent", "binder_sent"],
)
async def test_a_fence_from_before_its_rules_is_read_for_what_its_rows_prove(
    tmp_path: Path, token: str, rows: list[tuple[E, dict[str, object]]], state: str, outcome: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(201))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url, idempotency=IDEM)})
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                iid = await _old_fence(broker, rows)
        async with open_broker(cfg) as broker:  # read back: folded from the journal
            record = broker.record(iid)
            assert record is not None and (record.state, record.fenced) == (state, None), record
            sent = E.DISPATCH_STARTED in [kind for kind, _ in rows]
            with trio.fail_after(LIMIT):
                fetched = await broker.fetch_result(iid, as_operator=True)
                # Another request under the key: refused, from the record -- "nothing was sent
                # under the key" only where the record proves it (no dispatch).
                other = await broker.call({**POST, "idempotency_key": KEY})
            assert fetched is not None
            assert fetched["evidence"]["dispatch_started"] is sent, fetched
            assert (fetched.get("error") or {}).get("outcome", fetched.get("outcome")) == outcome
            assert other["error"]["code"] == "IDEMPOTENCY_MISMATCH", other
            if sent:
                assert UNSENT not in json.dumps(fetched), fetched
                assert UNSENT not in other["error"]["message"], other
            # Nothing of that call in the record; recovery closed a sent one as unknown.
            later = [(e.kind, e.attrs.get("code")) for e in broker.events(iid)][len(rows) + 1 :]
            assert later == ([(E.ATTEMPT_INTERRUPTED, "REMOTE_OUTCOME_UNKNOWN")] if sent else [])
        assert srv.requests == []  # nothing sent by these calls
