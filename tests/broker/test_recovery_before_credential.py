"""Recovery closes every state a stopped worker can leave a record in.

A retry after ``setup_failed`` takes its lease into ``validated`` (RETRY_LEASE_ACQUIRED); a first
attempt is in ``validated`` while it resolves its credential, and a take-over's ACTION_ACCEPTED
is a barrier of its own (``accepted``).  A worker that stops there -- before its posted
CREDENTIAL_AUTHORIZED commits -- left a record that recovery had no event for: not final, every
fetch and same-key call answered IN_PROGRESS for ever, never retried nor reconciled.  Now such
an attempt is closed with SETUP_FAILED (nothing of it was sent), as in ``authorized``; and no
closing changes the outcome the record proves.  (Seed: "Terminate the broker between every pair
of durable transitions".)"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from affidavit.engine.approval import APPROVAL_STATES
from affidavit.engine.recovery import closing_event
from affidavit.statemachine import Event, EventKind
from affidavit.statemachine.lifecycle import STATES
from tests.statemachine.lifecycle_helpers import path_to, projector_in

from .helpers import closed_port, http_target, open_broker, write_config
from .http_rows import IDEM

E = EventKind
ACTION = {
    "target": "api",
    "method": "POST",
    "path": "/charge",
    "body": "{}",
    "idempotency_key": "v1",
}


async def test_a_retry_that_died_before_its_credential_step_is_recovered(
    tmp_path: Path, token: str
) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    cfg = write_config(tmp_path, {"api": http_target(url, idempotency=IDEM)})
    async with open_broker(cfg) as b:
        first = await b.call(ACTION, timeout=1.0)
        assert first["error"]["outcome"] == "not_attempted", first  # setup_failed
        iid = first["invocation_id"]
        # A worker takes the retry lease and dies before anything else of its try is recorded.
        lease = await b.journal.acquire_lease(iid, "dead-worker", ttl=0.2)
        rec = b.record(iid)
        assert rec is not None and rec.state == "validated" and not rec.final
        while time.time() <= lease.expires_at:
            await trio.sleep(0.05)
        fetched = await b.fetch_result(iid)  # recovery's first chance
        again = await b.call(ACTION, timeout=1.0)  # the same key: recovery, then decide()
        rec = b.record(iid)
        assert rec is not None
        kinds = [e.kind for e in b.events(iid)]
    assert fetched is not None
    for env in (fetched, again):
        assert env["error"]["code"] != "IN_PROGRESS", (rec.state, env["error"])
    # The dead worker's try was closed (nothing sent), and the same-key call retried after it.
    closed = kinds.index(E.RETRY_LEASE_ACQUIRED) + 1
    assert kinds[closed] is E.SETUP_FAILED, kinds
    assert kinds.count(E.RETRY_LEASE_ACQUIRED) == 2, kinds
    assert rec.generation > lease.generation and rec.state == "setup_failed", rec.state


STOPPABLE = sorted(
    name
    for name, spec in STATES.items()
    if not spec.final and name not in APPROVAL_STATES and name != "new"
)
"""Every state a worker can stop in, leaving the record unfinished (the approval states end
by decision or expiry instead: ``approval.expire_if_due``)."""


@pytest.mark.parametrize("state", STOPPABLE)
def test_recovery_has_a_closing_event_for_every_state_a_worker_can_stop_in(state: str) -> None:
    p = projector_in(state)
    record = p.record()
    closing = closing_event(record, "broker_stopped")
    assert closing is not None, f"{state}: recovery cannot close it"
    seq = len(path_to(state)) + 1
    after = p.apply(Event(closing.kind, closing.invocation_id, closing.attrs, seq=seq))
    assert STATES[after].final, (state, closing.kind, after)
    assert p.record().outcome is record.outcome, (state, after)  # nothing more is claimed


@pytest.mark.parametrize("stage", ["broker_stopped", "journal"])
@pytest.mark.parametrize("state", STOPPABLE)
def test_an_attempt_closed_before_dispatch_names_its_cause_not_a_transport(
    state: str, stage: str
) -> None:
    """An attempt closed before its dispatch gate (SETUP_FAILED) because the broker stopped or
    the journal refused a write says so -- never "another transport reason", which blames a
    connection that never failed -- and claims no more than the record: nothing of this
    attempt was sent, an earlier attempt's dispatch still leaves the outcome unknown."""
    p = projector_in(state)
    record = p.record()
    closing = closing_event(record, stage)
    assert closing is not None
    if closing.kind is not E.SETUP_FAILED:
        return  # after dispatch or a complete result: closed by another event, not this one
    p.apply(Event(closing.kind, closing.invocation_id, closing.attrs, seq=len(path_to(state)) + 1))
    message = p.record().message
    assert "transport" not in message, (state, message)
    cause = "broker stopped" if stage == "broker_stopped" else "journal"
    assert cause in message, (state, message)
    if record.evidence.get("dispatch_started"):
        assert "retry sent nothing" in message and "unknown" in message, (state, message)
    else:
        assert message.endswith("nothing was sent."), (state, message)
