"""A fenced record (``binder.fence``) is recognised by its first event's ``fenced`` fact
(``Record.fenced``), and takes no attempt of its own: the projection refuses every event by
which its binder -- whose ACTION_ACCEPTED was refused, the rest of its preamble written in the
same queued write folded one by one -- or a later caller could act in it.

Seed, "Idempotency is defined by the remote contract": a mismatch answered "nothing was sent
under the key" must stay true; once, the binder's PREFLIGHT_VALIDATED and CREDENTIAL_AUTHORIZED
landed in the fenced record between the fence's two writes, and it dispatched and sent.

Only a fence written under these rules (``fenced.rules``, ``FENCE_RULES``) is held to them: a
journal written before holds such rows honestly, and its record shows what they prove (seed:
"never claim more than the records prove" -- a correctly chained record is not tampering).
"""

from __future__ import annotations

from typing import Any

import pytest

from affidavit.statemachine import (
    FENCE_RULES,
    Event,
    EventKind,
    EvidenceSource,
    ImpossibleEvent,
    Projector,
)

from .lifecycle_helpers import IID, operation

E = EventKind
GONE = {
    "why": "window_over",
    "bound_at": 1.0,
    "judged_at": 3.0,
    "window": 1.1,
    "recorded": "nothing",
}


def _accepted(fenced: dict[str, Any]) -> Event:
    op = {**operation(key="charge-1"), "protocol": None, "target": "(unknown)"}
    return Event(E.ACTION_ACCEPTED, IID, {"operation": op, "fenced": fenced})


def _fenced() -> Projector:
    return Projector(IID).extend([_accepted({**GONE, "rules": FENCE_RULES})])


def _refused(p: Projector, event: Event) -> str:
    before = p.record()
    with pytest.raises(ImpossibleEvent) as refused:
        p.apply(event)
    assert p.record() == before  # nothing of it folded
    return refused.value.reason


def test_a_fenced_record_says_so_from_its_first_event_to_its_close() -> None:
    p = _fenced()
    assert p.record().fenced == GONE and not p.record().final
    close = {"code": "IDEMPOTENCY_MISMATCH", "field": "idempotency_key", "binder_gone": GONE}
    p.apply(Event(E.PREFLIGHT_FAILED, IID, close))
    record = p.record()
    assert record.final and record.fenced == GONE
    assert record.code is not None and record.code.value == "IDEMPOTENCY_MISMATCH"
    with pytest.raises(TypeError):
        record.fenced["why"] = "edited"  # type: ignore[index]
    plain = Projector(IID).extend([Event(E.ACTION_ACCEPTED, IID, {"operation": operation()})])
    assert plain.record().fenced is None


@pytest.mark.parametrize(
    ("kind", "attrs"),
    [
        (E.PREFLIGHT_VALIDATED, {"config_hash": "hmac-sha256:00"}),
        (E.PROTOCOL_OBSERVED, {"protocol": "http", "state": "tcp_connected", "generation": 0}),
        (E.PREFLIGHT_FAILED, {"code": "CONFIG_CHANGED", "field": "targets.api", "generation": 0}),
    ],
)
def test_a_fenced_record_refuses_its_binder_s_attempt(
    kind: EventKind, attrs: dict[str, Any]
) -> None:
    """Its binder's preamble and connection setup, and its gate's refusal: none is folded."""
    assert "fenced" in _refused(_fenced(), Event(kind, IID, attrs))


