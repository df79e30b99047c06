"""The lifecycle machine: one invocation, protocol-agnostic, declared as one data table.

Rule 1: everything that decides an invocation's phase and outcome lives in ``STATES`` and
``TRANSITIONS`` below.  The projection, the ``transitions`` machine, the diagrams, the contract
doc and the model-checking tests are all derived from these two tables; none of them adds a rule.

Rule 2 (seed, "Dispatch shifts the burden of proof"): outcomes are monotone.

    not_attempted ──DISPATCH_STARTED──▶ unknown ──complete result──▶ rejected | committed
                                           └──────RECONCILED────────▶ rejected | committed

Nothing returns to ``not_attempted`` once DISPATCH_STARTED was recorded; ``committed`` and
``rejected`` never become ``unknown`` or ``not_attempted``; a retry attempt that fails before its
own dispatch leaves an invocation whose earlier attempt was ``unknown`` still ``unknown`` — which
is why the retry states below are separate states with outcome ``unknown`` rather than a re-use
of the first attempt's pre-dispatch states.

Rule 3: a (state, event) pair absent from ``TRANSITIONS`` is impossible.  The projection refuses
it with ``ImpossibleEvent`` and the record stays as it was (h11's "a missing key is the error
path").  ``final`` marks states where an invocation may rest; some final states still accept a
retry lease or a reconciliation.

Approval (seed, "Validation and credential injection finish before dispatch": "Before approval,
bind the normalized target, the credential version, the resolved injection method, and the
request fingerprint to the invocation"):

    validated ──APPROVAL_REQUESTED──▶ awaiting_approval ──APPROVAL_GRANTED──▶ approved
        approved ──DISPATCH_LEASE_ACQUIRED──▶ approved ──CREDENTIAL_AUTHORIZED──▶ authorized

Both waiting states are ``not_attempted`` and not final: a denial, an expiry or the dispatch gate
(APPROVAL_STALE, APPROVAL_EXPIRED, both validation codes) ends them; nothing leaves the machine
before DISPATCH_STARTED, as everywhere else.

The phase of a state is where the broker stopped; it is for diagnosis.  ``result_delivery`` is
only for a result that could not be stored or delivered (seed: "the broker recorded the remote
result but could not fully deliver it"); a delivered result keeps ``remote_execution``, the phase
in which its outcome was decided.  The outcome of a state is
what the durable records prove.  Both are static per state — the table doubles a few states by
outcome (``stored_rejected`` / ``stored_committed``) so that no rule hides in code.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from .contract import Outcome, Phase
from .events import EventKind as E

__all__ = [
    "DISPATCHED_STATES",
    "INITIAL",
    "STATES",
    "TRANSITIONS",
    "StateSpec",
    "build_machine",
    "final_states",
]

_V, _CI, _CS, _RE, _RD = (
    Phase.VALIDATION,
    Phase.CREDENTIAL_INJECTION,
    Phase.CONNECTION_SETUP,
    Phase.REMOTE_EXECUTION,
    Phase.RESULT_DELIVERY,
)
_NA, _RJ, _CM, _UN = Outcome.NOT_ATTEMPTED, Outcome.REJECTED, Outcome.COMMITTED, Outcome.UNKNOWN


@dataclass(frozen=True, slots=True)
class StateSpec:
    phase: Phase
    outcome: Outcome
    final: bool
    doc: str


INITIAL: Final = "new"
"""The state before ACTION_ACCEPTED: no invocation exists yet."""

# fmt: off
STATES: Final[MappingProxyType[str, StateSpec]] = MappingProxyType({
    "new":                       StateSpec(_V,  _NA, False, "no event recorded yet"),
    "accepted":                  StateSpec(_V,  _NA, False, "invocation created, config snapshot bound"),
    "validation_failed":         StateSpec(_V,  _NA, True,  "validation refused the action"),
    "validated":                 StateSpec(_CI, _NA, False, "action valid; credential not yet resolved"),
    "awaiting_approval":         StateSpec(_CI, _NA, False, "a human approval is pending (APPROVAL_PENDING)"),
    "approved":                  StateSpec(_CI, _NA, False, "approved for the bound fingerprint; not yet dispatched"),
    "approval_denied":           StateSpec(_CI, _NA, True,  "a human denied the invocation"),
    "credential_failed":         StateSpec(_CI, _NA, True,  "credential unavailable or unusable"),
    "authorized":                StateSpec(_CS, _NA, False, "credential resolved; setting up a connection"),
    "setup_failed":              StateSpec(_CS, _NA, True,  "setup gave up; nothing was dispatched"),
    "dispatched":                StateSpec(_RE, _UN, False, "DISPATCH_STARTED is durable; bytes may be out"),
    "request_sent":              StateSpec(_RE, _UN, False, "the whole request reached the transport"),
    "response_started":          StateSpec(_RE, _UN, False, "final response headers / exec reply seen"),
    "interrupted":               StateSpec(_RE, _UN, True,  "dispatched, no complete result"),
    "retry_pending":             StateSpec(_CS, _UN, False, "a retry lease is held; new attempt in setup"),
    "retry_invalid":             StateSpec(_V,  _UN, True,  "retry refused by re-validation (config changed)"),
    "retry_credential_failed":   StateSpec(_CI, _UN, True,  "retry stopped at credential injection"),
    "retry_setup_failed":        StateSpec(_CS, _UN, True,  "retry stopped in connection setup"),
    "completed_rejected":        StateSpec(_RE, _RJ, False, "complete authoritative rejection, not yet stored"),
    "completed_committed":       StateSpec(_RE, _CM, False, "complete authoritative result, not yet stored"),
    "stored_rejected":           StateSpec(_RE, _RJ, True,  "rejection stored durably"),
    "stored_committed":          StateSpec(_RE, _CM, True,  "result stored durably"),
    "store_failed_unknown":      StateSpec(_RD, _UN, True,  "result could not be stored; record proves only dispatch"),
    "store_failed_rejected":     StateSpec(_RD, _RJ, True,  "rejection could not be stored"),
    "store_failed_committed":    StateSpec(_RD, _CM, True,  "result could not be stored"),
    "delivered_rejected":        StateSpec(_RE, _RJ, True,  "stored rejection delivered to the caller"),
    "delivered_committed":       StateSpec(_RE, _CM, True,  "stored result delivered to the caller"),
    "delivery_failed_rejected":  StateSpec(_RD, _RJ, True,  "stored rejection not delivered; fetch it"),
    "delivery_failed_committed": StateSpec(_RD, _CM, True,  "stored result not delivered; fetch it"),
    "reconciled_rejected":       StateSpec(_RE, _RJ, True,  "a second observer proved the effect absent"),
    "reconciled_committed":      StateSpec(_RE, _CM, True,  "a second observer proved the effect present"),
})

# Diagnostics that may arrive in any state once an invocation exists.  They never move the
# state: PROTOCOL_OBSERVED refines evidence; LEASE_LOST records that a stale worker was stopped.
_DIAG = {E.PROTOCOL_OBSERVED: "=", E.LEASE_LOST: "="}

# What may end a dispatched attempt before a result is stored.
_AFTER_DISPATCH = {
    E.ATTEMPT_INTERRUPTED: "interrupted",
    E.REMOTE_RESPONSE_COMPLETE: "completed_*",        # by attrs.outcome: rejected | committed
    E.RESULT_STORE_FAILED: "store_failed_unknown",
    E.RECONCILED: "reconciled_*",                     # a crashed record may be reconciled as is
}

# What a complete result says beyond its outcome, read from it before it is stored: the
# batch's item outcomes, the job a 202 accepted (``batch.py``, ``operation.py``).
_READING = {E.BATCH_ITEMS_RECORDED: "="}
# The accepted job is tracked as its own operation once the 202 is known; its polls are
# folded by the operation table, never moving the invocation's state.
_OPERATION_POLLS = {E.OPERATION_POLLED: "=", E.OPERATION_POLL_FAILED: "="}

# What an unknown-and-resting invocation accepts: a retry, or a second observer -- who may
# settle it (RECONCILED) or fail to (a query whose answer decides nothing).
_UNKNOWN_AT_REST = {
    E.RETRY_LEASE_ACQUIRED: "retry_pending",
    E.RETRY_BUDGET_EXHAUSTED: "=",
    E.RECONCILED: "reconciled_*",
    E.RECONCILE_INCONCLUSIVE: "=",
}

TRANSITIONS: Final[MappingProxyType[str, MappingProxyType[E, str]]] = MappingProxyType({
    name: MappingProxyType(table) for name, table in {
    "new": {
        E.ACTION_ACCEPTED: "accepted",
    },
    "accepted": {
        **_DIAG,
        E.PREFLIGHT_VALIDATED: "validated",
        E.PREFLIGHT_FAILED: "validation_failed",
        E.SETUP_FAILED: "setup_failed",               # recovery; a call stopped waiting for a binder
    },
    "validation_failed": {**_DIAG},
    "validated": {
        **_DIAG,
        E.APPROVAL_REQUESTED: "awaiting_approval",
        E.CREDENTIAL_AUTHORIZED: "authorized",
        E.CREDENTIAL_FAILED: "credential_failed",
        E.PREFLIGHT_FAILED: "validation_failed",
        E.SETUP_FAILED: "setup_failed",               # recovery: its worker stopped here
    },
    "awaiting_approval": {
        **_DIAG,
        E.APPROVAL_GRANTED: "approved",
        E.APPROVAL_DENIED: "approval_denied",
        E.PREFLIGHT_FAILED: "validation_failed",      # APPROVAL_EXPIRED: nobody decided in time
    },
    "approved": {
        **_DIAG,
        E.DISPATCH_LEASE_ACQUIRED: "=",               # again when its holder stalled
        E.CREDENTIAL_AUTHORIZED: "authorized",
        E.CREDENTIAL_FAILED: "credential_failed",
        E.PREFLIGHT_FAILED: "validation_failed",      # APPROVAL_EXPIRED / APPROVAL_STALE
        E.APPROVAL_REVOKED: "approval_denied",        # taken back while no live dispatch lease holds it
    },
    "approval_denied": {**_DIAG},
    "credential_failed": {
        **_DIAG,
        E.RETRY_LEASE_ACQUIRED: "validated",          # a refusal that asks to back off (APPROVAL_LIMIT)
    },
    "authorized": {
        **_DIAG,
        E.SETUP_ATTEMPT_FAILED: "authorized",
        E.SETUP_FAILED: "setup_failed",
        E.PREFLIGHT_FAILED: "validation_failed",      # the gate: CONFIG_CHANGED, APPROVAL_*
        E.DISPATCH_STARTED: "dispatched",
    },
    "setup_failed": {
        **_DIAG,
        E.RETRY_LEASE_ACQUIRED: "validated",          # a new attempt re-resolves the credential
        E.RETRY_BUDGET_EXHAUSTED: "setup_failed",
    },
    "dispatched": {
        **_DIAG,
        **_AFTER_DISPATCH,
        E.REQUEST_SENT: "request_sent",
        E.REMOTE_RESPONSE_STARTED: "response_started",  # a server may answer before the body
    },
    "request_sent": {
        **_DIAG,
        **_AFTER_DISPATCH,
        E.REMOTE_RESPONSE_STARTED: "response_started",
    },
    "response_started": {
        **_DIAG,
        **_AFTER_DISPATCH,
        E.REQUEST_SENT: "response_started",           # body finished after early response headers
    },
    "interrupted": {**_DIAG, **_UNKNOWN_AT_REST},
    "retry_pending": {
        **_DIAG,
        E.PREFLIGHT_FAILED: "retry_invalid",
        E.CREDENTIAL_AUTHORIZED: "retry_pending",     # the retry re-resolved the credential
        E.CREDENTIAL_FAILED: "retry_credential_failed",
        E.SETUP_ATTEMPT_FAILED: "retry_pending",
        E.SETUP_FAILED: "retry_setup_failed",
        E.DISPATCH_STARTED: "dispatched",
        E.RECONCILED: "reconciled_*",
        E.RETRY_LEASE_ACQUIRED: "retry_pending",      # the holder stalled, its lease expired
    },
    "retry_invalid": {**_DIAG, **_UNKNOWN_AT_REST},
    "retry_credential_failed": {**_DIAG, **_UNKNOWN_AT_REST},
    "retry_setup_failed": {**_DIAG, **_UNKNOWN_AT_REST},
    "completed_rejected": {
        **_DIAG,
        **_READING,
        E.RESULT_COMMITTED: "stored_rejected",
        E.RESULT_STORE_FAILED: "store_failed_rejected",
    },
    "completed_committed": {
        **_DIAG,
        **_READING,
        E.OPERATION_ACCEPTED: "=",
        E.RESULT_COMMITTED: "stored_committed",
        E.RESULT_STORE_FAILED: "store_failed_committed",
    },
    "stored_rejected": {
        **_DIAG,
        E.RESULT_DELIVERED: "delivered_rejected",
        E.RESULT_DELIVERY_FAILED: "delivery_failed_rejected",
    },
    "stored_committed": {
        **_DIAG,
        **_OPERATION_POLLS,
        E.RESULT_DELIVERED: "delivered_committed",
        E.RESULT_DELIVERY_FAILED: "delivery_failed_committed",
    },
    "store_failed_unknown": {
        **_DIAG,
        E.RECONCILED: "reconciled_*",
        E.RECONCILE_INCONCLUSIVE: "=",
    },
    "store_failed_rejected": {**_DIAG},
    "store_failed_committed": {**_DIAG, **_OPERATION_POLLS},
    "delivered_rejected": {**_DIAG, E.RESULT_DELIVERED: "delivered_rejected"},
    "delivered_committed": {
        **_DIAG,
        **_OPERATION_POLLS,
        E.RESULT_DELIVERED: "delivered_committed",
    },
    "delivery_failed_rejected": {**_DIAG, E.RESULT_DELIVERED: "delivered_rejected"},
    "delivery_failed_committed": {
        **_DIAG,
        **_OPERATION_POLLS,
        E.RESULT_DELIVERED: "delivered_committed",
    },
    "reconciled_rejected": {**_DIAG},
    "reconciled_committed": {**_DIAG},
    }.items()
})
# fmt: on

OUTCOME_SPLIT: Final = MappingProxyType(
    {
        "completed_*": {_RJ: "completed_rejected", _CM: "completed_committed"},
        "reconciled_*": {_RJ: "reconciled_rejected", _CM: "reconciled_committed"},
    }
)
"""Destinations chosen by the event's ``outcome`` attribute (a complete result or a
reconciliation says which).  ``=`` means the state itself."""


def resolve_dest(state: str, dest: str, outcome: Outcome | None) -> str | None:
    """Concrete destination of a table entry, or None if the event's outcome cannot go there."""
    if dest == "=":
        return state
    split = OUTCOME_SPLIT.get(dest)
    if split is None:
        return dest
    return split.get(outcome) if outcome is not None else None


