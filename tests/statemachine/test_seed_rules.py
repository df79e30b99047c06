"""One test per evidence rule of the seed, named after the rule it proves.

Each builds an invocation from journal-shaped events and reads the projected record, the retry
hint, ``decide()`` and the envelope — never an exception class.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from affidavit.statemachine import (
    Code,
    Decision,
    Event,
    EventKind,
    EvidenceSource,
    ImpossibleEvent,
    Operation,
    Outcome,
    Phase,
    Projector,
    Record,
    Retry,
    decide,
    lease_lost_error,
    open_query,
    render_envelope,
)
from affidavit.statemachine.lifecycle import INITIAL, TRANSITIONS, expand
from affidavit.statemachine.retry import RETENTION_MARGIN_S

from .lifecycle_helpers import IID, operation

E = EventKind
S = EvidenceSource
FP = "sha256:aaaa"


class Inv:
    """An invocation under test: append events with increasing seq, read the record."""

    def __init__(self, requester: dict[str, Any] | None = None, **op: Any) -> None:
        self.p = Projector(IID)
        self.seq = 0
        named = {"requester": {"uid": 1000} if requester is None else requester}
        if requester == {}:  # an older record's: it names no requester
            named = {}
        self.ev(E.ACTION_ACCEPTED, operation=operation(**op), **named)

    def ev(
        self,
        kind: EventKind,
        source: EvidenceSource = S.TRANSPORT_OBSERVED,
        observer: str | None = None,
        observer_seq: int | None = None,
        **attrs: Any,
    ) -> Inv:
        self.seq += 1
        event = Event(
            kind,
            IID,
            attrs,
            source=source,
            seq=self.seq,
            observer=observer,
            observer_seq=observer_seq,
        )
        self.p.apply(event)
        return self

    def refused(
        self, kind: EventKind, source: EvidenceSource = S.TRANSPORT_OBSERVED, **attrs: Any
    ) -> str:
        before = self.p.record()
        with pytest.raises(ImpossibleEvent) as info:
            self.p.apply(Event(kind, IID, attrs, source=source, seq=self.seq + 1))
        assert self.p.record() == before
        return info.value.reason

    def authorized(self) -> Inv:
        # As the engine validates: with the keyed config hash (a record without one has its
        # fingerprints withheld from a caller: statemachine/withheld.py).
        validated = self.ev(E.PREFLIGHT_VALIDATED, config_hash="hmac-sha256:c0f1")
        return validated.ev(E.CREDENTIAL_AUTHORIZED, credential="api")

    def dispatched(self, generation: int = 0) -> Inv:
        return self.ev(E.DISPATCH_STARTED, generation=generation)

    def interrupted(self, code: Code = Code.REMOTE_OUTCOME_UNKNOWN) -> Inv:
        return self.ev(E.ATTEMPT_INTERRUPTED, code=code.value)

    def complete(self, outcome: Outcome, code: Code | None = None, **attrs: Any) -> Inv:
        return self.ev(
            E.REMOTE_RESPONSE_COMPLETE,
            source=S.REMOTE_RESPONSE,
            outcome=outcome.value,
            code=code.value if code else None,
            **attrs,
        )

    def rec(self, now: float | None = None) -> Record:
        return self.p.record(now)


def unknown_post(**op: Any) -> Inv:
    """A POST whose connection closed after the whole request was written."""
    return Inv(**op).authorized().dispatched().ev(E.REQUEST_SENT).interrupted()


# --- "Validation and credential injection finish before dispatch" -----------------------------


def test_validation_error_is_not_attempted_with_field_path_and_after_correction() -> None:
    inv = Inv().ev(E.PREFLIGHT_FAILED, code="PAYLOAD_LIMIT", field="body")
    r = inv.rec()
    assert (r.phase, r.outcome, r.retry, r.code) == (
        Phase.VALIDATION,
        Outcome.NOT_ATTEMPTED,
        Retry.AFTER_CORRECTION,
        Code.PAYLOAD_LIMIT,
    )
    assert render_envelope(r)["error"]["field"] == "body"
    assert decide(r, Operation(idempotent=True)) is Decision.STOP_FOR_CORRECTION


def test_a_refusal_naming_the_bound_invocation_carries_it_as_evidence_not_only_prose() -> None:
    """Seed: "The message text should not be parsed programmatically".  A CONFIG_CHANGED
    refusal of a same-key call names the invocation the key is bound to in
    ``evidence.idempotency.bound_to``; a row naming anything but a string is refused, the
    record unchanged."""
    inv = Inv()
    assert inv.refused(E.PREFLIGHT_FAILED, code="CONFIG_CHANGED", field="t", bound_to=7) == (
        "bound_to must be a string"
    )
    r = inv.ev(E.PREFLIGHT_FAILED, code="CONFIG_CHANGED", field="t", bound_to="act_1").rec()
    assert render_envelope(r)["evidence"]["idempotency"] == {"bound_to": "act_1"}


APPROVAL = {"fingerprint": "sha256:a990", "expires_at": 1_900_000_000.0}
OPS = {"uid": 1001, "name": "ops", "via": "socket"}


def awaiting() -> Inv:
    return Inv().ev(E.PREFLIGHT_VALIDATED).ev(E.APPROVAL_REQUESTED, **APPROVAL)


def approved() -> Inv:
    return awaiting().ev(E.APPROVAL_GRANTED, fingerprint=APPROVAL["fingerprint"], operator=OPS)


def test_denied_approval_says_never_for_this_invocation() -> None:
    r = awaiting().ev(E.APPROVAL_DENIED, code="APPROVAL_DENIED", operator=OPS, note="no")
    rec = r.rec()
    assert (rec.phase, rec.outcome, rec.retry) == (
        Phase.CREDENTIAL_INJECTION,
        Outcome.NOT_ATTEMPTED,
        Retry.NEVER,
    )
    assert rec.evidence["approval"]["operator"] == OPS
    assert rec.evidence["approval"]["note"] == "no"


def test_a_pending_approval_is_approval_pending_fetch_result_not_in_progress() -> None:
    rec = awaiting().rec()
    err = render_envelope(rec)["error"]
    assert (err["code"], err["phase"], err["outcome"], err["retry"]) == (
        "APPROVAL_PENDING",
        "credential_injection",
        "not_attempted",
        "fetch_result",
    )
    assert (rec.code, rec.retry) == (Code.APPROVAL_PENDING, Retry.FETCH_RESULT)
    assert decide(rec, Operation(idempotent=True)) is Decision.FETCH
    # Once approved it waits for its dispatcher: in progress, never "pending approval".
    assert render_envelope(approved().rec())["error"]["code"] == "IN_PROGRESS"


def test_a_grant_binds_the_requested_fingerprint_and_nothing_else() -> None:
    reason = awaiting().refused(E.APPROVAL_GRANTED, fingerprint="sha256:other", operator=OPS)
    assert "sha256:a990" in reason
    validated = Inv().ev(E.PREFLIGHT_VALIDATED)
    assert "fingerprint" in validated.refused(E.APPROVAL_REQUESTED, expires_at=1.0)


def test_a_pending_code_ends_nothing() -> None:
    reason = Inv().ev(E.PREFLIGHT_VALIDATED).refused(E.CREDENTIAL_FAILED, code="APPROVAL_PENDING")
    assert "ends nothing" in reason


def test_nobody_deciding_in_time_is_approval_expired_validation_not_attempted() -> None:
    for inv in (awaiting(), approved()):
        rec = inv.ev(E.PREFLIGHT_FAILED, code="APPROVAL_EXPIRED", field="approval").rec()
        assert (rec.phase, rec.outcome, rec.retry, rec.code) == (
            Phase.VALIDATION,
            Outcome.NOT_ATTEMPTED,
            Retry.AFTER_CORRECTION,
            Code.APPROVAL_EXPIRED,
        )
        assert inv.refused(E.CREDENTIAL_AUTHORIZED)


def test_the_dispatch_lease_of_an_approved_invocation_spends_no_budget() -> None:
    inv = approved().ev(E.DISPATCH_LEASE_ACQUIRED, generation=1, holder="w1")
    inv.ev(E.DISPATCH_LEASE_ACQUIRED, generation=2, holder="w2")  # w1 stalled
    assert "exceed 2" in inv.refused(E.DISPATCH_LEASE_ACQUIRED, generation=2, holder="w1")
    inv.ev(E.CREDENTIAL_AUTHORIZED, credential="api")
    assert "stale generation 1" in inv.refused(E.DISPATCH_STARTED, generation=1)
    rec = inv.dispatched(generation=2).rec()
    assert (rec.generation, rec.budget.used) == (2, 1)
    assert awaiting().refused(E.DISPATCH_LEASE_ACQUIRED, generation=1)


def test_locked_vault_is_credential_injection_not_attempted() -> None:
    rec = Inv().ev(E.PREFLIGHT_VALIDATED).ev(E.CREDENTIAL_FAILED, code="VAULT_LOCKED").rec()
    assert (rec.phase, rec.outcome, rec.code) == (
        Phase.CREDENTIAL_INJECTION,
        Outcome.NOT_ATTEMPTED,
        Code.VAULT_LOCKED,
    )


def test_fingerprint_change_after_approval_is_validation_not_attempted() -> None:
    inv = approved().ev(E.CREDENTIAL_AUTHORIZED).ev(E.PREFLIGHT_FAILED, code="APPROVAL_STALE")
    rec = inv.rec()
    assert (rec.phase, rec.outcome, rec.code) == (
        Phase.VALIDATION,
        Outcome.NOT_ATTEMPTED,
        Code.APPROVAL_STALE,
    )
    assert inv.refused(E.DISPATCH_STARTED)


def test_a_validation_event_must_carry_a_validation_code() -> None:
    reason = Inv().refused(E.PREFLIGHT_FAILED, code="CONNECTION_REFUSED")
    assert "connection_setup code" in reason


def test_credential_values_never_reach_the_record_or_envelope() -> None:
    canary = "sk_live_CANARY_5f1e"
    inv = Inv().ev(E.PREFLIGHT_VALIDATED)
    inv.ev(E.CREDENTIAL_AUTHORIZED, credential="api", version=2, authorization=f"Bearer {canary}")
    inv.ev(E.DISPATCH_STARTED, generation=0, headers={"Authorization": canary})
    inv.interrupted()
    assert canary not in json.dumps(render_envelope(inv.rec()))
    assert canary not in repr(inv.rec())


# --- "Connection setup needs a precise end point" ---------------------------------------------


def test_setup_attempts_are_each_recorded_and_none_reached_the_remote() -> None:
    inv = Inv().authorized()
    inv.ev(E.SETUP_ATTEMPT_FAILED, code="CONNECTION_REFUSED", stage="tcp_connect")
    inv.ev(E.SETUP_FAILED, code="CERTIFICATE_INVALID", stage="tls_handshake")
    rec = inv.rec()
    assert [(a["n"], a["stage"], a["outcome"], a["code"]) for a in rec.attempts] == [
        (1, "tcp_connect", "not_attempted", "CONNECTION_REFUSED"),
        (2, "tls_handshake", "not_attempted", "CERTIFICATE_INVALID"),
    ]
    assert (rec.phase, rec.outcome, rec.retry) == (
        Phase.CONNECTION_SETUP,
        Outcome.NOT_ATTEMPTED,
        Retry.AFTER_CORRECTION,
    )
    assert render_envelope(rec)["evidence"]["dispatch_started"] is False


def test_refused_connection_may_back_off_until_the_budget_is_spent() -> None:
    inv = Inv(budget=2).authorized().ev(E.SETUP_FAILED, code="CONNECTION_REFUSED", stage="tcp")
    assert inv.rec().retry is Retry.BACKOFF
    assert decide(inv.rec(), Operation(idempotent=False)) is Decision.RETRY_NEW_ATTEMPT
    inv.ev(E.RETRY_LEASE_ACQUIRED, generation=1).ev(E.CREDENTIAL_AUTHORIZED)
    inv.ev(E.SETUP_FAILED, code="CONNECTION_REFUSED", stage="tcp")
    assert inv.rec().budget.left == 0
    assert inv.rec().retry is Retry.AFTER_CORRECTION
    assert "budget" in inv.refused(E.RETRY_LEASE_ACQUIRED, generation=2)


@pytest.mark.parametrize("stop", [Code.CALLER_CANCELLED, Code.BROKER_SHUTDOWN], ids=str)
def test_a_retry_stopped_before_its_gate_gives_its_budget_back(stop: Code) -> None:
    """A same-key retry withdrawn (its caller hung up) or stopped (the broker's shutdown)
    before its dispatch gate sent nothing: it was no attempt, so the budget its lease took is
    given back -- else whoever holds the key spends an unknown record's budget by hanging up
    and turns its ``same_idempotency_key`` into ``reconcile`` (audit 52a).  The record still
    says what the dispatched attempt proved, and that this retry sent nothing."""
    inv = unknown_post(key="k1", budget=3)
    assert (inv.rec().budget.used, inv.rec().retry) == (1, Retry.SAME_IDEMPOTENCY_KEY)
    for gen in range(1, 6):  # more withdrawn retries than the budget holds
        inv.ev(E.RETRY_LEASE_ACQUIRED, generation=gen).ev(E.CREDENTIAL_AUTHORIZED, generation=gen)
        inv.ev(E.SETUP_FAILED, code=stop.value, stage="connecting", generation=gen)
        rec = inv.rec()
        assert (rec.state, rec.outcome, rec.retry) == (
            "retry_setup_failed",
            Outcome.UNKNOWN,
            Retry.SAME_IDEMPOTENCY_KEY,
        )
        assert rec.budget.used == 1
        assert rec.message.endswith(
            "before its dispatch gate and sent nothing; the earlier attempt's outcome (unknown)"
            " stands."
        )
    assert decide(inv.rec(), Operation(False, FP)) is Decision.RETRY_SAME_KEY


def test_a_retry_that_dispatched_or_met_its_target_keeps_its_budget_spent() -> None:
    """The refund is for a stop before the gate only: a retry that reached DISPATCH_STARTED may
    have been sent (its cancellation is ATTEMPT_INTERRUPTED, budget spent), and a refused
    connection is the target tried and failing -- an attempt the budget bounds."""
    inv = unknown_post(key="k1", budget=3)
    inv.ev(E.RETRY_LEASE_ACQUIRED, generation=1).ev(E.CREDENTIAL_AUTHORIZED, generation=1)
    inv.dispatched(generation=1).ev(E.ATTEMPT_INTERRUPTED, code="CALLER_CANCELLED", generation=1)
    assert inv.rec().budget.used == 2
    inv.ev(E.RETRY_LEASE_ACQUIRED, generation=2).ev(E.CREDENTIAL_AUTHORIZED, generation=2)
    inv.ev(E.SETUP_FAILED, code="CONNECTION_REFUSED", stage="tcp", generation=2)
    rec = inv.rec()
    assert (rec.budget.used, rec.retry) == (3, Retry.RECONCILE)
    assert "sent nothing" not in rec.message


def test_a_first_attempt_withdrawn_before_its_gate_spends_no_budget() -> None:
    """The first attempt too (counted at ACTION_ACCEPTED), as a refused preflight: with
    ``budget = 1`` a hang-up must not turn its ``backoff`` into ``after_correction``."""
    inv = Inv(budget=1).authorized()
    inv.ev(E.SETUP_FAILED, code="CALLER_CANCELLED", stage="connecting")
    rec = inv.rec()
    assert (rec.outcome, rec.retry, rec.budget.used) == (Outcome.NOT_ATTEMPTED, Retry.BACKOFF, 0)
    assert "the earlier attempt" not in (rec.message or "")  # nothing earlier was sent either
    # Stopped while it waited for its key's binder (engine/invocation.py): nothing sent either.
    waited = Inv(budget=1).ev(E.SETUP_FAILED, code="CALLER_CANCELLED", stage="accepted").rec()
    assert (waited.retry, waited.budget.used) == (Retry.BACKOFF, 0)


def test_only_a_credential_refusal_that_says_backoff_is_retried_under_its_invocation() -> None:
    """APPROVAL_LIMIT (too many requests of this uid await a decision) says backoff, and a
    same-key call retries it: the lease takes it back to validated, where it asks again.  A
    missing, unusable or locked credential must be corrected first: no retry lease."""
    inv = Inv(budget=2).ev(E.PREFLIGHT_VALIDATED).ev(E.CREDENTIAL_FAILED, code="APPROVAL_LIMIT")
    assert (inv.rec().state, inv.rec().retry) == ("credential_failed", Retry.BACKOFF)
    assert decide(inv.rec(), Operation(idempotent=False)) is Decision.RETRY_NEW_ATTEMPT
    inv.ev(E.RETRY_LEASE_ACQUIRED, generation=1)
    assert inv.rec().state == "validated"
    inv.ev(E.CREDENTIAL_FAILED, code="APPROVAL_LIMIT", generation=1)
    assert inv.rec().budget.left == 2  # both refused in their preflight: no budget spent
    inv.ev(E.RETRY_LEASE_ACQUIRED, generation=2)
    inv.ev(E.APPROVAL_REQUESTED, fingerprint="sha256:a990", expires_at=1_900_000_000.0)
    assert inv.rec().state == "awaiting_approval"
    for code in ("CREDENTIAL_MISSING", "CREDENTIAL_INVALID", "VAULT_LOCKED"):
        inv = Inv(budget=3).ev(E.PREFLIGHT_VALIDATED).ev(E.CREDENTIAL_FAILED, code=code)
        assert inv.rec().retry is Retry.AFTER_CORRECTION
        assert "backoff" in inv.refused(E.RETRY_LEASE_ACQUIRED, generation=1), code


def test_a_retry_after_a_dispatch_never_waits_for_approval() -> None:
    """An approval is asked only before anything was sent (from ``validated``): a same-key
    retry of an unknown outcome -- its key may have reached the remote -- never waits for an
    operator, so its key's retention is never left unchecked by such a wait.  It is judged in
    the transaction that takes its lease (``leases.acquire_op``) and sent under that lease,
    with the grant it already holds (the gate re-checks its expiry)."""
    inv = unknown_post(budget=3).ev(E.RETRY_LEASE_ACQUIRED, generation=1)
    assert inv.rec().state == "retry_pending"
    assert inv.refused(E.APPROVAL_REQUESTED, **APPROVAL)


def test_a_first_attempt_refused_in_its_preflight_does_not_spend_a_budget_of_one() -> None:
    """APPROVAL_LIMIT on the first attempt: nothing asked, nothing sent -- no attempt.  With
    ``budget = 1`` it keeps its budget, so the hint stays ``backoff`` (there is nothing to
    correct) and the same-key retry that hint promises may take its lease."""
    inv = Inv(budget=1).ev(E.PREFLIGHT_VALIDATED).ev(E.CREDENTIAL_FAILED, code="APPROVAL_LIMIT")
    assert inv.rec().budget.left == 1
    assert inv.rec().retry is Retry.BACKOFF
    inv.ev(E.RETRY_LEASE_ACQUIRED, generation=1)
    assert (inv.rec().state, inv.rec().budget.left) == ("validated", 0)


def test_a_retry_refused_in_its_preflight_does_not_spend_the_budget() -> None:
    """Issue 9: a retry whose credential or re-validation is refused never reached setup -- it
    was no attempt, so the budget its lease took comes back."""
    for refusal, attrs in (
        (E.CREDENTIAL_FAILED, {"code": "CREDENTIAL_MISSING"}),
        (E.PREFLIGHT_FAILED, {"code": "CONFIG_CHANGED", "field": "credential"}),
    ):
        inv = Inv(budget=2).authorized().ev(E.SETUP_FAILED, code="CONNECTION_REFUSED", stage="t")
        assert inv.rec().budget.left == 1
        inv.ev(E.RETRY_LEASE_ACQUIRED, generation=1).ev(refusal, **attrs)
        assert inv.rec().budget.left == 1, refusal
        unknown = unknown_post(idempotent=True)
        left = unknown.rec().budget.left
        unknown.ev(E.RETRY_LEASE_ACQUIRED, generation=1).ev(refusal, **attrs)
        assert unknown.rec().budget.left == left, refusal
    # A retry that reached setup was an attempt.
    inv = Inv(budget=2).authorized().ev(E.SETUP_FAILED, code="CONNECTION_REFUSED", stage="t")
    inv.ev(E.RETRY_LEASE_ACQUIRED, generation=1).ev(E.CREDENTIAL_AUTHORIZED)
    inv.ev(E.SETUP_FAILED, code="CONNECTION_REFUSED", stage="t")
    assert inv.rec().budget.left == 0


# --- "Dispatch shifts the burden of proof" ----------------------------------------------------


def test_failure_after_dispatch_is_unknown_whatever_the_local_error_said() -> None:
    rec = unknown_post().rec()
    assert (rec.phase, rec.outcome, rec.code) == (
        Phase.REMOTE_EXECUTION,
        Outcome.UNKNOWN,
        Code.REMOTE_OUTCOME_UNKNOWN,
    )
    assert rec.evidence["dispatch_started"] is True


def test_cancellation_after_dispatch_is_unknown() -> None:
    rec = Inv().authorized().dispatched().interrupted(Code.CALLER_CANCELLED).rec()
    assert (rec.phase, rec.outcome, rec.code, rec.retry) == (
        Phase.REMOTE_EXECUTION,
        Outcome.UNKNOWN,
        Code.CALLER_CANCELLED,
        Retry.RECONCILE,
    )


@pytest.mark.parametrize(
    ("kind", "code"),
    [
        (E.SETUP_FAILED, "CONNECTION_REFUSED"),
        (E.SETUP_ATTEMPT_FAILED, "CONNECT_TIMEOUT"),
        (E.PREFLIGHT_FAILED, "CONFIG_CHANGED"),
        (E.CREDENTIAL_FAILED, "VAULT_LOCKED"),
    ],
)
def test_nothing_returns_to_not_attempted_after_dispatch(kind: EventKind, code: str) -> None:
    inv = Inv().authorized().dispatched()
    inv.refused(kind, code=code, stage="tcp")
    inv.interrupted()
    inv.refused(kind, code=code, stage="tcp")
    assert inv.rec().outcome is Outcome.UNKNOWN


def test_retry_setup_failure_after_unknown_stays_unknown() -> None:
    inv = unknown_post(budget=3)
    inv.ev(E.RETRY_LEASE_ACQUIRED, generation=1, holder="w1").ev(E.CREDENTIAL_AUTHORIZED)
    inv.ev(E.SETUP_FAILED, code="CONNECTION_REFUSED", stage="tcp_connect")
    rec = inv.rec()
    assert (rec.phase, rec.outcome, rec.code) == (
        Phase.CONNECTION_SETUP,
        Outcome.UNKNOWN,
        Code.CONNECTION_REFUSED,
    )
    assert rec.retry is Retry.RECONCILE
    assert [a["outcome"] for a in rec.attempts] == ["unknown", "not_attempted"]


def test_a_new_attempt_resets_per_attempt_flags_but_never_dispatch_started() -> None:
    inv = unknown_post(idempotent=True)
    assert inv.rec().evidence["request_complete"] is True
    inv.ev(E.RETRY_LEASE_ACQUIRED, generation=1).dispatched(generation=1)
    ev = inv.rec().evidence
    assert ev["dispatch_started"] is True
    assert ev["request_complete"] is False
    assert [a["generation"] for a in inv.rec().attempts] == [0, 1]


def test_a_complete_3xx_s_evidence_says_why_it_was_not_followed() -> None:
    """A 3xx that is the result (an approved request follows no redirect; an origin the target
    does not list; a Location carrying the credential) says why in the envelope's evidence, as
    REMOTE_RESPONSE_COMPLETE recorded it -- the caller need not guess from the status alone."""
    why = {"reason": "an approved request follows no redirect", "origin": "https://a.example"}
    inv = Inv().authorized().dispatched()
    inv.complete(Outcome.COMMITTED, status=307, redirect_not_followed=why, remote_request_id="r1")
    ev = inv.rec().evidence
    assert ev["redirect_not_followed"] == why
    assert (ev["status"], ev["remote_request_id"]) == (307, "r1")


def test_stale_lease_holder_is_stopped_before_dispatch() -> None:
    # Seed: "Stop one worker after it acquires a retry lease, wait for the lease to expire, and
    # start another.  When the first one resumes, the generation check must stop it."
    inv = unknown_post(budget=4)
    inv.ev(E.RETRY_LEASE_ACQUIRED, generation=1, holder="w1")
    inv.ev(E.RETRY_LEASE_ACQUIRED, generation=2, holder="w2")  # w1's lease expired
    assert "stale generation 1" in inv.refused(E.DISPATCH_STARTED, generation=1)
    inv.ev(E.LEASE_LOST, generation=1)
    assert inv.rec().evidence["stale_workers"] == [{"generation": 1, "seq": inv.seq}]
    assert "must exceed 2" in inv.refused(E.RETRY_LEASE_ACQUIRED, generation=2)
    inv.dispatched(generation=2)
    assert inv.rec().generation == 2
    assert [a["generation"] for a in inv.rec().attempts] == [0, 2]


def _lost(inv: Inv, generation: int, dispatched: bool) -> tuple[str, str, str, str]:
    err = lease_lost_error(inv.rec(), generation, dispatched=dispatched)
    assert err["code"] == "LEASE_LOST"
    return err["phase"], err["outcome"], err["retry"], err["message"]


@pytest.mark.parametrize("dispatched", [False, True], ids=["at-its-gate", "after-dispatch"])
def test_a_stale_worker_s_answer_is_the_record_s_whenever_it_was_stopped(dispatched: bool) -> None:
    # One rule before and after its dispatch: the record's phase and outcome; fetch_result
    # while the record is not final or once it holds a result, else the record's own hint;
    # a message that says only what the record shows.
    inv = unknown_post(idempotent=True, budget=4)
    inv.ev(E.RETRY_LEASE_ACQUIRED, generation=1, holder="w1")
    phase, outcome, retry, message = _lost(inv, 0, dispatched)
    assert (phase, outcome, retry) == ("connection_setup", "unknown", "fetch_result")
    assert "generation 1" in message and "not finished" in message
    assert ("sent nothing" in message) is not dispatched
    inv.ev(E.CREDENTIAL_AUTHORIZED, credential="api", generation=1).dispatched(generation=1)
    assert _lost(inv, 0, dispatched)[:3] == ("remote_execution", "unknown", "fetch_result")
    inv.complete(Outcome.COMMITTED, status=201, generation=1)
    inv.ev(E.RESULT_COMMITTED, generation=1, sha256="b")
    phase, outcome, retry, message = _lost(inv, 0, dispatched)
    assert (outcome, retry) == ("committed", "fetch_result") and "is stored" in message
    # The worker's own attempt closed by recovery, nobody else acting: the record's hint.
    closed = Inv(idempotent=True).authorized().dispatched(generation=0)
    closed.interrupted()
    rec = closed.rec()
    phase, outcome, retry, message = _lost(closed, 0, dispatched)
    assert (phase, outcome, retry) == ("remote_execution", "unknown", rec.retry.value)
    assert "closed (interrupted)" in message and "newer" not in message
    # Neither: its lease (the journal's row) is no longer valid, and that is all it says.
    running = Inv().authorized().dispatched(generation=0)
    phase, outcome, retry, message = _lost(running, 0, dispatched)
    assert (outcome, retry) == ("unknown", "fetch_result")
    assert "no longer valid" in message
    assert "newer" not in message and "closed" not in message


def test_a_stale_worker_is_stopped_after_dispatch_too() -> None:
    # The same stale worker, resumed after its own dispatch: its milestones, complete response,
    # result and interruption name its generation and are refused in the attempt that took
    # over -- the lifecycle alone would accept each of them in that attempt's states.
    inv = Inv(idempotent=True, budget=4).authorized().dispatched(generation=0)
    inv.interrupted()  # recovery closed generation 0's attempt once its lease ran out
    inv.ev(E.RETRY_LEASE_ACQUIRED, generation=1, holder="w2")
    inv.ev(E.CREDENTIAL_AUTHORIZED, credential="api", generation=1).dispatched(generation=1)
    committed = {"source": S.REMOTE_RESPONSE, "outcome": "committed", "code": None}
    stale = [
        (E.REQUEST_SENT, {}),
        (E.REMOTE_RESPONSE_STARTED, {"status": 201}),
        (E.PROTOCOL_OBSERVED, {"protocol": "http", "state": "framing_complete"}),
        (E.REMOTE_RESPONSE_COMPLETE, {**committed, "status": 201}),
        (E.ATTEMPT_INTERRUPTED, {"code": Code.CALLER_CANCELLED.value}),
        (E.RESULT_STORE_FAILED, {"stage": "result_store"}),
    ]
    for kind, attrs in stale:
        assert "stale generation 0" in inv.refused(kind, generation=0, **attrs), kind
        assert "stale generation True" in inv.refused(kind, generation=True, **attrs), kind
    inv.ev(E.REQUEST_SENT, generation=1).complete(Outcome.COMMITTED, status=201, generation=1)
    assert "stale generation 0" in inv.refused(E.RESULT_COMMITTED, generation=0, sha256="x")
    inv.ev(E.RESULT_COMMITTED, generation=1, sha256="b")
    inv.ev(E.LEASE_LOST, generation=0)  # what the stale worker records instead
    rec = inv.rec()
    assert rec.state == "stored_committed" and rec.evidence["result"]["sha256"] == "b"
    assert [(a["generation"], a["outcome"]) for a in rec.attempts] == [
        (0, "unknown"),
        (1, "committed"),
    ]
    assert [w["generation"] for w in rec.evidence["stale_workers"]] == [0]
    # An event naming no generation (a journal written before they did) is not checked.
    old = Inv(idempotent=True).authorized().dispatched().ev(E.REQUEST_SENT)
    assert old.complete(Outcome.COMMITTED).rec().state == "completed_committed"


def test_a_stale_retry_cannot_end_the_retry_that_took_over_before_its_dispatch() -> None:
    inv = unknown_post(budget=4)
    inv.ev(E.RETRY_LEASE_ACQUIRED, generation=1, holder="w1")
    inv.ev(E.RETRY_LEASE_ACQUIRED, generation=2, holder="w2")  # w1 stalled in setup
    setup = {"code": "CONNECTION_REFUSED", "stage": "tcp_connect"}
    for kind, attrs in [
        (E.CREDENTIAL_AUTHORIZED, {"credential": "api"}),
        (E.CREDENTIAL_FAILED, {"code": Code.CREDENTIAL_MISSING.value}),
        (E.PREFLIGHT_FAILED, {"code": Code.CONFIG_CHANGED.value, "field": "target"}),
        (E.SETUP_ATTEMPT_FAILED, setup),
        (E.SETUP_FAILED, setup),
    ]:
        assert "stale generation 1" in inv.refused(kind, generation=1, **attrs), kind
    inv.ev(E.SETUP_FAILED, generation=2, **setup)
    assert inv.rec().state == "retry_setup_failed"


_HOP = {"protocol": "http", "state": "hop_dispatch", "facts": {"hop2": {"hop": 2}}}
_SUMMARY = {"protocol": "http", "state": "framing_complete", "facts": {"status": 201}}


@pytest.mark.parametrize("closed_by", ["recovery", "reconciliation"])
def test_a_closed_attempt_takes_no_more_events_of_its_generation(closed_by: str) -> None:
    # Recovery closes a stale attempt with the generation it closes, and a reconciliation
    # settles it, without a new lease: the closed attempt's generation is still the record's
    # current one.  Its stalled worker, resuming, must not add to the closed record -- not the
    # facts it received, nor the dispatch of a redirect's next hop (PROTOCOL_OBSERVED, which
    # the lifecycle accepts in every state).
    inv = Inv(idempotent=True, budget=4).authorized().dispatched(generation=0)
    inv.ev(E.ATTEMPT_INTERRUPTED, code=Code.REMOTE_OUTCOME_UNKNOWN.value, generation=0)
    if closed_by == "reconciliation":
        inv.ev(E.RECONCILED, source=S.OPERATOR_ATTESTED, outcome="rejected", generation=0)
    closed = inv.rec()
    for attrs in (_HOP, _SUMMARY):
        assert "closed" in inv.refused(E.PROTOCOL_OBSERVED, generation=0, **attrs)
    inv.ev(E.LEASE_LOST, generation=0, holder="w0")  # what the stale worker records instead
    inv.ev(E.PROTOCOL_OBSERVED, **_SUMMARY)  # naming no generation (older journals): unchecked
    assert inv.rec().evidence["http"] == {"status": 201}
    assert closed.evidence.get("http") is None
    if closed_by == "reconciliation":
        return
    # The next attempt takes a new generation: closing the old one does not refuse it.
    inv.ev(E.RETRY_LEASE_ACQUIRED, generation=1, holder="w1")
    inv.ev(E.CREDENTIAL_AUTHORIZED, credential="api", generation=1).dispatched(generation=1)
    inv.ev(E.PROTOCOL_OBSERVED, generation=1, **_HOP)
    assert "stale generation 0" in inv.refused(E.PROTOCOL_OBSERVED, generation=0, **_HOP)
    inv.complete(Outcome.COMMITTED, status=201, generation=1)
    inv.ev(E.PROTOCOL_OBSERVED, generation=1, **_SUMMARY)
    inv.ev(E.RESULT_COMMITTED, generation=1, sha256="b")
    assert inv.rec().state == "stored_committed"
    # ... until it is closed in turn (here: its result stored).
    assert "closed" in inv.refused(E.PROTOCOL_OBSERVED, generation=1, **_SUMMARY)


def test_early_final_response_before_the_body_was_sent_is_accepted() -> None:
    inv = Inv().authorized().dispatched().ev(E.REMOTE_RESPONSE_STARTED, status=413)
    inv.ev(E.REQUEST_SENT).complete(Outcome.REJECTED, Code.REMOTE_REJECTED, status=413)
    assert inv.rec().outcome is Outcome.REJECTED


# --- "A complete remote result determines the execution outcome" -----------------------------


def test_complete_500_post_is_committed_and_says_reconcile_never_backoff() -> None:
    inv = Inv().authorized().dispatched().complete(Outcome.COMMITTED, Code.REMOTE_ERROR)
    rec = inv.rec()
    assert (rec.outcome, rec.retry) == (Outcome.COMMITTED, Retry.RECONCILE)
    assert decide(rec, Operation(idempotent=False, fingerprint=FP)) is (
        Decision.RETURN_RECORDED_RESULT
    )


def test_complete_401_is_rejected_and_needs_correction() -> None:
    inv = Inv().authorized().dispatched().complete(Outcome.REJECTED, Code.REMOTE_REJECTED)
    assert (inv.rec().outcome, inv.rec().retry) == (Outcome.REJECTED, Retry.AFTER_CORRECTION)


def test_exit_status_23_is_committed_not_a_failure_to_run() -> None:
    inv = Inv().authorized().dispatched()
    inv.complete(Outcome.COMMITTED, Code.REMOTE_COMMAND_FAILED, exit_status=23)
    rec = inv.rec()
    assert (rec.outcome, rec.retry, rec.evidence["exit_status"]) == (
        Outcome.COMMITTED,
        Retry.NEVER,
        23,
    )


def test_429_on_idempotent_operation_with_retry_after_is_backoff() -> None:
    inv = Inv(idempotent=True).authorized().dispatched()
    inv.complete(Outcome.REJECTED, Code.REMOTE_THROTTLED, status=429, retry_after=30)
    rec = inv.rec()
    assert (rec.outcome, rec.retry, rec.retry_after) == (Outcome.REJECTED, Retry.BACKOFF, 30.0)
    assert decide(rec, Operation(idempotent=True)) is Decision.RETRY_WHEN_ALLOWED


def test_429_whose_retry_after_exceeds_the_configured_maximum_is_not_backoff() -> None:
    inv = Inv(idempotent=True, max_retry_after=60).authorized().dispatched()
    inv.complete(Outcome.REJECTED, Code.REMOTE_THROTTLED, retry_after=3_600)
    assert inv.rec().retry is Retry.RECONCILE


def test_429_on_unsafe_post_without_key_is_not_backoff() -> None:
    inv = Inv(idempotent=False).authorized().dispatched()
    inv.complete(Outcome.REJECTED, Code.REMOTE_THROTTLED, retry_after=1)
    assert inv.rec().retry is Retry.RECONCILE


def test_a_complete_result_must_come_from_the_remote_response() -> None:
    inv = Inv().authorized().dispatched()
    reason = inv.refused(
        E.REMOTE_RESPONSE_COMPLETE, source=S.TRANSPORT_OBSERVED, outcome="committed"
    )
    assert "remote_response" in reason
    assert "cannot classify" in inv.refused(
        E.REMOTE_RESPONSE_COMPLETE,
        source=S.REMOTE_RESPONSE,
        outcome="committed",
        code="REMOTE_REJECTED",
    )


def test_committed_never_becomes_unknown_or_not_attempted() -> None:
    inv = Inv().authorized().dispatched().complete(Outcome.COMMITTED).ev(E.RESULT_COMMITTED)
    inv.refused(E.ATTEMPT_INTERRUPTED, code="REMOTE_OUTCOME_UNKNOWN")
    inv.refused(E.RECONCILED, source=S.OPERATOR_ATTESTED, outcome="rejected")
    inv.refused(E.RETRY_LEASE_ACQUIRED, generation=1)
    inv.refused(E.SETUP_FAILED, code="CONNECTION_REFUSED")
    assert inv.rec().outcome is Outcome.COMMITTED


# --- "A result delivery error must not repeat execution" --------------------------------------


def test_result_delivery_failure_keeps_committed_and_says_fetch_result() -> None:
    inv = Inv().authorized().dispatched().complete(Outcome.COMMITTED, status=201)
    inv.ev(E.RESULT_COMMITTED, sha256="sha256:beef").ev(E.RESULT_DELIVERY_FAILED)
    rec = inv.rec()
    assert (rec.phase, rec.outcome, rec.retry, rec.code) == (
        Phase.RESULT_DELIVERY,
        Outcome.COMMITTED,
        Retry.FETCH_RESULT,
        Code.RESULT_DELIVERY_FAILED,
    )
    assert decide(rec, Operation(idempotent=False)) is Decision.FETCH
    assert rec.evidence["result"]["sha256"] == "sha256:beef"


@pytest.mark.parametrize(
    ("status", "code", "retry"),
    [(201, None, Retry.NEVER), (400, Code.REMOTE_REJECTED, Retry.AFTER_CORRECTION)],
)
def test_a_failed_delivery_of_a_record_naming_no_requester_says_no_fetch(
    status: int, code: Code | None, retry: Retry
) -> None:
    # No read delivers a record naming no requester (an older journal's: engine.delivery):
    # "fetch it" would be asked again after every fetch.  Its state says the delivery failed;
    # its code and hint are its stored result's, as another uid's read shows it.
    outcome = Outcome.COMMITTED if code is None else Outcome.REJECTED
    inv = Inv(requester={}).authorized().dispatched().complete(outcome, code, status=status)
    inv.ev(E.RESULT_COMMITTED).ev(E.RESULT_DELIVERY_FAILED)
    rec = inv.rec()
    assert rec.requester is None
    assert rec.state == f"delivery_failed_{outcome.value}"
    assert (rec.outcome, rec.retry, rec.code) == (outcome, retry, code)


def test_the_requester_is_the_latest_asker_s() -> None:
    # A same-key retry's lease names its asker; the dispatcher's lease names none and changes
    # nothing; a row naming no valid uid leaves none known.
    refused = {"code": "CONNECTION_REFUSED", "stage": "tcp"}
    inv = Inv(requester={"uid": 7}, budget=4).authorized().ev(E.SETUP_FAILED, **refused)
    assert inv.rec().requester == 7
    for gen, named, requester in [(1, {"uid": 8}, 8), (2, None, 8), (3, {"uid": True}, None)]:
        asker = {} if named is None else {"requester": named}
        inv.ev(E.RETRY_LEASE_ACQUIRED, generation=gen, **asker).ev(E.CREDENTIAL_AUTHORIZED)
        inv.ev(E.SETUP_FAILED, **refused)
        assert inv.rec().requester == requester, gen


@pytest.mark.parametrize("outcome", [Outcome.COMMITTED, Outcome.REJECTED])
@pytest.mark.parametrize("kind", [E.RESULT_DELIVERED, E.RESULT_DELIVERY_FAILED])
def test_a_result_is_not_delivered_before_it_is_stored(outcome: Outcome, kind: EventKind) -> None:
    # Seed, "The order of writes matters": append the result, commit it retrievably, *then*
    # deliver -- "If the broker delivers the result first and logs afterward, a crash can leave
    # the caller with a successful response while the audit shows an unknown outcome."
    code = None if outcome is Outcome.COMMITTED else Code.REMOTE_REJECTED
    inv = Inv().authorized().dispatched().complete(outcome, code)
    inv.refused(kind)
    inv.ev(E.RESULT_COMMITTED).ev(kind)


def test_no_path_through_the_lifecycle_delivers_without_storing_the_result() -> None:
    # Every state reachable without RESULT_COMMITTED: none of them may record a delivery.
    seen, todo = {INITIAL}, [INITIAL]
    while todo:
        state = todo.pop()
        for kind in TRANSITIONS[state]:
            if kind is E.RESULT_COMMITTED:
                continue
            for dest in expand(state, kind):
                if dest not in seen:
                    seen.add(dest)
                    todo.append(dest)
    for state in seen:
        row = TRANSITIONS[state]
        assert E.RESULT_DELIVERED not in row, state
        assert E.RESULT_DELIVERY_FAILED not in row, state


def test_delivery_after_a_failed_delivery_restores_the_remote_classification() -> None:
    inv = Inv().authorized().dispatched().complete(Outcome.REJECTED, Code.REMOTE_REJECTED)
    inv.ev(E.RESULT_COMMITTED).ev(E.RESULT_DELIVERY_FAILED).ev(E.RESULT_DELIVERED)
    rec = inv.rec()
    assert (rec.state, rec.outcome, rec.code) == (
        "delivered_rejected",
        Outcome.REJECTED,
        Code.REMOTE_REJECTED,
    )


def test_result_store_failure_keeps_only_what_the_record_proves() -> None:
    after_result = Inv().authorized().dispatched().complete(Outcome.COMMITTED)
    after_result.ev(E.RESULT_STORE_FAILED)
    rec = after_result.rec()
    assert (rec.phase, rec.outcome, rec.retry, rec.code) == (
        Phase.RESULT_DELIVERY,
        Outcome.COMMITTED,
        Retry.NEVER,
        Code.RESULT_STORE_FAILED,
    )
    no_result = Inv().authorized().dispatched().ev(E.RESULT_STORE_FAILED).rec()
    assert (no_result.outcome, no_result.retry) == (Outcome.UNKNOWN, Retry.NEVER)


# --- "Idempotency is defined by the remote contract" -----------------------------------------


def test_unknown_idempotent_operation_is_backoff() -> None:
    rec = unknown_post(idempotent=True).rec()
    assert rec.retry is Retry.BACKOFF
    assert decide(rec, Operation(idempotent=True)) is Decision.RETRY_NEW_ATTEMPT


def test_unknown_with_configured_key_within_retention_is_same_idempotency_key() -> None:
    rec = unknown_post(key="req_01", expires_at=10_000.0).rec(now=1_000.0)
    assert rec.retry is Retry.SAME_IDEMPOTENCY_KEY
    assert decide(rec, Operation(idempotent=False, fingerprint=FP)) is Decision.RETRY_SAME_KEY
    # a modified body under the same key must not be sent again
    changed = Operation(idempotent=False, fingerprint="sha256:bbbb")
    assert decide(rec, changed) is Decision.RECONCILE


def test_unknown_with_key_past_retention_is_reconcile() -> None:
    inv = unknown_post(key="req_01", expires_at=10_000.0)
    assert inv.rec(now=10_000.0 - RETENTION_MARGIN_S - 1).retry is Retry.SAME_IDEMPOTENCY_KEY
    # "stop automatic retries before it arrives, and then perform reconciliation"
    assert inv.rec(now=10_000.0 - RETENTION_MARGIN_S).retry is Retry.RECONCILE
    assert inv.rec(now=20_000.0).retry is Retry.RECONCILE


def test_unknown_with_key_stops_retrying_a_margin_before_the_remote_forgets_it() -> None:
    # The boundary test above is relative to RETENTION_MARGIN_S, so it holds for a margin of 0
    # too; a second before expiry is inside any real margin: no resend on the key then.
    inv = unknown_post(key="req_01", expires_at=10_000.0)
    assert inv.rec(now=10_000.0 - 1).retry is Retry.RECONCILE
    assert inv.rec(now=10_000.0 - 30).retry is Retry.RECONCILE


def test_unknown_with_key_stops_retrying_when_a_retry_taken_now_could_outlast_the_key() -> None:
    # A retry taken at ``now`` may send until its lease ends (the recorded send window: the
    # target's timeout plus lease_margin), and journal/leases.py refuses one whose lease could
    # outlast the key: the hint says same_idempotency_key only while that retry is sent.
    inv = unknown_post(key="req_01", expires_at=10_000.0, send_window=130.0)
    last = 10_000.0 - RETENTION_MARGIN_S - 130.0
    assert inv.rec(now=last - 1).retry is Retry.SAME_IDEMPOTENCY_KEY
    assert inv.rec(now=last).retry is Retry.RECONCILE
    # A throttle's backoff needs a usable key the same way.
    throttled = Inv(key="req_01", expires_at=10_000.0, send_window=130.0).authorized()
    throttled.dispatched().complete(Outcome.REJECTED, Code.REMOTE_THROTTLED, retry_after=5)
    assert throttled.rec(now=last - 1).retry is Retry.BACKOFF
    assert throttled.rec(now=last).retry is Retry.RECONCILE
    # A record written before the window was recorded keeps the rule it was written under.
    old = unknown_post(key="req_01", expires_at=10_000.0)
    assert old.rec(now=last).retry is Retry.SAME_IDEMPOTENCY_KEY


@pytest.mark.parametrize("window", ["130", -1.0, True, [130]])
def test_a_send_window_that_is_no_duration_is_refused(window: object) -> None:
    with pytest.raises(ImpossibleEvent, match="send_window"):
        Inv(key="req_01", expires_at=10_000.0, send_window=window)  # type: ignore[arg-type]


def test_unknown_with_key_the_remote_does_not_deduplicate_on_is_reconcile() -> None:
    # Seed: "Simply generating a UUID in the broker and recording it changes nothing" -- a key
    # without a verified remote contract (an SSH command's reference) never makes a resend safe.
    rec = unknown_post(key="req_01", remote_contract="none").rec()
    assert rec.retry is Retry.RECONCILE
    assert decide(rec, Operation(idempotent=False, fingerprint=FP)) is Decision.RECONCILE
    configured = unknown_post(key="req_01", remote_contract="configured").rec()
    assert configured.retry is Retry.SAME_IDEMPOTENCY_KEY


def test_unknown_without_idempotency_is_reconcile() -> None:
    rec = unknown_post().rec()
    assert rec.retry is Retry.RECONCILE
    assert decide(rec, Operation(idempotent=False, fingerprint=FP)) is Decision.RECONCILE


def test_budget_exhausted_keeps_latest_code_and_says_reconcile() -> None:
    inv = unknown_post(idempotent=True)
    inv.ev(E.RETRY_BUDGET_EXHAUSTED)
    rec = inv.rec()
    # "A generic 'attempt limit exceeded' error would destroy the safer diagnosis."
    assert rec.code is Code.REMOTE_OUTCOME_UNKNOWN
    assert rec.retry is Retry.RECONCILE
    assert rec.evidence["budget_exhausted"] is True
    assert rec.budget.left == 0


# --- "The error envelope must contain evidence" ------------------------------------------------


def test_reconciliation_keeps_original_attempt() -> None:
    inv = unknown_post()
    attempts_before = inv.rec().attempts
    inv.ev(E.RECONCILED, source=S.REMOTE_QUERY, outcome="committed", note="payment found")
    rec = inv.rec()
    assert rec.outcome is Outcome.COMMITTED
    assert rec.attempts == attempts_before  # not rewritten as though it never happened
    assert rec.attempts[0]["outcome"] == "unknown"
    assert rec.evidence["dispatch_started"] is True
    assert rec.evidence["reconciliation"]["source"] == "remote_query"
    assert rec.evidence["source"] == "remote_query"


def test_an_inconclusive_query_leaves_the_invocation_unknown_and_says_so() -> None:
    inv = unknown_post()
    before = inv.rec()
    inv.ev(E.RECONCILE_INCONCLUSIVE, query_invocation="act_q1", code="REMOTE_OUTCOME_UNKNOWN")
    inv.ev(E.RECONCILE_INCONCLUSIVE, query_invocation="act_q2", code=None, reason="no match")
    rec = inv.rec()
    assert (rec.state, rec.outcome, rec.retry, rec.code) == (
        before.state,
        Outcome.UNKNOWN,
        Retry.RECONCILE,
        before.code,
    )
    assert [q["query_invocation"] for q in rec.evidence["reconcile_queries"]] == [
        "act_q1",
        "act_q2",
    ]
    # An absent finding too soon after the attempt names when a query may settle it.
    assert inv.refused(E.RECONCILE_INCONCLUSIVE, query_invocation="act_qx", not_before="soon")
    inv.ev(E.RECONCILE_INCONCLUSIVE, query_invocation="act_q2b", not_before=1.8e9, reason="w")
    assert inv.rec().evidence["reconcile_queries"][-1]["not_before"] == 1.8e9
    assert "not_before" not in inv.rec().evidence["reconcile_queries"][0]
    inv.ev(E.RECONCILED, source=S.REMOTE_QUERY, outcome="rejected", query_invocation="act_q3")
    assert inv.rec().evidence["reconciliation"]["query_invocation"] == "act_q3"
    assert inv.refused(E.RECONCILE_INCONCLUSIVE, query_invocation="act_q4")


def test_a_row_naming_a_closed_query_open_is_refused_by_the_writer_and_a_no_op_folded() -> None:
    # A stale asker's row (its query came back awaiting an operator) lands after another
    # asker closed that query and no other is open: folded as written, it would reopen a
    # denied query.  The writer refuses it; a stored one (a broker from before the writer
    # refused it wrote it) is listed, marked stale, and leaves the query closed.
    inv = unknown_post()
    q = {"query_invocation": "act_q1"}
    inv.ev(E.RECONCILE_INCONCLUSIVE, **q, code=None, reason="asking", open=True)
    inv.ev(E.RECONCILE_INCONCLUSIVE, **q, code="APPROVAL_DENIED", reason="unsent")
    for stale in ({"code": "APPROVAL_PENDING"}, {"code": "IN_PROGRESS"}):
        row = Event(E.RECONCILE_INCONCLUSIVE, IID, {**q, **stale, "open": True}, seq=inv.seq + 1)
        with pytest.raises(ImpossibleEvent, match="act_q1 is not open"):
            inv.p.apply(row, writing=True)  # the writer's check
        inv.ev(E.RECONCILE_INCONCLUSIVE, **q, **stale, open=True)
        rec = inv.rec()
        assert open_query(rec.evidence["reconcile_queries"], rec.generation) is None
        last = rec.evidence["reconcile_queries"][-1]
        assert last["stale"] is True and "open" not in last
    # A row from before rows named ``open`` folds as it was written (the query open again).
    inv.ev(E.RECONCILE_INCONCLUSIVE, **q, code="APPROVAL_PENDING")
    rec = inv.rec()
    assert open_query(rec.evidence["reconcile_queries"], rec.generation) == "act_q1"


def test_a_reconciliation_observed_before_a_retry_took_the_lease_is_refused() -> None:
    # A reconciliation reads the record, observes the remote, then appends what it found,
    # naming the generation it read.  A same-key retry that took the next lease meanwhile --
    # in setup, in flight, or over again unknown -- is not what was observed.
    inv = unknown_post(budget=4)
    observed = {"generation": 0}
    found = {"source": S.REMOTE_QUERY, "outcome": "rejected", "query_invocation": "act_q"}
    inv.ev(E.RETRY_LEASE_ACQUIRED, generation=1, holder="w1")
    inv.ev(E.CREDENTIAL_AUTHORIZED, credential="api", generation=1)
    for advance in (
        lambda: inv.dispatched(generation=1),
        lambda: inv.ev(E.REQUEST_SENT, generation=1),
        lambda: inv.ev(E.ATTEMPT_INTERRUPTED, code="REMOTE_OUTCOME_UNKNOWN", generation=1),
    ):
        reason = inv.refused(E.RECONCILED, **found, **observed)
        assert "observed generation 0" in reason, (inv.p.state, reason)
        advance()
    assert inv.p.state == "interrupted"  # at rest again: the lifecycle takes either event
    assert "observed generation 0" in inv.refused(E.RECONCILED, **found, **observed)
    reason = inv.refused(E.RECONCILE_INCONCLUSIVE, query_invocation="act_q", **observed)
    assert "observed generation 0" in reason
    assert "observed generation True" in inv.refused(E.RECONCILED, **found, generation=True)
    # An observation of the record as it now stands settles it.
    inv.ev(E.RECONCILE_INCONCLUSIVE, query_invocation="act_q1", generation=1)
    inv.ev(E.RECONCILED, **found, generation=1)
    rec = inv.rec()
    assert rec.state == "reconciled_rejected"
    assert [(a["generation"], a["outcome"]) for a in rec.attempts] == [
        (0, "unknown"),
        (1, "unknown"),
    ]


def test_reconciliation_cannot_claim_not_attempted() -> None:
    inv = unknown_post()
    reason = inv.refused(E.RECONCILED, source=S.OPERATOR_ATTESTED, outcome="not_attempted")
    assert "never not_attempted" in reason


def test_reconciliation_must_name_a_second_observer() -> None:
    # An operator's finding must not pass for a response received on the original connection.
    inv = unknown_post()
    assert "remote_query or operator_attested" in inv.refused(
        E.RECONCILED, source=S.REMOTE_RESPONSE, outcome="committed"
    )


def test_imported_evidence_keeps_observer_seq() -> None:
    inv = unknown_post()
    inv.ev(
        E.RECONCILED,
        source=S.OPERATOR_ATTESTED,
        observer="ops-console",
        observer_seq=17,
        outcome="rejected",
    )
    rec = inv.rec()
    rc = rec.evidence["reconciliation"]
    assert (rc["observer"], rc["observer_seq"], rc["seq"]) == ("ops-console", 17, inv.seq)
    assert rec.last_seq == inv.seq  # appended at the end of the history, not inserted into it


def test_log_sequence_defines_order_not_wall_clock() -> None:
    p = Projector(IID)
    p.apply(Event(E.ACTION_ACCEPTED, IID, {"operation": operation()}, seq=5, at=2_000.0))
    p.apply(Event(E.PREFLIGHT_VALIDATED, IID, seq=6, at=1_000.0))  # clock went backwards: fine
    with pytest.raises(ImpossibleEvent, match="does not follow"):
        p.apply(Event(E.CREDENTIAL_AUTHORIZED, IID, seq=6))
    assert p.state == "validated"


def test_events_of_another_invocation_are_refused() -> None:
    inv = Inv()
    with pytest.raises(ImpossibleEvent, match="another invocation"):
        inv.p.apply(Event(E.PREFLIGHT_VALIDATED, "act_other", seq=99))


def test_envelope_has_the_seed_shape() -> None:
    rec = unknown_post(key="req_01J", expires_at=None).rec()
    env = render_envelope(rec)
    assert env["invocation_id"] == IID
    assert env["error"] == {
        "code": "REMOTE_OUTCOME_UNKNOWN",
        "phase": "remote_execution",
        "outcome": "unknown",
        "retry": "same_idempotency_key",
        "message": Code.REMOTE_OUTCOME_UNKNOWN.info.meaning,
    }
    ev = env["evidence"]
    assert (
        ev["dispatch_started"],
        ev["request_complete"],
        ev["response_headers_received"],
        ev["response_complete"],
    ) == (True, True, False, False)
    assert ev["idempotency"] == {
        "key": "req_01J",
        "scope": "payments.create",
        "fingerprint": FP,
        "remote_contract": "configured",
    }
