"""Projection: an ordered event list in, the current record out.  Pure and synchronous.

Seed, "The error envelope must contain evidence": store transitions as append-only events, then
project the current state.  The projection refuses impossible events (``ImpossibleEvent``) and
never rewrites history: a refused event leaves the fold exactly as it was, so a caller that
catches the error still holds the last good record.

Speed matters (recovery projects whole journals), so events fold through a dict compiled from
``lifecycle.TRANSITIONS``; ``tests/`` prove the dict and the ``transitions`` machine agree.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeGuard, cast

from .contract import CODES, Code, EvidenceSource, Outcome, Phase, Retry
from .events import Event, EventKind
from .lifecycle import INITIAL, OUTCOME_SPLIT, STATES, TRANSITIONS
from .retry import retry_hint

__all__ = ["Budget", "ImpossibleEvent", "Projector", "Record", "project", "project_all"]

E = EventKind

DEFAULT_BUDGET = 3
DEFAULT_MAX_RETRY_AFTER = 300.0

_INTERRUPT_CODES = frozenset(
    {Code.REMOTE_OUTCOME_UNKNOWN, Code.REMOTE_RESULT_INCOMPLETE, Code.CALLER_CANCELLED}
)
_SECOND_OBSERVER = frozenset({EvidenceSource.REMOTE_QUERY, EvidenceSource.OPERATOR_ATTESTED})
_RESOLVED = frozenset({Outcome.REJECTED, Outcome.COMMITTED})


class ImpossibleEvent(ValueError):
    """An event the table (or an event rule) does not allow in the current state."""

    def __init__(self, event: Event, state: str, reason: str) -> None:
        self.event = event
        self.state = state
        self.reason = reason
        where = f" (seq {event.seq})" if event.seq is not None else ""
        super().__init__(
            f"{event.kind.value}{where} is impossible in state {state!r} of invocation "
            f"{event.invocation_id}: {reason}"
        )


@dataclass(frozen=True, slots=True)
class Budget:
    total: int
    used: int

    @property
    def left(self) -> int:
        return max(0, self.total - self.used)


@dataclass(frozen=True, slots=True)
class Record:
    """The projected state of one invocation; what envelopes and ``decide()`` read."""

    invocation_id: str
    state: str
    phase: Phase
    outcome: Outcome
    retry: Retry
    code: Code | None
    message: str
    session: str | None
    target: str | None
    protocol: str | None
    idempotent: bool
    fingerprint: str | None
    idempotency: Mapping[str, Any] | None
    generation: int
    budget: Budget
    attempts: tuple[Mapping[str, Any], ...]
    evidence: Mapping[str, Any]
    retry_after: float | None
    last_seq: int | None
    events: int
    field: str | None = None
    """For validation errors: the path of the action field to fix."""

    @property
    def final(self) -> bool:
        return STATES[self.state].final

    @property
    def is_error(self) -> bool:
        return self.code is not None


_BUDGETS: dict[tuple[int, int], Budget] = {}


def _budget(total: int, used: int) -> Budget:
    # Budgets are immutable and few distinct ones exist; share them between records.
    key = (total, used)
    b = _BUDGETS.get(key)
    if b is None:
        if len(_BUDGETS) > 4096:
            _BUDGETS.clear()
        b = _BUDGETS[key] = Budget(total, used)
    return b


# --- compiled table -------------------------------------------------------------------------

_Compiled = dict[str, dict[EventKind, str]]


def _compile() -> _Compiled:
    return {state: dict(row) for state, row in TRANSITIONS.items()}


_TABLE: _Compiled = _compile()


class Projector:
    """Folds events for one invocation.  ``apply`` is atomic: it validates, then mutates."""

    __slots__ = (
        "_at",
        "_attempts",
        "_budget_total",
        "_budget_used",
        "_code",
        "_events",
        "_evidence",
        "_field",
        "_fingerprint",
        "_generation",
        "_idempotency",
        "_idempotency_view",
        "_idempotent",
        "_invocation_id",
        "_last_seq",
        "_max_retry_after",
        "_message",
        "_mutable",
        "_protocol",
        "_result_code",
        "_retry_after",
        "_session",
        "_state",
        "_target",
    )

    def __init__(self, invocation_id: str | None = None) -> None:
        self._invocation_id = invocation_id
        self._state = INITIAL
        self._code: Code | None = None
        self._message: str | None = None
        self._field: str | None = None
        self._session: str | None = None
        self._target: str | None = None
        self._protocol: str | None = None
        self._idempotent = False
        self._fingerprint: str | None = None
        self._idempotency: dict[str, Any] | None = None
        self._idempotency_view: Mapping[str, Any] | None = None
        self._generation = 0
        self._budget_total = DEFAULT_BUDGET
        self._budget_used = 0
        # Attempts are read-only views, replaced (never edited) when an attempt's outcome is
        # learnt, so record() can hand them out without copying.
        self._attempts: list[Mapping[str, Any]] = []
        # Evidence keys whose values effects mutate in place (steps, protocol facts, stale
        # workers); record() copies only those, every other value is replaced, never edited.
        self._mutable: set[str] = set()
        self._evidence: dict[str, Any] = {"dispatch_started": False}
        self._retry_after: float | None = None
        self._result_code: Code | None = None
        self._max_retry_after = DEFAULT_MAX_RETRY_AFTER
        self._last_seq: int | None = None
        self._events = 0
        self._at: float | None = None

    @property
    def state(self) -> str:
        return self._state

    # -- folding ------------------------------------------------------------------------------

    def apply(self, event: Event) -> str:
        """Fold one event; return the new state.  Raises ``ImpossibleEvent`` and changes nothing
        when the event is not allowed."""
        # Hot path (recovery folds whole journals; tests/benchmarks/projection.py): one table
        # lookup, one rule lookup, locals instead of repeated attribute reads.
        state = self._state
        iid = event.invocation_id
        if iid != self._invocation_id and self._invocation_id is not None:
            raise ImpossibleEvent(event, state, "belongs to another invocation")
        seq = event.seq
        last = self._last_seq
        if seq is not None and last is not None and seq <= last:
            raise ImpossibleEvent(event, state, f"seq {seq} does not follow {last}")
        kind = event.kind
        dest = _TABLE[state].get(kind)
        if dest is None:
            raise ImpossibleEvent(event, state, "no such transition in the lifecycle table")
        check, effect = _RULES[kind]
        if check is not None:
            reason = check(self, event)
            if reason is not None:
                raise ImpossibleEvent(event, state, reason)
        if dest == "=":
            dest = state
        elif dest in _SPLIT:
            # the check proved attrs.outcome is "rejected" or "committed"
            dest = _SPLIT[dest][event.attrs["outcome"]]
        # -- validated: mutate --
        self._invocation_id = iid
        if effect is not None:
            effect(self, event)
        self._state = dest
        if seq is not None:
            self._last_seq = seq
        if event.at is not None:
            self._at = event.at
        self._events += 1
        return dest

    def extend(self, events: Iterable[Event]) -> Projector:
        for event in events:
            self.apply(event)
        return self

    # -- reading ------------------------------------------------------------------------------

    def _evidence_snapshot(self) -> dict[str, Any]:
        ev = self._evidence.copy()
        for key in self._mutable:
            value = ev.get(key)
            if value is not None:
                ev[key] = value.copy()
        return ev

    def record(self, now: float | None = None) -> Record:
        spec = STATES[self._state]
        if now is None:
            now = self._at if self._at is not None else 0.0
        idem = self._idempotency
        hint = retry_hint(
            self._state,
            spec.outcome,
            self._code,
            self._idempotent,
            idem.get("expires_at") if idem else None,
            bool(idem and idem.get("key")),
            self._retry_after,
            self._max_retry_after,
            self._budget_total - self._budget_used,
            now,
        )
        code = self._code
        message = self._message or (CODES[code].meaning if code is not None else "")
        return Record(
            invocation_id=self._invocation_id or "",
            state=self._state,
            phase=spec.phase,
            outcome=spec.outcome,
            retry=hint,
            code=code,
            message=message,
            session=self._session,
            target=self._target,
            protocol=self._protocol,
            idempotent=self._idempotent,
            fingerprint=self._fingerprint,
            idempotency=self._idempotency_view,
            generation=self._generation,
            budget=_budget(self._budget_total, self._budget_used),
            attempts=tuple(self._attempts),
            evidence=MappingProxyType(self._evidence_snapshot()),
            retry_after=self._retry_after,
            last_seq=self._last_seq,
            events=self._events,
            field=self._field,
        )


# --- per-event rules: a check (returns a reason or None) and an effect -----------------------


# Enum lookups by value through plain dicts: ``Code(raw)`` goes through EnumMeta.__call__ and an
# exception for unknown values, several times slower than a dict get on the hot path.
_CODE_BY_VALUE: dict[str, Code] = {c.value: c for c in Code}
_SOURCE: dict[EvidenceSource, str] = {s: s.value for s in EvidenceSource}
_UNKNOWN, _NOT_ATTEMPTED = Outcome.UNKNOWN.value, Outcome.NOT_ATTEMPTED.value
_RESOLVED_BY_VALUE: dict[str, Outcome] = {o.value: o for o in _RESOLVED}


def _code_of(event: Event) -> Code | None:
    raw = event.attrs.get("code")
    return _CODE_BY_VALUE.get(raw) if type(raw) is str else None


def _resolved_outcome(event: Event) -> Outcome | None:
    """attrs.outcome when it names a resolved outcome (rejected | committed), else None."""
    raw = event.attrs.get("outcome")
    return _RESOLVED_BY_VALUE.get(raw) if type(raw) is str else None


def _is_int(value: object) -> TypeGuard[int]:
    # bool is an int subclass; True must not pass for generation 1.
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0


def _check_phase_code(phase: Phase) -> Callable[[Projector, Event], str | None]:
    def check(p: Projector, event: Event) -> str | None:
        code = _code_of(event)
        if code is None:
            return "attrs.code must be a known code"
        if CODES[code].phase is not phase:
            return f"{code.value} is a {CODES[code].phase.value} code, not {phase.value}"
        return None

    return check


def _is_mapping(value: object) -> bool:
    # ``type() is dict`` first: the ABC instance check is slow and events are nearly always dicts
    return type(value) is dict or isinstance(value, Mapping)


def _check_accepted(p: Projector, event: Event) -> str | None:
    op = event.attrs.get("operation")
    if not _is_mapping(op):
        return "attrs.operation is required"
    op = cast(Mapping[str, Any], op)
    budget = op.get("budget", DEFAULT_BUDGET)
    if not _is_int(budget) or budget < 1:
        return "operation.budget must be a positive integer"
    if not _is_number(op.get("max_retry_after", DEFAULT_MAX_RETRY_AFTER)):
        return "operation.max_retry_after must be a non-negative number"
    for key in ("target", "protocol", "fingerprint"):
        value = op.get(key)
        if value is not None and not isinstance(value, str):
            return f"operation.{key} must be a string"
    idem = op.get("idempotency")
    if idem is not None:
        if not _is_mapping(idem):
            return "operation.idempotency must be an object"
        for key in ("key", "scope", "fingerprint", "remote_contract"):
            value = idem.get(key)
            if value is not None and not isinstance(value, str):
                return f"operation.idempotency.{key} must be a string"
        expires = idem.get("expires_at")
        if expires is not None and not _is_number(expires):
            return "operation.idempotency.expires_at must be a number"
    return None


def _check_lease(p: Projector, event: Event) -> str | None:
    gen = event.attrs.get("generation")
    if not _is_int(gen) or gen <= p._generation:
        return f"lease generation must exceed {p._generation}"
    if p._budget_used >= p._budget_total:
        return "retry budget exhausted"
    return None


def _check_dispatch(p: Projector, event: Event) -> str | None:
    gen = event.attrs.get("generation", p._generation)
    if not _is_int(gen) or gen != p._generation:
        return f"stale generation {gen}; the current lease generation is {p._generation}"
    return None


def _check_lease_lost(p: Projector, event: Event) -> str | None:
    gen = event.attrs.get("generation")
    if not _is_int(gen) or gen > p._generation:
        return "LEASE_LOST must name a generation not newer than the current one"
    return None


def _check_complete(p: Projector, event: Event) -> str | None:
    outcome = _resolved_outcome(event)
    if outcome is None:
        return "attrs.outcome must be rejected or committed"
    raw = event.attrs["outcome"]
    ra = event.attrs.get("retry_after")
    if ra is not None and not _is_number(ra):
        return "attrs.retry_after must be a non-negative number of seconds"
    if event.source is not EvidenceSource.REMOTE_RESPONSE:
        return "a complete result must come from remote_response"
    code = _code_of(event)
    if event.attrs.get("code") is not None and code is None:
        return "attrs.code is not a known code"
    if code is None:
        if raw != Outcome.COMMITTED:
            return "a rejection needs a code"
        return None
    info = CODES[code]
    if info.phase is not Phase.REMOTE_EXECUTION or info.outcome is not outcome:
        return f"{code.value} cannot classify a {raw} result"
    return None


def _check_interrupted(p: Projector, event: Event) -> str | None:
    if _code_of(event) not in _INTERRUPT_CODES:
        return "attrs.code must be one of " + ", ".join(sorted(_INTERRUPT_CODES))
    return None


def _check_reconciled(p: Projector, event: Event) -> str | None:
    if _resolved_outcome(event) is None:
        return "attrs.outcome must be rejected or committed (never not_attempted)"
    if event.source not in _SECOND_OBSERVER:
        return "reconciliation must name remote_query or operator_attested as its source"
    return None


def _check_observed(p: Projector, event: Event) -> str | None:
    proto = event.attrs.get("protocol", "protocol")
    if not isinstance(proto, str) or not proto.isidentifier():
        return "attrs.protocol must be an identifier"
    if not isinstance(p._evidence.get(proto, {}), dict):
        return f"attrs.protocol {proto!r} collides with an evidence field"
    if not isinstance(event.attrs.get("state"), str):
        return "attrs.state must name the protocol state"
    facts = event.attrs.get("facts")
    if facts is not None and not _is_mapping(facts):
        return "attrs.facts must be an object"
    return None


_CHECKS: dict[EventKind, Callable[[Projector, Event], str | None]] = {
    E.ACTION_ACCEPTED: _check_accepted,
    E.PREFLIGHT_FAILED: _check_phase_code(Phase.VALIDATION),
    E.CREDENTIAL_FAILED: _check_phase_code(Phase.CREDENTIAL_INJECTION),
    E.APPROVAL_DENIED: _check_phase_code(Phase.CREDENTIAL_INJECTION),
    E.SETUP_ATTEMPT_FAILED: _check_phase_code(Phase.CONNECTION_SETUP),
    E.SETUP_FAILED: _check_phase_code(Phase.CONNECTION_SETUP),
    E.RETRY_LEASE_ACQUIRED: _check_lease,
    E.DISPATCH_STARTED: _check_dispatch,
    E.LEASE_LOST: _check_lease_lost,
    E.REMOTE_RESPONSE_COMPLETE: _check_complete,
    E.ATTEMPT_INTERRUPTED: _check_interrupted,
    E.RECONCILED: _check_reconciled,
    E.PROTOCOL_OBSERVED: _check_observed,
}


def _set_error(p: Projector, event: Event, code: Code | None = None) -> None:
    p._code = code if code is not None else _code_of(event)
    p._message = event.attrs.get("message")
    p._field = event.attrs.get("field")


def _eff_accepted(p: Projector, event: Event) -> None:
    op: Mapping[str, Any] = event.attrs["operation"]
    p._session = event.attrs.get("session")
    p._target = op.get("target")
    p._protocol = op.get("protocol")
    p._idempotent = bool(op.get("idempotent", False))
    p._fingerprint = op.get("fingerprint")
    p._budget_total = op.get("budget", DEFAULT_BUDGET)
    p._budget_used = 1
    p._max_retry_after = float(op.get("max_retry_after", DEFAULT_MAX_RETRY_AFTER))
    idem = op.get("idempotency")
    if idem:
        p._idempotency = dict(idem)
        p._idempotency.setdefault("fingerprint", p._fingerprint)
        p._idempotency.setdefault("remote_contract", "configured")
        p._idempotency_view = MappingProxyType(dict(p._idempotency))
        p._evidence["idempotency"] = {
            k: p._idempotency.get(k) for k in ("key", "scope", "fingerprint", "remote_contract")
        }
    p._evidence["fingerprint"] = p._fingerprint


def _eff_error(p: Projector, event: Event) -> None:
    _set_error(p, event)


def _eff_setup_attempt(p: Projector, event: Event) -> None:
    p._attempts.append(
        MappingProxyType(
            {
                "n": len(p._attempts) + 1,
                "generation": p._generation,
                "stage": event.attrs.get("stage"),
                "outcome": _NOT_ATTEMPTED,
                "code": event.attrs.get("code"),
            }
        )
    )


def _eff_setup_failed(p: Projector, event: Event) -> None:
    _set_error(p, event)
    # The final setup failure is itself an attempt unless it repeats the last recorded one.
    last = p._attempts[-1] if p._attempts else None
    if (
        last is None
        or last.get("seq") is not None
        or last["generation"] != p._generation
        or (
            last["stage"],
            last["code"],
        )
        != (event.attrs.get("stage"), event.attrs.get("code"))
    ):
        _eff_setup_attempt(p, event)


def _eff_lease(p: Projector, event: Event) -> None:
    p._generation = event.attrs["generation"]
    p._budget_used += 1
    p._evidence["lease"] = {
        "generation": p._generation,
        "holder": event.attrs.get("holder"),
        "seq": event.seq,
    }


def _eff_dispatch(p: Projector, event: Event) -> None:
    # A new attempt: per-attempt flags start over; dispatch_started never goes back.
    ev = p._evidence
    ev["dispatch_started"] = True
    ev["dispatch_seq"] = event.seq
    ev["request_complete"] = False
    ev["response_headers_received"] = False
    ev["response_complete"] = False
    for k in ("status", "exit_status", "exit_signal", "response_sha256", "steps"):
        ev.pop(k, None)
    for k in ("connection", "reused_connection", "peer", "hop"):
        if k in event.attrs:
            ev[k] = event.attrs[k]
    p._code = None
    p._message = None
    p._field = None
    p._retry_after = None
    p._attempts.append(
        MappingProxyType(
            {
                "n": len(p._attempts) + 1,
                "generation": p._generation,
                "stage": "dispatch",
                "outcome": _UNKNOWN,
                "code": None,
                "seq": event.seq,
            }
        )
    )


def _update_dispatched_attempt(p: Projector, **changes: Any) -> None:
    """Replace the current dispatched attempt's view with one carrying ``changes``."""
    if p._attempts and p._attempts[-1]["stage"] == "dispatch":
        p._attempts[-1] = MappingProxyType({**p._attempts[-1], **changes})


