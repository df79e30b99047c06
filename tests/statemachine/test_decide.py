"""Item 8d: ``decide()`` agrees with the seed's pseudocode on generated records.

The seed's ``decide(record, operation)`` is transcribed below a second time, over plain strings,
independently of ``statemachine/retry.py``; hypothesis generates records by driving valid event
sequences through the projection, then also forces every (outcome, retry) combination.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from affidavit.statemachine import Operation, Outcome, Projector, Record, Retry, decide
from affidavit.statemachine.lifecycle import TRANSITIONS

from .lifecycle_helpers import IID, make_event, operation, valid_moves


def seed_decide(record: Any, operation: Any) -> str:
    # Seed, "Retry code must be simple and testable" — verbatim structure.
    if record.retry == "fetch_result":
        return "FETCH"

    if record.outcome == "not_attempted":
        if record.retry == "backoff":
            return "RETRY_NEW_ATTEMPT"
        return "STOP_FOR_CORRECTION"

    if record.outcome == "unknown":
        if operation.idempotent:
            return "RETRY_NEW_ATTEMPT"
        if record.retry == "same_idempotency_key" and operation.fingerprint == record.fingerprint:
            return "RETRY_SAME_KEY"
        return "RECONCILE"

    if record.outcome == "rejected" and record.retry == "backoff":
        return "RETRY_WHEN_ALLOWED"

    return "RETURN_RECORDED_RESULT"


@st.composite
def records(draw: st.DrawFn) -> tuple[Record, float]:
    now = 1_000.0
    op = operation(
        idempotent=draw(st.booleans()),
        fingerprint=draw(st.sampled_from(["sha256:aaaa", "sha256:bbbb"])),
        key=draw(st.sampled_from([None, "req_1"])),
        expires_at=draw(st.sampled_from([None, now + 30.0, now + 3_600.0])),
        budget=draw(st.integers(1, 4)),
        max_retry_after=draw(st.sampled_from([10.0, 300.0])),
    )
    p = Projector(IID)

    def choose(options: Any) -> Any:
        return draw(st.sampled_from(list(options)))

    p.apply(make_event(p, *valid_moves(p)[0], seq=1, op=op))
    for seq in range(2, draw(st.integers(2, 30))):
        moves = valid_moves(p)
        onward = [m for m in moves if m[1] != p.state and TRANSITIONS[m[1]]]
        if onward and draw(st.integers(0, 4)) > 0:
            moves = onward
        if not moves:
            break
        kind, dest = draw(st.sampled_from(moves))
        p.apply(make_event(p, kind, dest, seq, choose))
    return p.record(now + draw(st.sampled_from([0.0, 100.0, 10_000.0]))), now


def _operations(rec: Record) -> st.SearchStrategy[Operation]:
    return st.builds(
        Operation,
        idempotent=st.booleans(),
        fingerprint=st.sampled_from([rec.fingerprint, "sha256:other", None]),
    )


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_decide_agrees_with_seed_pseudocode_on_projected_records(data: st.DataObject) -> None:
    rec, _now = data.draw(records())
    op = data.draw(_operations(rec))
    assert decide(rec, op).value == seed_decide(rec, op)


@settings(max_examples=300, deadline=None)
@given(
    data=st.data(),
    outcome=st.sampled_from(list(Outcome)),
    retry=st.sampled_from(list(Retry)),
)
def test_decide_agrees_with_seed_pseudocode_on_every_outcome_and_hint(
    data: st.DataObject, outcome: Outcome, retry: Retry
) -> None:
    rec, _now = data.draw(records())
    forced = dataclasses.replace(rec, outcome=outcome, retry=retry)
    op = data.draw(_operations(rec))
    assert decide(forced, op).value == seed_decide(forced, op)
