"""Projection: an ordered event list in, the current record out.  Pure and synchronous.

Seed, "The error envelope must contain evidence": store transitions as append-only events, then
project the current state.  The projection refuses impossible events (``ImpossibleEvent``) and
never rewrites history: a refused event leaves the fold exactly as it was, so a caller that
catches the error still holds the last good record.

Speed matters (recovery projects whole journals; tests/benchmarks/projection.py holds
``project_all`` within 10x of a bare table-lookup loop), so each event costs one lookup in a dict
compiled from ``lifecycle.TRANSITIONS``: (state, kind) -> (destination, the kind's rule), where
the rule checks the event and only then applies it.  ``tests/`` prove the dict and the
``transitions`` machine agree.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any, NoReturn, TypeGuard, cast

from .contract import CODES, Code, EvidenceSource, Outcome, Phase, Retry
from .events import Event, EventKind
from .lifecycle import INITIAL, OUTCOME_SPLIT, STATES, TRANSITIONS
from .retry import retry_hint, static_retry_hint

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
"""The lifecycle table as plain dicts ("=" and the ``*_*`` split destinations kept as declared);
the model checks compare it with the ``transitions`` machine."""

_Rule = Callable[["Projector", Event], str | None]
"""Validates one event against the fold, raising ``ImpossibleEvent`` before changing anything,
then applies its effect.  Returns the outcome that picks a split destination, else None."""

_new = object.__new__
_set = object.__setattr__


class _RecordSlots:
    """``Record``'s slot layout without its frozen ``__setattr__``.

    A frozen dataclass's ``__init__`` sets each of Record's 21 fields through
    ``object.__setattr__``, ~2.5 us per record — as much as folding a whole invocation's events
    (tests/benchmarks/projection.py).  ``_build`` fills an instance of this twin with plain
    attribute stores and then makes it a ``Record`` (``__class__`` assignment is allowed between
    classes with identical slots); the result is an ordinary, frozen ``Record``.
    """

    __slots__ = tuple(f.name for f in fields(Record))


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
        "_idempotent",
        "_invocation_id",
        "_last_seq",
        "_max_retry_after",
        "_message",
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
        # A read-only view, set once by ACTION_ACCEPTED and handed to every record as is.
        self._idempotency: Mapping[str, Any] | None = None
        self._generation = 0
        self._budget_total = DEFAULT_BUDGET
        self._budget_used = 0
        # Attempts are read-only views, replaced (never edited) when an attempt's outcome is
        # learnt, so a record can hold them without copying.
        self._attempts: list[MappingProxyType[str, Any]] = []
        # Evidence values are replaced, never edited in place (steps, protocol facts and stale
        # workers grow by copy): a record's snapshot is then one shallow copy of this dict.
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
        # Hot path (recovery folds whole journals; tests/benchmarks/projection.py): one lookup
        # gives the destination and the kind's rule, which checks and then applies the event.
        rule = _ROWS[self._state].get(event.kind)
        seq = event.seq
        iid = self._invocation_id
        if (
            rule is None
            or (seq is not None and self._last_seq is not None and seq <= self._last_seq)
            or (iid is not None and event.invocation_id != iid)
        ):
            raise self._refusal(event)
        dest, check_and_apply = rule
        outcome = check_and_apply(self, event)
        # -- the rule validated and applied the event; record that it happened --
        if outcome is not None:
            dest = _SPLIT[dest][outcome]  # the rule proved outcome is rejected or committed
        self._state = dest
        if seq is not None:
            self._last_seq = seq
        if event.at is not None:
            self._at = event.at
        self._events += 1
        if iid is None:
            self._invocation_id = event.invocation_id
        return dest

    def _refusal(self, event: Event) -> ImpossibleEvent:
        """Why ``apply`` refuses an event the lifecycle or the fold's order rules out."""
        state = self._state
        if event.invocation_id != self._invocation_id and self._invocation_id is not None:
            return ImpossibleEvent(event, state, "belongs to another invocation")
        seq, last = event.seq, self._last_seq
        if seq is not None and last is not None and seq <= last:
            return ImpossibleEvent(event, state, f"seq {seq} does not follow {last}")
        return ImpossibleEvent(event, state, "no such transition in the lifecycle table")

    def extend(self, events: Iterable[Event]) -> Projector:
        for event in events:
            self.apply(event)
        return self

    # -- reading ------------------------------------------------------------------------------

    def record(self, now: float | None = None) -> Record:
        """A snapshot of the fold: later events do not change it."""
        return self._build(now, self._evidence.copy())

    def _build(self, now: float | None, evidence: dict[str, Any]) -> Record:
        """The record, with ``evidence`` as its evidence.  ``project``/``project_all`` pass the
        fold's own dict (no copy): they drop the projector right after."""
        state = self._state
        phase, outcome, hints = _STATE_INFO[state]
        code = self._code
        retry = hints[code]
        if retry is None:  # the hint depends on the operation, the budget or the clock
            if now is None:
                now = self._at if self._at is not None else 0.0
            idem = self._idempotency
            retry = retry_hint(
                state,
                outcome,
                code,
                self._idempotent,
                idem.get("expires_at") if idem else None,
                bool(idem and idem.get("key")),
                self._retry_after,
                self._max_retry_after,
                self._budget_total - self._budget_used,
                now,
            )
        r: Any = _new(_RecordSlots)
        r.invocation_id = self._invocation_id or ""
        r.state = state
        r.phase = phase
        r.outcome = outcome
        r.retry = retry
        r.code = code
        r.message = self._message or _MEANING[code]
        r.session = self._session
        r.target = self._target
        r.protocol = self._protocol
        r.idempotent = self._idempotent
        r.fingerprint = self._fingerprint
        r.idempotency = self._idempotency
        r.generation = self._generation
        r.budget = _budget(self._budget_total, self._budget_used)
        r.attempts = tuple(self._attempts)
        r.evidence = MappingProxyType(evidence)
        r.retry_after = self._retry_after
        r.last_seq = self._last_seq
        r.events = self._events
        r.field = self._field
        _set(r, "__class__", Record)
        return cast(Record, r)