def _eff_request_sent(p: Projector, event: Event) -> None:
    p._evidence["request_complete"] = True


def _eff_response_started(p: Projector, event: Event) -> None:
    p._evidence["response_headers_received"] = True
    if "status" in event.attrs:
        p._evidence["status"] = event.attrs["status"]


_RESULT_FACTS = ("status", "exit_status", "exit_signal", "response_sha256", "remote_request_id")


def _eff_complete(p: Projector, event: Event) -> None:
    ev = p._evidence
    ev["response_complete"] = True
    ev["response_headers_received"] = True
    ev["source"] = _SOURCE[event.source]
    for k in _RESULT_FACTS:
        if k in event.attrs:
            ev[k] = event.attrs[k]
    _set_error(p, event)
    ra = event.attrs.get("retry_after")
    p._retry_after = float(ra) if ra is not None else None
    _update_dispatched_attempt(p, outcome=event.attrs["outcome"], code=event.attrs.get("code"))


def _eff_interrupted(p: Projector, event: Event) -> None:
    _set_error(p, event)
    p._evidence["source"] = _SOURCE[event.source]
    _update_dispatched_attempt(p, code=event.attrs.get("code"))


def _eff_result_committed(p: Projector, event: Event) -> None:
    p._evidence["result"] = {
        "seq": event.seq,
        "sha256": event.attrs.get("sha256"),
        "chunks": event.attrs.get("chunks"),
    }


