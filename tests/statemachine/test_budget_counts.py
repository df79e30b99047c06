"""What an invocation's retry budget counts (seed: "Store the retry budget in the action record"):
the attempts that may have reached the remote -- a dispatch -- or met the target and failed in
its setup (a refused connection: seed, "Limit the number of attempts").  A retry refused in its
own preflight, or withdrawn by its caller (a hang-up) or stopped by the broker before its
dispatch gate, sent nothing and tried nothing: it spends none (audit 52a).  A model of that
count, checked against the projection over any sequence of retry endings."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from affidavit.statemachine import Event, EventKind, ImpossibleEvent, Projector, Retry

from .lifecycle_helpers import IID, operation

E = EventKind

_SPENT = {"dispatched": True, "refused": True, "withdrawn": False, "shutdown": False}
"""Each retry ending, and whether the model counts it as an attempt."""


def _ending(kind: str, gen: int) -> list[tuple[EventKind, dict[str, object]]]:
    stage = {"stage": "connecting", "generation": gen}
    authorized = (E.CREDENTIAL_AUTHORIZED, {"generation": gen})
    if kind == "dispatched":  # the caller hung up after the gate: it may have been sent
        return [
            authorized,
            (E.DISPATCH_STARTED, {"generation": gen}),
            (E.ATTEMPT_INTERRUPTED, {"code": "CALLER_CANCELLED", "generation": gen}),
        ]
    code = {"refused": "CONNECTION_REFUSED", "withdrawn": "CALLER_CANCELLED"}.get(
        kind, "BROKER_SHUTDOWN"
    )
    return [authorized, (E.SETUP_FAILED, {"code": code, **stage})]


@settings(max_examples=200, deadline=None)
@given(
    budget=st.integers(1, 4),
    endings=st.lists(st.sampled_from(sorted(_SPENT)), max_size=10),
)
def test_the_budget_counts_only_retries_that_dispatched_or_met_their_target(
    budget: int, endings: list[str]
) -> None:
    p = Projector(IID)
    seq = 0

    def ev(kind: EventKind, **attrs: object) -> None:
        nonlocal seq
        seq += 1
        p.apply(Event(kind, IID, attrs, seq=seq))

    ev(E.ACTION_ACCEPTED, operation=operation(key="k1", budget=budget), requester={"uid": 1})
    ev(E.PREFLIGHT_VALIDATED)
    ev(E.CREDENTIAL_AUTHORIZED)
    ev(E.DISPATCH_STARTED, generation=0)
    ev(E.ATTEMPT_INTERRUPTED, code="REMOTE_OUTCOME_UNKNOWN")
    used = 1
    for gen, kind in enumerate(endings, start=1):
        if used >= budget:
            try:
                ev(E.RETRY_LEASE_ACQUIRED, generation=gen)
            except ImpossibleEvent as refused:
                assert "budget" in refused.reason
            else:
                raise AssertionError("a lease past the budget was taken")
            break
        ev(E.RETRY_LEASE_ACQUIRED, generation=gen)
        for kind_, attrs in _ending(kind, gen):
            ev(kind_, **attrs)
        used += _SPENT[kind]
        rec = p.record()
        assert rec.budget.used == used
        # A hang-up's retry leaves the hint the earlier attempts' evidence gave.
        if used < budget:
            assert rec.retry is Retry.SAME_IDEMPOTENCY_KEY
        else:
            assert rec.retry is Retry.RECONCILE