# --- per-kind rules: check (refuse before any change), then apply ---------------------------


# Enum lookups by value through plain dicts: ``Code(raw)`` goes through EnumMeta.__call__ and an
# exception for unknown values, several times slower than a dict get on the hot path.
_CODE_BY_VALUE: dict[str, Code] = {c.value: c for c in Code}
_MEANING: dict[Code | None, str] = {None: "", **{c: CODES[c].meaning for c in Code}}
_SOURCE: dict[EvidenceSource, str] = {s: s.value for s in EvidenceSource}
_UNKNOWN, _NOT_ATTEMPTED = Outcome.UNKNOWN.value, Outcome.NOT_ATTEMPTED.value
# Enum members the rules compare against, as module constants: ``Code.X`` is a lookup through
# the enum's metaclass each time (~70 ns, as much as a small rule's whole effect).
_COMMITTED = Outcome.COMMITTED
_REMOTE_RESPONSE = EvidenceSource.REMOTE_RESPONSE
_VALIDATION, _CREDENTIAL_INJECTION, _CONNECTION_SETUP, _REMOTE_EXECUTION = (
    Phase.VALIDATION,
    Phase.CREDENTIAL_INJECTION,
    Phase.CONNECTION_SETUP,
    Phase.REMOTE_EXECUTION,
)
_STORE_FAILED, _DELIVERY_FAILED, _REMOTE_REJECTED = (
    Code.RESULT_STORE_FAILED,
    Code.RESULT_DELIVERY_FAILED,
    Code.REMOTE_REJECTED,
)
_RESOLVED_BY_VALUE: dict[str, Outcome] = {o.value: o for o in _RESOLVED}


def _refuse(p: Projector, event: Event, reason: str) -> NoReturn:
    raise ImpossibleEvent(event, p._state, reason)


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


def _is_mapping(value: object) -> TypeGuard[Mapping[str, Any]]:
    # ``type() is dict`` first: the ABC instance check is slow and events are nearly always dicts
    return type(value) is dict or isinstance(value, Mapping)


def _phase_code(p: Projector, event: Event, phase: Phase) -> Code:
    """attrs.code, refused unless it is a known code of ``phase``."""
    code = _code_of(event)
    if code is None:
        _refuse(p, event, "attrs.code must be a known code")
    if CODES[code].phase is not phase:
        _refuse(p, event, f"{code.value} is a {CODES[code].phase.value} code, not {phase.value}")
    return code


def _set_error(p: Projector, event: Event, code: Code | None) -> None:
    p._code = code
    p._message = event.attrs.get("message")
    p._field = event.attrs.get("field")