def _eff_store_failed(p: Projector, event: Event) -> None:
    _set_error(p, event, Code.RESULT_STORE_FAILED)


def _eff_delivery_failed(p: Projector, event: Event) -> None:
    p._result_code = p._code
    _set_error(p, event, Code.RESULT_DELIVERY_FAILED)


def _eff_delivered(p: Projector, event: Event) -> None:
    if p._code is Code.RESULT_DELIVERY_FAILED:
        # Delivery now succeeded: the remote result's own classification stands again.
        p._code = p._result_code
        p._message = None
    p._evidence["delivered_seq"] = event.seq


def _eff_budget(p: Projector, event: Event) -> None:
    p._budget_used = p._budget_total
    p._evidence["budget_exhausted"] = True


def _eff_reconciled(p: Projector, event: Event) -> None:
    # The original attempt stays as recorded; the reconciliation is added beside it.
    p._evidence["reconciliation"] = {
        "outcome": event.attrs["outcome"],
        "source": _SOURCE[event.source],
        "observer": event.observer,
        "observer_seq": event.observer_seq,
        "seq": event.seq,
        "note": event.attrs.get("note"),
    }
    p._evidence["source"] = _SOURCE[event.source]
    p._code = None if event.attrs["outcome"] == Outcome.COMMITTED else Code.REMOTE_REJECTED
    p._message = event.attrs.get("message")


