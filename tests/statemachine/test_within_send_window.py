"""``within_send_window``: a record's key-bound hints judged by a longer lease than the one it
recorded (``[service] lease_margin`` raised since it was accepted).

Only the hints a usable key gave change -- ``same_idempotency_key``, a throttled non-idempotent
request's ``backoff``, and the same in a batch's items -- and only to ``reconcile``; a backoff
no key gave (a refusal before dispatch, an idempotent request) and a window no longer than the
recorded one change nothing.
"""

from __future__ import annotations

from typing import Any

import pytest

from affidavit.statemachine import Code, Outcome, Phase, Record, Retry, within_send_window
from affidavit.statemachine.record import Budget
from affidavit.statemachine.retry import RETENTION_MARGIN_S

NOW = 1_000.0
WINDOW = 130.0
EXPIRES = NOW + RETENTION_MARGIN_S + 140.0  # a retry's lease may run 140 s and no longer


def _record(retry: Retry, code: Code | None, *, idempotent: bool = False, **kw: Any) -> Record:
    fields: dict[str, Any] = {
        "invocation_id": "act_1",
        "state": "interrupted",
        "phase": Phase.REMOTE_EXECUTION,
        "outcome": Outcome.UNKNOWN,
        "retry": retry,
        "code": code,
        "message": "",
        "session": None,
        "target": "api",
        "protocol": "http",
        "idempotent": idempotent,
        "fingerprint": "sha256:aa",
        "idempotency": {"key": "k", "expires_at": EXPIRES, "send_window": WINDOW},
        "generation": 0,
        "budget": Budget(3, 1),
        "attempts": (),
        "evidence": {},
        "retry_after": None,
        "last_seq": 1,
        "events": 4,
    }
    return Record(**{**fields, **kw})


def test_a_longer_lease_the_key_cannot_outlast_turns_same_key_to_reconcile() -> None:
    rec = _record(Retry.SAME_IDEMPOTENCY_KEY, Code.REMOTE_OUTCOME_UNKNOWN)
    assert within_send_window(rec, NOW, WINDOW + 20).retry is Retry.RECONCILE
    # A longer lease the key still outlasts, or one no longer than recorded: unchanged.
    assert within_send_window(rec, NOW, WINDOW + 5) is rec
    assert within_send_window(rec, NOW, WINDOW - 30) is rec


def test_only_a_backoff_the_key_gave_is_withdrawn() -> None:
    throttled = _record(
        Retry.BACKOFF, Code.REMOTE_THROTTLED, state="stored_rejected", outcome=Outcome.REJECTED
    )
    assert within_send_window(throttled, NOW, WINDOW + 20).retry is Retry.RECONCILE
    safe = _record(
        Retry.BACKOFF,
        Code.REMOTE_THROTTLED,
        idempotent=True,
        state="stored_rejected",
        outcome=Outcome.REJECTED,
    )
    assert within_send_window(safe, NOW, WINDOW + 20) is safe
    before = _record(
        Retry.BACKOFF,
        Code.APPROVAL_LIMIT,
        state="credential_failed",
        phase=Phase.CREDENTIAL_INJECTION,
        outcome=Outcome.NOT_ATTEMPTED,
    )
    assert within_send_window(before, NOW, WINDOW + 20) is before


def test_a_batch_items_key_bound_hints_follow_the_parents() -> None:
    items = (
        {"id": "a", "outcome": "rejected", "code": "REMOTE_THROTTLED", "retry": "backoff"},
        {"id": "b", "outcome": "unknown", "code": "REMOTE_RESULT_INCOMPLETE", "retry": "reconcile"},
        {"id": "c", "outcome": "rejected", "code": "REMOTE_REJECTED", "retry": "after_correction"},
    )
    rec = _record(Retry.SAME_IDEMPOTENCY_KEY, Code.REMOTE_OUTCOME_UNKNOWN, items=items)
    got = within_send_window(rec, NOW, WINDOW + 20)
    assert got.items is not None
    assert [i["retry"] for i in got.items] == ["reconcile", "reconcile", "after_correction"]
    assert rec.items == items  # the record read is not changed


@pytest.mark.parametrize("idem", [None, {"key": "k", "send_window": WINDOW}])
def test_a_record_without_a_key_expiry_is_unchanged(idem: Any) -> None:
    rec = _record(Retry.SAME_IDEMPOTENCY_KEY, Code.REMOTE_OUTCOME_UNKNOWN, idempotency=idem)
    assert within_send_window(rec, NOW, WINDOW + 1_000) is rec
