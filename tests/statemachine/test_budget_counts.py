"""What an invocation's retry budget counts (seed: "Store the retry budget in the action record"):
the attempts that may have reached the remote -- a dispatch -- or met the target and failed in
its setup (a refused connection: seed, "Limit the number of attempts").  A retry refused in its
own preflight, or withdrawn by its caller (a hang-up) or stopped by the broker before its
dispatch gate, or closed by recovery there (its worker stopped), sent nothing and tried nothing:
it spends none (audit 52a), and a run of such stops is one attempts entry whatever their stages.
A model of that count, checked against the projection over any sequence of retry endings."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from affidavit.statemachine import Event, EventKind, ImpossibleEvent, Projector, Retry

from .lifecycle_helpers import IID, operation

E = EventKind

_SPENT = {
    "dispatched": True,
    "refused": True,
    "refused_then_hung_up": True,  # the target tried, then the caller hung up: spent
    "withdrawn": False,
    "withdrawn_at_once": False,  # a hang-up before any connection: stage idle
    "shutdown": False,
    "broker_stopped": False,  # recovery's close of a worker stopped before its gate
    "lease_lapsed": False,
}
"""Each retry ending, and whether the model counts it as an attempt."""


def _ending(kind: str, gen: int) -> list[tuple[EventKind, dict[str, object]]]:
    at = {"generation": gen}
    authorized = (E.CREDENTIAL_AUTHORIZED, at)
    if kind == "dispatched":  # the caller hung up after the gate: it may have been sent
        return [
            authorized,
            (E.DISPATCH_STARTED, at),
            (E.ATTEMPT_INTERRUPTED, {"code": "CALLER_CANCELLED", **at}),
        ]
    if kind in ("broker_stopped", "lease_lapsed"):  # recovery closes it, in retry_pending
        return [(E.SETUP_FAILED, {"code": "SETUP_FAILED", "stage": kind, **at})]
    stage = "idle" if kind == "withdrawn_at_once" else "connecting"
    code = {"refused": "CONNECTION_REFUSED", "shutdown": "BROKER_SHUTDOWN"}.get(
        kind, "CALLER_CANCELLED"
    )
    tried = (E.SETUP_ATTEMPT_FAILED, {"code": "CONNECTION_REFUSED", "stage": "tcp", **at})
    before = [authorized, tried] if kind == "refused_then_hung_up" else [authorized]
    return [*before, (E.SETUP_FAILED, {"code": code, "stage": stage, **at})]


@settings(max_examples=200, deadline=None)
@given(
    budget=st.integers(1, 4),
    endings=st.lists(st.sampled_from(sorted(_SPENT)), max_size=16),
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
    used, stops = 1, 0
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
        stops += not _SPENT[kind]
        rec = p.record()
        assert rec.budget.used == used
        # The record stays bounded by what spent budget, whatever the stops' stages: the
        # first attempt one entry, each spending retry at most two (a tried target's setup
        # try and its close), and each run of stops one -- a run follows the first attempt
        # or a spending retry, so there are at most ``used`` runs.
        assert len(rec.attempts) <= 1 + 2 * (used - 1) + used, rec.attempts
        assert sum(a.get("repeated", 0) for a in rec.attempts) == stops
        # A hang-up's retry leaves the hint the earlier attempts' evidence gave.
        if used < budget:
            assert rec.retry is Retry.SAME_IDEMPOTENCY_KEY
        else:
            assert rec.retry is Retry.RECONCILE