def _eff_observed(p: Projector, event: Event) -> None:
    proto = event.attrs.get("protocol", "protocol")
    step = f"{proto}.{event.attrs.get('state')}"
    steps = p._evidence.setdefault("steps", [])
    steps.append(step)
    p._mutable.add("steps")
    facts = event.attrs.get("facts")
    if facts:
        p._evidence.setdefault(proto, {}).update(facts)
        p._mutable.add(proto)


def _eff_lease_lost(p: Projector, event: Event) -> None:
    p._evidence.setdefault("stale_workers", []).append(
        {"generation": event.attrs.get("generation"), "seq": event.seq}
    )
    p._mutable.add("stale_workers")


def _eff_approval(p: Projector, event: Event) -> None:
    p._evidence["approval"] = event.kind.value.removeprefix("APPROVAL_").lower()


def _eff_credential(p: Projector, event: Event) -> None:
    attrs = event.attrs
    cred = {}
    for k in ("credential", "version", "inject"):  # never the secret itself
        if k in attrs:
            cred[k] = attrs[k]
    p._evidence["credential"] = cred


def _eff_validated(p: Projector, event: Event) -> None:
    if "config_hash" in event.attrs:
        p._evidence["config_hash"] = event.attrs["config_hash"]


def _eff_approval_denied(p: Projector, event: Event) -> None:
    _eff_approval(p, event)
    _set_error(p, event)