def _on_accepted(p: Projector, event: Event) -> None:
    attrs = event.attrs
    op = attrs.get("operation")
    if not _is_mapping(op):
        _refuse(p, event, "attrs.operation is required")
    # Each check tries the exact type first (one identity test), then the general rule.
    budget = op.get("budget", DEFAULT_BUDGET)
    if (type(budget) is not int and not _is_int(budget)) or budget < 1:
        _refuse(p, event, "operation.budget must be a positive integer")
    max_retry_after = op.get("max_retry_after", DEFAULT_MAX_RETRY_AFTER)
    if not (type(max_retry_after) is float and max_retry_after >= 0) and not _is_number(
        max_retry_after
    ):
        _refuse(p, event, "operation.max_retry_after must be a non-negative number")
    target, protocol, fingerprint = op.get("target"), op.get("protocol"), op.get("fingerprint")
    if target is not None and type(target) is not str and not isinstance(target, str):
        _refuse(p, event, "operation.target must be a string")
    if protocol is not None and type(protocol) is not str and not isinstance(protocol, str):
        _refuse(p, event, "operation.protocol must be a string")
    if (
        fingerprint is not None
        and type(fingerprint) is not str
        and not isinstance(fingerprint, str)
    ):
        _refuse(p, event, "operation.fingerprint must be a string")
    idem = op.get("idempotency")
    if idem is not None:
        _check_idempotency(p, event, idem)
    # -- validated: apply --
    p._session = attrs.get("session")
    p._target = target
    p._protocol = protocol
    p._idempotent = bool(op.get("idempotent", False))
    p._fingerprint = fingerprint
    p._budget_total = budget
    p._budget_used = 1
    p._max_retry_after = float(max_retry_after)
    ev = p._evidence
    if idem:
        contract = dict(idem)
        contract.setdefault("fingerprint", fingerprint)
        contract.setdefault("remote_contract", "configured")
        p._idempotency = MappingProxyType(contract)  # never edited: records share the view
        ev["idempotency"] = {
            "key": contract.get("key"),
            "scope": contract.get("scope"),
            "fingerprint": contract.get("fingerprint"),
            "remote_contract": contract.get("remote_contract"),
        }
    ev["fingerprint"] = fingerprint
    return None


def _check_idempotency(p: Projector, event: Event, idem: object) -> None:
    if not _is_mapping(idem):
        _refuse(p, event, "operation.idempotency must be an object")
    for key in ("key", "scope", "fingerprint", "remote_contract"):
        value = idem.get(key)
        if value is not None and not isinstance(value, str):
            _refuse(p, event, f"operation.idempotency.{key} must be a string")
    expires = idem.get("expires_at")
    if expires is not None and not _is_number(expires):
        _refuse(p, event, "operation.idempotency.expires_at must be a number")


def _on_validated(p: Projector, event: Event) -> None:
    if "config_hash" in event.attrs:
        p._evidence["config_hash"] = event.attrs["config_hash"]


def _on_preflight_failed(p: Projector, event: Event) -> None:
    _set_error(p, event, _phase_code(p, event, _VALIDATION))


def _on_credential_failed(p: Projector, event: Event) -> None:
    _set_error(p, event, _phase_code(p, event, _CREDENTIAL_INJECTION))


def _on_approval_requested(p: Projector, event: Event) -> None:
    p._evidence["approval"] = "requested"


def _on_approval_granted(p: Projector, event: Event) -> None:
    p._evidence["approval"] = "granted"


def _on_approval_denied(p: Projector, event: Event) -> None:
    code = _phase_code(p, event, _CREDENTIAL_INJECTION)
    p._evidence["approval"] = "denied"
    _set_error(p, event, code)


def _on_credential(p: Projector, event: Event) -> None:
    attrs = event.attrs
    cred = {}
    for k in ("credential", "version", "inject"):  # never the secret itself
        if k in attrs:
            cred[k] = attrs[k]
    p._evidence["credential"] = cred


def _add_setup_attempt(p: Projector, event: Event) -> None:
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


def _on_setup_attempt(p: Projector, event: Event) -> None:
    _phase_code(p, event, _CONNECTION_SETUP)
    _add_setup_attempt(p, event)


def _on_setup_failed(p: Projector, event: Event) -> None:
    _set_error(p, event, _phase_code(p, event, _CONNECTION_SETUP))
    # The final setup failure is itself an attempt unless it repeats the last recorded one.
    last = p._attempts[-1] if p._attempts else None
    if (
        last is None
        or last.get("seq") is not None
        or last["generation"] != p._generation
        or (last["stage"], last["code"]) != (event.attrs.get("stage"), event.attrs.get("code"))
    ):
        _add_setup_attempt(p, event)