def expand(state: str, event: E) -> list[str]:
    """Every concrete destination the table allows for (state, event)."""
    dest = TRANSITIONS[state].get(event)
    if dest is None:
        return []
    if dest in OUTCOME_SPLIT:
        return sorted(OUTCOME_SPLIT[dest].values())
    return [state if dest == "=" else dest]


def final_states() -> frozenset[str]:
    return frozenset(name for name, spec in STATES.items() if spec.final)


DISPATCHED_STATES: Final = frozenset(
    name for name, spec in STATES.items() if spec.outcome is not Outcome.NOT_ATTEMPTED
)
"""States an invocation can only be in after a DISPATCH_STARTED was recorded."""


def machine_transitions() -> list[dict[str, str]]:
    """The table as ``transitions`` declarations: one trigger per event, split by outcome."""
    out: list[dict[str, str]] = []
    for source in sorted(TRANSITIONS):
        for event in sorted(TRANSITIONS[source]):
            for dest in expand(source, event):
                trigger = event.value
                if TRANSITIONS[source][event] in OUTCOME_SPLIT:
                    trigger = f"{event.value}:{STATES[dest].outcome.value}"
                out.append({"trigger": trigger, "source": source, "dest": dest})
    return out


def build_machine(model: object | None = None, initial: str = INITIAL) -> object:
    """A ``transitions.Machine`` built from the table (used for diagrams and cross-checks).

    The projection folds events through a compiled dict for speed; a test proves the two agree
    on every (state, event) pair, so the ``transitions`` machine is the declared artefact and the
    dict is only its cache.
    """
    from transitions import Machine

    return Machine(
        model=model if model is not None else Machine.self_literal,
        states=sorted(STATES),
        transitions=machine_transitions(),
        initial=initial,
        auto_transitions=False,
        ignore_invalid_triggers=False,
    )


def edges() -> list[tuple[str, str, str]]:
    """Every concrete (source, event, dest) edge of the table, sorted."""
    return sorted(
        (src, event.value, dst)
        for src in TRANSITIONS
        for event in TRANSITIONS[src]
        for dst in expand(src, event)
    )


def problems() -> list[str]:
    """Structural invariants of this table (empty when sound); see ``graph.lifecycle_problems``."""
    from .graph import lifecycle_problems

    return lifecycle_problems(
        INITIAL,
        {name: spec.outcome.value for name, spec in STATES.items()},
        final_states(),
        edges(),
    )