_EFFECTS: dict[EventKind, Callable[[Projector, Event], None]] = {
    E.ACTION_ACCEPTED: _eff_accepted,
    E.PREFLIGHT_VALIDATED: _eff_validated,
    E.PREFLIGHT_FAILED: _eff_error,
    E.APPROVAL_REQUESTED: _eff_approval,
    E.APPROVAL_GRANTED: _eff_approval,
    E.APPROVAL_DENIED: _eff_approval_denied,
    E.CREDENTIAL_AUTHORIZED: _eff_credential,
    E.CREDENTIAL_FAILED: _eff_error,
    E.SETUP_ATTEMPT_FAILED: _eff_setup_attempt,
    E.SETUP_FAILED: _eff_setup_failed,
    E.RETRY_LEASE_ACQUIRED: _eff_lease,
    E.DISPATCH_STARTED: _eff_dispatch,
    E.REQUEST_SENT: _eff_request_sent,
    E.REMOTE_RESPONSE_STARTED: _eff_response_started,
    E.REMOTE_RESPONSE_COMPLETE: _eff_complete,
    E.ATTEMPT_INTERRUPTED: _eff_interrupted,
    E.RESULT_COMMITTED: _eff_result_committed,
    E.RESULT_STORE_FAILED: _eff_store_failed,
    E.RESULT_DELIVERY_FAILED: _eff_delivery_failed,
    E.RESULT_DELIVERED: _eff_delivered,
    E.RETRY_BUDGET_EXHAUSTED: _eff_budget,
    E.RECONCILED: _eff_reconciled,
    E.PROTOCOL_OBSERVED: _eff_observed,
    E.LEASE_LOST: _eff_lease_lost,
}