def _on_lease(p: Projector, event: Event) -> None:
    gen = event.attrs.get("generation")
    if not _is_int(gen) or gen <= p._generation:
        _refuse(p, event, f"lease generation must exceed {p._generation}")
    if p._budget_used >= p._budget_total:
        _refuse(p, event, "retry budget exhausted")
    p._generation = gen
    p._budget_used += 1
    p._evidence["lease"] = {
        "generation": gen,
        "holder": event.attrs.get("holder"),
        "seq": event.seq,
    }


_PER_ATTEMPT_FACTS = ("status", "exit_status", "exit_signal", "response_sha256", "steps")
_DISPATCH_FACTS = ("connection", "reused_connection", "peer", "hop")


def _on_dispatch(p: Projector, event: Event) -> None:
    attrs = event.attrs
    gen = attrs.get("generation", p._generation)
    if not _is_int(gen) or gen != p._generation:
        _refuse(
            p, event, f"stale generation {gen}; the current lease generation is {p._generation}"
        )
    # A new attempt: per-attempt flags start over; dispatch_started never goes back.
    ev = p._evidence
    ev["dispatch_started"] = True
    ev["dispatch_seq"] = event.seq
    ev["request_complete"] = False
    ev["response_headers_received"] = False
    ev["response_complete"] = False
    for k in _PER_ATTEMPT_FACTS:
        if k in ev:
            del ev[k]
    for k in _DISPATCH_FACTS:
        if k in attrs:
            ev[k] = attrs[k]
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


def _on_request_sent(p: Projector, event: Event) -> None:
    p._evidence["request_complete"] = True


def _on_response_started(p: Projector, event: Event) -> None:
    ev = p._evidence
    ev["response_headers_received"] = True
    if "status" in event.attrs:
        ev["status"] = event.attrs["status"]


_RESULT_FACTS = ("status", "exit_status", "exit_signal", "response_sha256", "remote_request_id")


def _on_complete(p: Projector, event: Event) -> str:
    attrs = event.attrs
    raw = attrs.get("outcome")
    outcome = _RESOLVED_BY_VALUE.get(raw) if type(raw) is str else None
    if outcome is None:
        _refuse(p, event, "attrs.outcome must be rejected or committed")
    ra = attrs.get("retry_after")
    if ra is not None and not _is_number(ra):
        _refuse(p, event, "attrs.retry_after must be a non-negative number of seconds")
    if event.source is not _REMOTE_RESPONSE:
        _refuse(p, event, "a complete result must come from remote_response")
    raw_code = attrs.get("code")
    if raw_code is None:
        if outcome is not _COMMITTED:
            _refuse(p, event, "a rejection needs a code")
        code = None
    else:
        code = _CODE_BY_VALUE.get(raw_code) if type(raw_code) is str else None
        if code is None:
            _refuse(p, event, "attrs.code is not a known code")
        info = CODES[code]
        if info.phase is not _REMOTE_EXECUTION or info.outcome is not outcome:
            _refuse(p, event, f"{code.value} cannot classify a {raw} result")
    # -- validated: apply --
    ev = p._evidence
    ev["response_complete"] = True
    ev["response_headers_received"] = True
    ev["source"] = _SOURCE[event.source]
    for k in _RESULT_FACTS:
        if k in attrs:
            ev[k] = attrs[k]
    _set_error(p, event, code)
    p._retry_after = float(ra) if ra is not None else None
    _update_dispatched_attempt(p, raw, raw_code)
    return cast(str, raw)


def _update_dispatched_attempt(p: Projector, outcome: object, code: object) -> None:
    """Replace the current dispatched attempt's view with one carrying its outcome and code."""
    attempts = p._attempts
    if attempts and attempts[-1]["stage"] == "dispatch":
        # view.copy() is a dict copy; ``{**view}`` walks the mapping protocol, ~8x slower
        attempt = attempts[-1].copy()
        attempt["outcome"] = outcome
        attempt["code"] = code
        attempts[-1] = MappingProxyType(attempt)


def _on_interrupted(p: Projector, event: Event) -> None:
    code = _code_of(event)
    if code not in _INTERRUPT_CODES:
        _refuse(p, event, "attrs.code must be one of " + ", ".join(sorted(_INTERRUPT_CODES)))
    _set_error(p, event, code)
    p._evidence["source"] = _SOURCE[event.source]
    attempts = p._attempts
    if attempts and attempts[-1]["stage"] == "dispatch":
        attempt = attempts[-1].copy()
        attempt["code"] = event.attrs.get("code")
        attempts[-1] = MappingProxyType(attempt)