@pytest.mark.parametrize(
    ("kind", "attrs"),
    [
        # Its binder's, connecting after its refused preamble: a refused connection.
        (E.SETUP_FAILED, {"code": "CONNECTION_REFUSED", "stage": "tcp_connect", "generation": 0}),
        # Recovery's, as a broker before the fence's own close was recovery's wrote it.
        (E.SETUP_FAILED, {"code": "SETUP_FAILED", "stage": "lease_lapsed", "generation": 0}),
        (E.SETUP_FAILED, {"code": "CALLER_CANCELLED", "stage": "accepted"}),
        (E.PREFLIGHT_FAILED, {"code": "CONFIG_CHANGED", "field": "targets.api"}),
        (E.PREFLIGHT_FAILED, {"code": "IDEMPOTENCY_MISMATCH", "binder_gone": {"why": "other"}}),
        (E.PREFLIGHT_FAILED, {"code": "IDEMPOTENCY_MISMATCH"}),
    ],
)
def test_a_fenced_record_s_close_is_the_fence_s_whoever_writes_it(
    kind: EventKind, attrs: dict[str, Any]
) -> None:
    """Any other close is refused: a SETUP_FAILED there was answered CONNECTION_REFUSED, retry
    backoff -- to every same-key retry, for good -- where the truth is "use a new key"."""
    assert "fenced" in _refused(_fenced(), Event(kind, IID, attrs))


def test_a_fenced_fact_that_is_not_an_object_is_refused_with_its_field() -> None:
    event = Event(E.ACTION_ACCEPTED, IID, {"operation": operation(), "fenced": "gone"})
    assert _refused(Projector(IID), event) == "fenced must be an object"


@pytest.mark.parametrize("rules", [3, "2", 2.0, True, None])
def test_a_fence_s_rules_other_than_these_are_refused_with_their_field(rules: object) -> None:
    """Present but null is not a fence from before them either."""
    fenced = {**GONE, "rules": rules}
    assert _refused(Projector(IID), _accepted(fenced)) == "fenced.rules must be 2"


CLOSE = {
    "code": "IDEMPOTENCY_MISMATCH",
    "field": "idempotency_key",
    "message": "nothing was sent under the key",
    "binder_gone": GONE,
}
PREAMBLE = [
    Event(E.PREFLIGHT_VALIDATED, IID, {"config_hash": "hmac-sha256:00"}),
    Event(E.CREDENTIAL_AUTHORIZED, IID, {"version": 1, "inject": "bearer", "generation": 0}),
]
SENT = [
    Event(E.DISPATCH_STARTED, IID, {"generation": 0, "connection": "c1"}),
    Event(E.REQUEST_SENT, IID, {"generation": 0}),
    Event(
        E.REMOTE_RESPONSE_COMPLETE,
        IID,
        {"outcome": "committed", "code": None, "status": 201, "generation": 0},
        source=EvidenceSource.REMOTE_RESPONSE,
    ),
]
LOST = Event(E.LEASE_LOST, IID, {"generation": 0, "holder": "x"})


@pytest.mark.parametrize(
    ("rows", "state", "code"),
    [
        # Nothing sent: the binder's preamble, then the fence's close, then its LEASE_LOST.
        (
            [*PREAMBLE, Event(E.PREFLIGHT_FAILED, IID, CLOSE), LOST],
            "validation_failed",
            "IDEMPOTENCY_MISMATCH",
        ),
        # The bug fired: its binder dispatched and sent; the fence's close was refused then.
        ([*PREAMBLE, *SENT], "completed_committed", None),
        ([*PREAMBLE, SENT[0]], "dispatched", None),
    ],
)
def test_a_fence_written_before_its_rules_shows_what_its_binder_s_rows_prove(
    rows: list[Event], state: str, code: str | None
) -> None:
    """A fence from before ``fenced.rules``, in an honest journal: its binder's rows landed in
    it and are folded as they were then -- never refused (which reads a correctly chained
    journal as altered), and the record is not ``fenced`` (which answers "nothing was sent")."""
    p = Projector(IID).extend([_accepted(GONE), *rows])
    record = p.record()
    assert (record.state, record.fenced) == (state, None)
    assert (record.code.value if record.code is not None else None) == code
    if SENT[0] in rows:
        assert record.outcome is not None and record.outcome.value != "not_attempted"
    # Under these rules, the same rows are refused from the binder's first one.
    assert "fenced" in _refused(_fenced(), rows[0])
