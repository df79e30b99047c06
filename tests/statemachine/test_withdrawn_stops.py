"""Stops before a retry's dispatch gate (audit 52a, round 2): a retry withdrawn by its caller,
stopped by the broker's shutdown, or closed by recovery after its worker stopped, sent nothing
and tried no target -- it spends no budget, and consecutive ones are one attempts entry with a
count, so whoever holds the key cannot grow the record (and every envelope) without limit."""

from __future__ import annotations

import json

import pytest

from affidavit.statemachine import Code, EventKind, Outcome, Retry, render_envelope

from .test_seed_rules import Inv, unknown_post

E = EventKind


def _retry(inv: Inv, gen: int, **stop: str) -> Inv:
    inv.ev(E.RETRY_LEASE_ACQUIRED, generation=gen).ev(E.CREDENTIAL_AUTHORIZED, generation=gen)
    return inv.ev(E.SETUP_FAILED, generation=gen, **stop)


def test_many_withdrawals_are_one_attempts_entry_with_their_count() -> None:
    inv = unknown_post(key="k1", budget=3)
    for gen in range(1, 41):  # the reviewer's probe: ~40 hang-ups
        _retry(inv, gen, code="CALLER_CANCELLED", stage="connecting")
    rec = inv.rec()
    assert [(a["stage"], a["code"], a.get("repeated")) for a in rec.attempts] == [
        ("dispatch", "REMOTE_OUTCOME_UNKNOWN", None),
        ("connecting", "CALLER_CANCELLED", 40),
    ]
    assert rec.attempts[1]["generation"] == 1  # the run's first generation
    assert (rec.budget.used, rec.retry) == (1, Retry.SAME_IDEMPOTENCY_KEY)
    shown = render_envelope(rec)["evidence"]["attempts"]
    assert shown[1]["repeated"] == 40 and len(shown) == 2
    assert len(json.dumps(render_envelope(rec))) < 4000


def test_alternating_the_stage_or_code_of_the_stops_does_not_grow_the_record() -> None:
    """The reviewer's alt.py: 40 withdrawn retries alternating ``connecting``/``idle`` (a
    hang-up at once, one during connect) made 41 entries when only same-stage stops merged."""
    inv = unknown_post(key="k1", budget=3)
    for gen in range(1, 41):
        _retry(inv, gen, code="CALLER_CANCELLED", stage=("connecting" if gen % 2 else "idle"))
    for gen in range(41, 45):
        _retry(inv, gen, code="BROKER_SHUTDOWN", stage="tls_established")
    for gen in range(45, 47):
        _retry(inv, gen, code="SETUP_FAILED", stage="broker_stopped", message="recovery's")
    rec = inv.rec()
    assert len(rec.attempts) == 2 and (rec.budget.used, rec.retry) == (
        1,
        Retry.SAME_IDEMPOTENCY_KEY,
    )
    run = rec.attempts[1]
    assert (run["generation"], run["repeated"]) == (1, 46)
    assert (run["stage"], run["code"]) == ("broker_stopped", "SETUP_FAILED")  # the latest
    assert run["stops"] == [
        {"stage": "connecting", "code": "CALLER_CANCELLED", "repeated": 20},
        {"stage": "idle", "code": "CALLER_CANCELLED", "repeated": 20},
        {"stage": "tls_established", "code": "BROKER_SHUTDOWN", "repeated": 4},
        {"stage": "broker_stopped", "code": "SETUP_FAILED", "repeated": 2},
    ]


def test_the_breakdown_is_bounded_whatever_stages_a_journal_holds() -> None:
    inv = unknown_post(key="k1", budget=3)
    for gen in range(1, 101):
        _retry(inv, gen, code="CALLER_CANCELLED", stage=f"s{gen}")
    snapshot = inv.rec()
    _retry(inv, 101, code="CALLER_CANCELLED", stage="s1")
    rec = inv.rec()
    stops = rec.attempts[1]["stops"]
    assert len(rec.attempts) == 2 and len(stops) == 16 and rec.attempts[1]["repeated"] == 101
    assert stops[-1] == {"stage": None, "code": None, "repeated": 85}
    assert stops[0]["repeated"] == 2
    assert snapshot.attempts[1]["stops"][0]["repeated"] == 1  # an earlier record unchanged