def _on_result_committed(p: Projector, event: Event) -> None:
    p._evidence["result"] = {
        "seq": event.seq,
        "sha256": event.attrs.get("sha256"),
        "chunks": event.attrs.get("chunks"),
    }


def _on_store_failed(p: Projector, event: Event) -> None:
    _set_error(p, event, _STORE_FAILED)


def _on_delivery_failed(p: Projector, event: Event) -> None:
    p._result_code = p._code
    _set_error(p, event, _DELIVERY_FAILED)


def _on_delivered(p: Projector, event: Event) -> None:
    if p._code is _DELIVERY_FAILED:
        # Delivery now succeeded: the remote result's own classification stands again.
        p._code = p._result_code
        p._message = None
    p._evidence["delivered_seq"] = event.seq


def _on_budget(p: Projector, event: Event) -> None:
    p._budget_used = p._budget_total
    p._evidence["budget_exhausted"] = True


def _on_reconciled(p: Projector, event: Event) -> str:
    outcome = _resolved_outcome(event)
    if outcome is None:
        _refuse(p, event, "attrs.outcome must be rejected or committed (never not_attempted)")
    if event.source not in _SECOND_OBSERVER:
        _refuse(
            p, event, "reconciliation must name remote_query or operator_attested as its source"
        )
    # The original attempt stays as recorded; the reconciliation is added beside it.
    raw: str = event.attrs["outcome"]
    ev = p._evidence
    ev["reconciliation"] = {
        "outcome": raw,
        "source": _SOURCE[event.source],
        "observer": event.observer,
        "observer_seq": event.observer_seq,
        "seq": event.seq,
        "note": event.attrs.get("note"),
    }
    ev["source"] = _SOURCE[event.source]
    p._code = None if outcome is _COMMITTED else _REMOTE_REJECTED
    p._message = event.attrs.get("message")
    return raw


_LISTS = frozenset({"steps", "stale_workers"})
"""Evidence fields holding lists: a protocol's facts cannot be merged into them."""


def _on_observed(p: Projector, event: Event) -> None:
    attrs = event.attrs
    proto = attrs.get("protocol", "protocol")
    if not isinstance(proto, str) or not proto.isidentifier():
        _refuse(p, event, "attrs.protocol must be an identifier")
    ev = p._evidence
    known = ev.get(proto, _NO_FACTS)
    if (type(known) is not dict and not isinstance(known, dict)) or proto in _LISTS:
        _refuse(p, event, f"attrs.protocol {proto!r} collides with an evidence field")
    state = attrs.get("state")
    if not isinstance(state, str):
        _refuse(p, event, "attrs.state must name the protocol state")
    facts = attrs.get("facts")
    if facts is not None and type(facts) is not dict and not _is_mapping(facts):
        _refuse(p, event, "attrs.facts must be an object")
    # -- validated: apply (by replacing values, never editing them; see Projector) --
    step = f"{proto}.{state}"
    steps = ev.get("steps")
    ev["steps"] = [*steps, step] if steps else [step]
    if facts:
        ev[proto] = {**known, **facts}


_NO_FACTS: dict[str, Any] = {}


def _on_lease_lost(p: Projector, event: Event) -> None:
    gen = event.attrs.get("generation")
    if not _is_int(gen) or gen > p._generation:
        _refuse(p, event, "LEASE_LOST must name a generation not newer than the current one")
    ev = p._evidence
    ev["stale_workers"] = [*ev.get("stale_workers", ()), {"generation": gen, "seq": event.seq}]