_RULES: dict[
    EventKind,
    tuple[
        Callable[[Projector, Event], str | None] | None, Callable[[Projector, Event], None] | None
    ],
] = {kind: (_CHECKS.get(kind), _EFFECTS.get(kind)) for kind in EventKind}
"""One lookup per event for its check and its effect."""

_SPLIT: dict[str, dict[str, str]] = {
    dest: {outcome.value: state for outcome, state in split.items()}
    for dest, split in OUTCOME_SPLIT.items()
}


def project(events: Iterable[Event], now: float | None = None) -> Record:
    """Fold one invocation's events (in ``seq`` order) into its record."""
    return Projector().extend(events).record(now)


def project_all(events: Iterable[Event], now: float | None = None) -> dict[str, Record]:
    """Fold an interleaved log of many invocations; one record per invocation id."""
    folds: dict[str, Projector] = {}
    get = folds.get
    apply = Projector.apply  # bound once: this loop runs once per journal row on recovery
    # The fold allocates many small, acyclic containers (records, evidence dicts, attempt views)
    # while the caller holds a large event list: every automatic cyclic-GC pass re-walks that
    # list, which cost as much as the fold itself (tests/benchmarks/projection.py).  Nothing
    # here can form a reference cycle, so pausing the cyclic collector loses nothing;
    # reference counting still frees everything.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for event in events:
            p = get(event.invocation_id)
            if p is None:
                p = folds[event.invocation_id] = Projector(event.invocation_id)
            apply(p, event)
        return {iid: p.record(now) for iid, p in folds.items()}
    finally:
        if gc_was_enabled:
            gc.enable()