def test_a_dispatch_or_a_tried_target_starts_a_new_entry() -> None:
    inv = unknown_post(key="k1", budget=4)
    _retry(inv, 1, code="CALLER_CANCELLED", stage="connecting")
    _retry(inv, 2, code="BROKER_SHUTDOWN", stage="connecting")
    _retry(inv, 3, code="BROKER_SHUTDOWN", stage="connecting")
    inv.ev(E.RETRY_LEASE_ACQUIRED, generation=4).ev(E.CREDENTIAL_AUTHORIZED, generation=4)
    inv.dispatched(generation=4).ev(E.ATTEMPT_INTERRUPTED, code="CALLER_CANCELLED", generation=4)
    _retry(inv, 5, code="BROKER_SHUTDOWN", stage="connecting")
    rec = inv.rec()
    assert [(a["generation"], a["code"], a.get("repeated")) for a in rec.attempts] == [
        (0, "REMOTE_OUTCOME_UNKNOWN", None),
        (1, "BROKER_SHUTDOWN", 3),  # whatever their codes: one run
        (4, "CALLER_CANCELLED", None),
        (5, "BROKER_SHUTDOWN", 1),
    ]
    assert rec.budget.used == 2  # the two dispatched attempts


@pytest.mark.parametrize("stage", ["broker_stopped", "lease_lapsed"])
def test_recovery_s_close_before_the_gate_is_refunded_too(stage: str) -> None:
    """Recovery closes a retry whose worker stopped (crash, lapsed lease) before its gate with
    SETUP_FAILED: no DISPATCH_STARTED in its generation proves nothing was sent -- the same
    stop as a graceful BROKER_SHUTDOWN there."""
    inv = unknown_post(key="k1", budget=2)
    for gen in (1, 2, 3):
        _retry(inv, gen, code="SETUP_FAILED", stage=stage, message="recovery's")
    rec = inv.rec()
    assert (rec.budget.used, rec.retry) == (1, Retry.SAME_IDEMPOTENCY_KEY)
    assert rec.attempts[-1]["repeated"] == 3 and len(rec.attempts) == 2
    # Recovery's "nothing was sent" would read as the whole invocation's beside outcome
    # unknown: the message says this retry sent nothing and the earlier outcome stands.
    cause = {
        "broker_stopped": "The broker stopped before this retry's dispatch gate",
        "lease_lapsed": "This retry's lease ran out before its dispatch gate",
    }
    assert rec.message == (
        f"{cause[stage]}; this retry sent nothing, and the earlier attempt's outcome (unknown)"
        " stands."
    )
    # Any other SETUP_FAILED close (a journal refusal, an internal failure) still spends.
    _retry(inv, 4, code="SETUP_FAILED", stage="journal", message="journal")
    assert inv.rec().budget.used == 2


def test_a_tried_target_then_a_hang_up_spends_its_budget() -> None:
    """A refused connection try in this generation is the target tried: the caller's hang-up
    or short deadline after it does not give the budget back."""
    inv = unknown_post(key="k1", budget=3)
    inv.ev(E.RETRY_LEASE_ACQUIRED, generation=1).ev(E.CREDENTIAL_AUTHORIZED, generation=1)
    inv.ev(E.SETUP_ATTEMPT_FAILED, code="CONNECTION_REFUSED", stage="tcp", generation=1)
    inv.ev(E.SETUP_FAILED, code="CALLER_CANCELLED", stage="connecting", generation=1)
    rec = inv.rec()
    assert rec.budget.used == 2
    assert [a.get("repeated") for a in rec.attempts] == [None, None, None]
    # A later withdrawal with no try is refunded and not folded into the tried one.
    _retry(inv, 2, code="CALLER_CANCELLED", stage="connecting")
    assert inv.rec().budget.used == 2
    assert [a.get("repeated") for a in inv.rec().attempts] == [None, None, None, 1]


@pytest.mark.parametrize(
    ("stop", "who"),
    [
        (Code.CALLER_CANCELLED, "withdrawn (its caller hung up or its deadline passed)"),
        (Code.BROKER_SHUTDOWN, "stopped by the broker's shutdown"),
    ],
    ids=["CALLER_CANCELLED", "BROKER_SHUTDOWN"],
)
def test_the_message_claims_only_this_retry_and_keeps_the_earlier_outcome(
    stop: Code, who: str
) -> None:
    inv = _retry(unknown_post(key="k1", budget=3), 1, code=stop.value, stage="connecting")
    rec = inv.rec()
    assert rec.outcome is Outcome.UNKNOWN
    assert rec.message == (
        f"This retry was {who} before its dispatch gate and sent nothing; the earlier"
        " attempt's outcome (unknown) stands."
    )
    assert "not_attempted" not in render_envelope(rec)["error"]["message"]