_RULES: dict[EventKind, _Rule] = {
    E.ACTION_ACCEPTED: _on_accepted,
    E.PREFLIGHT_VALIDATED: _on_validated,
    E.PREFLIGHT_FAILED: _on_preflight_failed,
    E.APPROVAL_REQUESTED: _on_approval_requested,
    E.APPROVAL_GRANTED: _on_approval_granted,
    E.APPROVAL_DENIED: _on_approval_denied,
    E.CREDENTIAL_AUTHORIZED: _on_credential,
    E.CREDENTIAL_FAILED: _on_credential_failed,
    E.SETUP_ATTEMPT_FAILED: _on_setup_attempt,
    E.SETUP_FAILED: _on_setup_failed,
    E.RETRY_LEASE_ACQUIRED: _on_lease,
    E.DISPATCH_STARTED: _on_dispatch,
    E.REQUEST_SENT: _on_request_sent,
    E.REMOTE_RESPONSE_STARTED: _on_response_started,
    E.REMOTE_RESPONSE_COMPLETE: _on_complete,
    E.ATTEMPT_INTERRUPTED: _on_interrupted,
    E.RESULT_COMMITTED: _on_result_committed,
    E.RESULT_STORE_FAILED: _on_store_failed,
    E.RESULT_DELIVERY_FAILED: _on_delivery_failed,
    E.RESULT_DELIVERED: _on_delivered,
    E.RETRY_BUDGET_EXHAUSTED: _on_budget,
    E.RECONCILED: _on_reconciled,
    E.PROTOCOL_OBSERVED: _on_observed,
    E.LEASE_LOST: _on_lease_lost,
}
"""Each kind's rule: checks that refuse before any change, then the effect."""

_SPLITTING = frozenset({E.REMOTE_RESPONSE_COMPLETE, E.RECONCILED})
"""Kinds whose rule returns the outcome that picks a split destination."""

_SPLIT: dict[str, dict[str, str]] = {
    dest: {outcome.value: state for outcome, state in split.items()}
    for dest, split in OUTCOME_SPLIT.items()
}


def _compile_rows() -> dict[str, dict[EventKind, tuple[str, _Rule]]]:
    """(state, kind) -> (destination, rule): ``apply``'s single lookup per event."""
    rows: dict[str, dict[EventKind, tuple[str, _Rule]]] = {}
    for state, row in TRANSITIONS.items():
        rows[state] = {}
        for kind, dest in row.items():
            if (dest in _SPLIT) != (kind in _SPLITTING):
                raise RuntimeError(f"{state} --{kind.value}--> {dest}: rules cannot split this")
            rows[state][kind] = (state if dest == "=" else dest, _RULES[kind])
    return rows


_ROWS = _compile_rows()

_STATE_INFO: dict[str, tuple[Phase, Outcome, dict[Code | None, Retry | None]]] = {
    state: (
        spec.phase,
        spec.outcome,
        {code: static_retry_hint(state, spec.outcome, code) for code in (None, *Code)},
    )
    for state, spec in STATES.items()
}
"""Per state: its phase, its outcome and, per code, the retry hint when those alone decide it."""


def project(events: Iterable[Event], now: float | None = None) -> Record:
    """Fold one invocation's events (in ``seq`` order) into its record."""
    p = Projector().extend(events)
    return p._build(now, p._evidence)


def _fold_all(events: Iterable[Event]) -> dict[str, Projector]:
    """One fold per invocation id over an interleaved log (``project_all`` without records)."""
    folds: dict[str, Projector] = {}
    get = folds.get
    rows, split = _ROWS, _SPLIT
    for event in events:
        iid = event.invocation_id
        p = get(iid)
        if p is None:
            p = folds[iid] = Projector(iid)
        # Projector.apply, inlined: this loop runs once per journal row on recovery and the call
        # cost ~10% of it.  A fold here only ever sees its own invocation's events.
        rule = rows[p._state].get(event.kind)
        seq = event.seq
        if rule is None or (seq is not None and p._last_seq is not None and seq <= p._last_seq):
            raise p._refusal(event)
        dest, check_and_apply = rule
        outcome = check_and_apply(p, event)
        if outcome is not None:
            dest = split[dest][outcome]
        p._state = dest
        if seq is not None:
            p._last_seq = seq
        if event.at is not None:
            p._at = event.at
        p._events += 1
    return folds


def project_all(events: Iterable[Event], now: float | None = None) -> dict[str, Record]:
    """Fold an interleaved log of many invocations; one record per invocation id."""
    # The fold allocates many small, acyclic containers (records, evidence dicts, attempt views)
    # while the caller holds a large event list: every automatic cyclic-GC pass re-walks that
    # list, which cost as much as the fold itself (tests/benchmarks/projection.py).  Nothing
    # here can form a reference cycle, so pausing the cyclic collector loses nothing;
    # reference counting still frees everything.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        folds = _fold_all(events)
        # The folds are dropped here, so each record takes its fold's evidence without a copy.
        return {iid: p._build(now, p._evidence) for iid, p in folds.items()}
    finally:
        if gc_was_enabled:
            gc.enable()
