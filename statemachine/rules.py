"""What each lifecycle event does to a fold: one rule per event kind, in the lifecycle's order.

A rule first *checks* the event against the fold and the contract -- refusing with
``ImpossibleEvent`` before changing anything -- and only then *applies* its effect, so a refused
event leaves the fold exactly as it was (seed: "The projection must reject impossible state
reversals").  Which (state, kind) pairs are possible at all is the lifecycle table's business
(``lifecycle.TRANSITIONS``); ``projection.py`` looks the rule up together with the destination.

The rules are the ``Projector``'s own code, kept in a module of their own so they read as one
list: they write its (package-private) fields directly.  That list is why the file runs past
~500 lines; the rules of the operation table and of batch items, which fold state of their own,
live in ``operation.py`` and ``batch.py`` and are merged into ``RULES`` below.  Speed notes
below (enum lookups through plain dicts, exact-type checks before the general one) come from
tests/benchmarks/projection.py: these functions run once per journal row when a whole journal is
folded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NoReturn, TypeGuard, cast

from .batch import check_batch, on_items_recorded
from .contract import CODES, Code, EvidenceSource, Outcome, Phase, Retry
from .events import Event, EventKind
from .lifecycle import STATES
from .operation import OPERATION_RULES
from .record import ImpossibleEvent

if TYPE_CHECKING:
    from .projection import Projector

__all__ = ["DEFAULT_BUDGET", "DEFAULT_MAX_RETRY_AFTER", "RULES", "SPLITTING", "Rule"]

E = EventKind

DEFAULT_BUDGET = 3
DEFAULT_MAX_RETRY_AFTER = 300.0

Rule = Callable[["Projector", Event], str | None]
"""Validates one event against the fold, raising ``ImpossibleEvent`` before changing anything,
then applies its effect.  Returns the outcome that picks a split destination, else None."""

_INTERRUPT_CODES = frozenset(
    {
        Code.REMOTE_OUTCOME_UNKNOWN,
        Code.REMOTE_RESULT_INCOMPLETE,
        Code.RESULT_SIZE_LIMIT,
        Code.CALLER_CANCELLED,
        Code.BROKER_SHUTDOWN,
    }
)
_SECOND_OBSERVER = frozenset({EvidenceSource.REMOTE_QUERY, EvidenceSource.OPERATOR_ATTESTED})
_RESOLVED = frozenset({Outcome.REJECTED, Outcome.COMMITTED})
_RETRY_PREFLIGHT = frozenset({"validated", "retry_pending"})
"""States a retry (generation > 0) is in between its lease and its dispatch."""


# Enum lookups by value through plain dicts: ``Code(raw)`` goes through EnumMeta.__call__ and an
# exception for unknown values, several times slower than a dict get on the hot path.
_CODE_BY_VALUE: dict[str, Code] = {c.value: c for c in Code}
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
_STORE_FAILED, _DELIVERY_FAILED, _REMOTE_REJECTED, _APPROVAL_PENDING = (
    Code.RESULT_STORE_FAILED,
    Code.RESULT_DELIVERY_FAILED,
    Code.REMOTE_REJECTED,
    Code.APPROVAL_PENDING,
)
_RESOLVED_BY_VALUE: dict[str, Outcome] = {o.value: o for o in _RESOLVED}


def _refuse(p: Projector, event: Event, reason: str) -> NoReturn:
    raise ImpossibleEvent(event, p._state, reason)


def _stale(p: Projector, event: Event, generation: object) -> NoReturn:
    """Refuse an attempt's event that names a generation other than the record's current one:
    its worker's lease was taken over (seed, "Retry code must be simple and testable": "the
    generation check must stop it").  Every event an attempt writes -- before its dispatch and
    after it -- names the attempt's generation (``attrs.generation``; absent in journals
    written before it did, and then unchecked): the lifecycle alone would accept a stale
    worker's complete response, result or interruption in the states of the attempt that took
    over, and the record would give one attempt's evidence as another's.

    The kinds are ``events.ATTEMPT_KINDS``.  Each of their rules here checks inline, first
    thing (the two in batch.py and operation.py are wrapped: ``_fenced``): one wrapper for all
    of them cost a call per such event, ~5% of the whole-journal fold, and the fold then missed
    its 10x target (tests/benchmarks/projection.py).  tests/statemachine/test_model_check.py
    proves every kind in the set is fenced wherever the lifecycle takes it."""
    _refuse(
        p,
        event,
        f"stale generation {generation}; the current lease generation is {p._generation}",
    )


_CLOSED = frozenset(name for name, spec in STATES.items() if spec.final)
"""States in which the current generation's attempt is closed: its worker ended it, recovery
closed it (naming that generation), or a second observer settled it -- the generation stays
current until a retry takes the next lease, and the attempt is not open again."""


def _closed(p: Projector, event: Event, generation: object) -> NoReturn:
    """Refuse an attempt's event that names the current generation after that attempt was
    closed (``_CLOSED``): its stalled worker resuming must not add to the record -- neither what
    it received nor the dispatch of a redirect's next hop."""
    _refuse(p, event, f"generation {generation}'s attempt is closed ({p._state})")


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
    info = CODES[code]
    if info.pending:
        _refuse(p, event, f"{code.value} says an invocation waits; it ends nothing")
    if info.phase is not phase and not (
        # A stop cause may strike before the dispatch gate (contract: CodeInfo.before_dispatch).
        phase is Phase.CONNECTION_SETUP and info.before_dispatch is not None
    ):
        _refuse(p, event, f"{code.value} is a {info.phase.value} code, not {phase.value}")
    return code


def _set_error(p: Projector, event: Event, code: Code | None) -> None:
    p._code = code
    p._message = event.attrs.get("message")
    p._field = event.attrs.get("field")


def _on_accepted(p: Projector, event: Event) -> None:
    attrs = event.attrs
    op = attrs.get("operation")
    if type(op) is not dict and not _is_mapping(op):
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
    batch = op.get("batch")
    if batch is not None:
        batch = check_batch(p, event, batch)
    # -- validated: apply --
    p._batch = batch
    p._session = attrs.get("session")
    p._target = target
    p._protocol = protocol
    p._idempotent = bool(op.get("idempotent", False))
    p._fingerprint = fingerprint
    p._budget_total = budget
    p._budget_used = 1
    p._max_retry_after = float(max_retry_after)
    ev = p._evidence
    if "lease_expires_at" in attrs:  # generation 0's deadline (its broker's lease)
        ev["lease"] = _lease_evidence(event, 0, attrs["lease_expires_at"])
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
    window = idem.get("send_window")
    if window is not None and not _is_number(window):
        _refuse(p, event, "operation.idempotency.send_window must be a number")


def _on_validated(p: Projector, event: Event) -> None:
    if "config_hash" in event.attrs:
        p._evidence["config_hash"] = event.attrs["config_hash"]


def _on_preflight_failed(p: Projector, event: Event) -> None:
    gen = event.attrs.get("generation")
    if gen is not None and (type(gen) is not int or gen != p._generation):
        _stale(p, event, gen)
    code = _phase_code(p, event, _VALIDATION)  # validated before anything changes
    _refund_refused_retry(p)
    _set_error(p, event, code)


def _on_credential_failed(p: Projector, event: Event) -> None:
    gen = event.attrs.get("generation")
    if gen is not None and (type(gen) is not int or gen != p._generation):
        _stale(p, event, gen)
    code = _phase_code(p, event, _CREDENTIAL_INJECTION)
    _refund_refused_retry(p)
    _set_error(p, event, code)


def _refund_refused_retry(p: Projector) -> None:
    """A retry refused in its own preflight (re-validation, credential) right after its lease
    never reached dispatch: it was no attempt, so the budget its lease took is given back (seed:
    "Store the retry budget in the action record" -- a budget of attempts).  The lease is where
    the budget is taken and checked, so no writer can reach dispatch around it.  The first
    attempt (generation 0, counted at ACTION_ACCEPTED) refused in its preflight was no attempt
    either: with ``budget = 1`` an APPROVAL_LIMIT refusal (nothing asked, nothing sent) would
    otherwise spend the whole budget, turn its ``backoff`` into ``after_correction`` -- there is
    nothing to correct: the caller waits for a slot -- and refuse the same-key retry its hint
    promises."""
    if p._state in _RETRY_PREFLIGHT and p._budget_used > 0:
        p._budget_used -= 1


def _on_approval_requested(p: Projector, event: Event) -> None:
    attrs = event.attrs
    fingerprint, expires = attrs.get("fingerprint"), attrs.get("expires_at")
    if type(fingerprint) is not str or not fingerprint:
        _refuse(p, event, "attrs.fingerprint must name the approval fingerprint")
    if not _is_number(expires):
        _refuse(p, event, "attrs.expires_at must be a number")
    # -- validated: apply --
    p._evidence["approval"] = {
        "state": "requested",
        "fingerprint": fingerprint,
        "expires_at": expires,
        "version": attrs.get("version"),
        "requested_seq": event.seq,
    }
    if "credential" in attrs:  # a record written before the reference was sealed instead
        p._evidence["approval"]["credential"] = attrs["credential"]
    p._code = _APPROVAL_PENDING  # not an error: what the caller is told while it waits
    p._message = None
    p._field = None


def _decided(p: Projector, event: Event, state: str) -> dict[str, Any]:
    """The approval evidence with an operator's decision added (a new dict: see Projector)."""
    return {
        **p._evidence["approval"],
        "state": state,
        "operator": event.attrs.get("operator"),
        "note": event.attrs.get("note"),
        "decided_seq": event.seq,
    }


def _on_approval_granted(p: Projector, event: Event) -> None:
    requested = p._evidence["approval"]["fingerprint"]
    if event.attrs.get("fingerprint") != requested:
        # The grant names what the operator saw; anything else approves nothing.
        _refuse(p, event, f"attrs.fingerprint must be the requested {requested}")
    p._evidence["approval"] = _decided(p, event, "granted")
    p._code = None


def _on_approval_denied(p: Projector, event: Event) -> None:
    code = _phase_code(p, event, _CREDENTIAL_INJECTION)
    p._evidence["approval"] = _decided(p, event, "denied")
    _set_error(p, event, code)


def _on_credential(p: Projector, event: Event) -> None:
    attrs = event.attrs
    gen = attrs.get("generation")
    if gen is not None and (type(gen) is not int or gen != p._generation):
        _stale(p, event, gen)
    cred = {}
    for k in ("credential", "version", "inject"):  # never the secret itself
        if k in attrs:
            cred[k] = attrs[k]
    p._evidence["credential"] = cred


def _add_setup_attempt(p: Projector, event: Event) -> None:
    p._attempts.append(
        {
            "n": len(p._attempts) + 1,
            "generation": p._generation,
            "stage": event.attrs.get("stage"),
            "outcome": _NOT_ATTEMPTED,
            "code": event.attrs.get("code"),
        }
    )


def _on_setup_attempt(p: Projector, event: Event) -> None:
    gen = event.attrs.get("generation")
    if gen is not None and (type(gen) is not int or gen != p._generation):
        _stale(p, event, gen)
    _phase_code(p, event, _CONNECTION_SETUP)
    _add_setup_attempt(p, event)


def _on_setup_failed(p: Projector, event: Event) -> None:
    gen = event.attrs.get("generation")
    if gen is not None and (type(gen) is not int or gen != p._generation):
        _stale(p, event, gen)
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
    if p._state == "credential_failed":
        code = p._code
        if code is None or CODES[code].retry is not Retry.BACKOFF:
            # Only a refusal that asks to back off (APPROVAL_LIMIT) is retried under the same
            # invocation; a missing or unusable credential must be corrected first.
            _refuse(p, event, "a credential refusal is retried only when its code says backoff")
    p._generation = gen
    p._budget_used += 1
    p._evidence["lease"] = _lease_evidence(event, gen, event.attrs.get("expires_at"))


def _lease_evidence(event: Event, gen: int, expires: object) -> dict[str, Any]:
    """``evidence.lease``: the current attempt's lease -- its generation, holder, event and
    deadline (``expires_at``, in the journal's lease clock; absent when the event has none).
    While the record rests in no final state, the deadline says until when a live attempt
    holds the invocation: a same-key call answers IN_PROGRESS until then, and only after it
    may recovery close the attempt (docs/contract.md, "When the hint is computed")."""
    lease = {"generation": gen, "holder": event.attrs.get("holder"), "seq": event.seq}
    if _is_number(expires):
        lease["expires_at"] = expires
    return lease


def _on_dispatch_lease(p: Projector, event: Event) -> None:
    gen = event.attrs.get("generation")
    if not _is_int(gen) or gen <= p._generation:
        _refuse(p, event, f"lease generation must exceed {p._generation}")
    # No budget is spent: the approved invocation has not been attempted yet.
    p._generation = gen
    p._evidence["lease"] = _lease_evidence(event, gen, event.attrs.get("expires_at"))


_PER_ATTEMPT_FACTS = (
    "status",
    "exit_status",
    "exit_signal",
    "response_sha256",
    "steps",
    "evidence_from",
    "result_size_limit",
)
_DISPATCH_FACTS = ("connection", "reused_connection", "peer", "hop")
# The same as sets: one C-level ``isdisjoint`` skips the loops when nothing is there (a first
# dispatch has no per-attempt facts yet).
_PER_ATTEMPT_SET, _DISPATCH_SET = frozenset(_PER_ATTEMPT_FACTS), frozenset(_DISPATCH_FACTS)
_NEW_ATTEMPT: dict[str, Any] = {
    "dispatch_started": True,
    "dispatch_seq": None,
    "request_complete": False,
    "response_headers_received": False,
    "response_complete": False,
}
"""What a dispatch sets in the evidence, in this order (``dispatch_seq`` is the event's)."""


def _on_dispatch(p: Projector, event: Event) -> None:
    attrs = event.attrs
    gen = attrs.get("generation", p._generation)
    if (type(gen) is not int and not _is_int(gen)) or gen != p._generation:
        _refuse(
            p, event, f"stale generation {gen}; the current lease generation is {p._generation}"
        )
    # A new attempt: per-attempt flags start over; dispatch_started never goes back.
    ev = p._evidence
    ev.update(_NEW_ATTEMPT)
    ev["dispatch_seq"] = event.seq
    if not ev.keys().isdisjoint(_PER_ATTEMPT_SET):
        for k in _PER_ATTEMPT_FACTS:
            if k in ev:
                del ev[k]
    if not attrs.keys().isdisjoint(_DISPATCH_SET):
        for k in _DISPATCH_FACTS:
            if k in attrs:
                ev[k] = attrs[k]
    p._code = None
    p._message = None
    p._field = None
    p._retry_after = None
    attempts = p._attempts
    attempts.append(
        {
            "n": len(attempts) + 1,
            "generation": p._generation,
            "stage": "dispatch",
            "outcome": _UNKNOWN,
            "code": None,
            "seq": event.seq,
        }
    )


def _on_request_sent(p: Projector, event: Event) -> None:
    gen = event.attrs.get("generation")
    if gen is not None and (type(gen) is not int or gen != p._generation):
        _stale(p, event, gen)
    p._evidence["request_complete"] = True


def _on_response_started(p: Projector, event: Event) -> None:
    gen = event.attrs.get("generation")
    if gen is not None and (type(gen) is not int or gen != p._generation):
        _stale(p, event, gen)
    ev = p._evidence
    ev["response_headers_received"] = True
    if "status" in event.attrs:
        ev["status"] = event.attrs["status"]


_RESULT_FACTS = (
    "status",
    "exit_status",
    "exit_signal",
    "response_sha256",
    "remote_request_id",
    "redirect_not_followed",
)


def _on_complete(p: Projector, event: Event) -> str:
    attrs = event.attrs
    gen = attrs.get("generation")
    if gen is not None and (type(gen) is not int or gen != p._generation):
        _stale(p, event, gen)
    raw = attrs.get("outcome")
    outcome = _RESOLVED_BY_VALUE.get(raw) if type(raw) is str else None
    if outcome is None:
        _refuse(p, event, "attrs.outcome must be rejected or committed")
    ra = attrs.get("retry_after")
    if ra is not None and not _is_number(ra):
        _refuse(p, event, "attrs.retry_after must be a non-negative number of seconds")
    if event.source is not _REMOTE_RESPONSE:
        _refuse(p, event, "a complete result must come from remote_response")
    hop = attrs.get("evidence_from")
    if hop is not None:  # a call only when there is one to check (most results name none)
        hop = _evidence_from(p, event)
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
    if hop is not None:
        ev["evidence_from"] = hop
    _set_error(p, event, code)
    p._retry_after = float(ra) if ra is not None else None
    attempts = p._attempts
    if attempts and attempts[-1]["stage"] == "dispatch":  # the attempt learns its outcome
        attempt = attempts[-1]
        attempt["outcome"] = raw
        attempt["code"] = raw_code
    return cast(str, raw)


def _on_interrupted(p: Projector, event: Event) -> None:
    gen = event.attrs.get("generation")
    if gen is not None and (type(gen) is not int or gen != p._generation):
        _stale(p, event, gen)
    code = _code_of(event)
    if code not in _INTERRUPT_CODES:
        _refuse(p, event, "attrs.code must be one of " + ", ".join(sorted(_INTERRUPT_CODES)))
    hop = event.attrs.get("evidence_from")
    if hop is not None:
        hop = _evidence_from(p, event)
    over = _result_size_limit(p, event, code)
    _set_error(p, event, code)
    p._evidence["source"] = _SOURCE[event.source]
    if hop is not None:
        p._evidence["evidence_from"] = hop
    if over is not None:
        p._evidence["result_size_limit"] = over
    attempts = p._attempts
    if attempts and attempts[-1]["stage"] == "dispatch":
        attempts[-1]["code"] = event.attrs.get("code")


def _result_size_limit(p: Projector, event: Event, code: Code | None) -> Mapping[str, Any] | None:
    """attrs.result_size_limit: the evidence RESULT_SIZE_LIMIT stands on, and only it -- the
    target's ``max_result`` and the bytes received past it (``decoded_bytes`` too when a body
    was decoded before it was stored)."""
    value = event.attrs.get("result_size_limit")
    if code is not Code.RESULT_SIZE_LIMIT:
        if value is not None:
            _refuse(p, event, "attrs.result_size_limit goes only with RESULT_SIZE_LIMIT")
        return None
    if not _is_mapping(value) or not all(
        _is_int(value.get(k)) and value[k] >= 0 for k in ("limit", "received_bytes")
    ):
        _refuse(p, event, "RESULT_SIZE_LIMIT needs attrs.result_size_limit {limit, received_bytes}")
    return value


_HOPS = frozenset({"origin", "proxy"})


def _evidence_from(p: Projector, event: Event) -> Mapping[str, Any] | None:
    """attrs.evidence_from: which hop produced the evidence (seed: "Record which hop produced
    the evidence"), as ``{"hop": "origin" | "proxy", "proxy"?, "status"?, "proxy_status"?}``."""
    value = event.attrs.get("evidence_from")
    if value is None:
        return None
    if not _is_mapping(value) or value.get("hop") not in _HOPS:
        _refuse(p, event, 'attrs.evidence_from must be an object whose hop is "origin" or "proxy"')
    return value


def _on_result_committed(p: Projector, event: Event) -> None:
    gen = event.attrs.get("generation")
    if gen is not None and (type(gen) is not int or gen != p._generation):
        _stale(p, event, gen)
    p._evidence["result"] = {
        "seq": event.seq,
        "sha256": event.attrs.get("sha256"),
        "chunks": event.attrs.get("chunks"),
    }


def _on_store_failed(p: Projector, event: Event) -> None:
    gen = event.attrs.get("generation")
    if gen is not None and (type(gen) is not int or gen != p._generation):
        _stale(p, event, gen)
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


def _observed(p: Projector, event: Event) -> None:
    """Refuse a second observer's event that names a generation other than the record's current
    one.  A reconciliation reads the record, observes the remote (a query is a whole remote
    call; an operator inspects it), then appends what it found, naming the generation it read
    (``attrs.generation``; absent in journals written before it did, and then unchecked).  A
    retry that took a lease in between -- and may have dispatched, and applied the effect -- is
    not what was observed: the observation must not close it, nor speak for it."""
    gen = event.attrs.get("generation")
    if gen is not None and (type(gen) is not int or gen != p._generation):
        _refuse(
            p,
            event,
            f"observed generation {gen}; the current lease generation is {p._generation} "
            "(the invocation was retried since)",
        )


def _on_reconciled(p: Projector, event: Event) -> str:
    _observed(p, event)
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
    for key in ("query_invocation", "operator", "matched"):
        if key in event.attrs:
            ev["reconciliation"][key] = event.attrs[key]
    ev["source"] = _SOURCE[event.source]
    p._code = None if outcome is _COMMITTED else _REMOTE_REJECTED
    p._message = event.attrs.get("message")
    return raw


def _on_reconcile_inconclusive(p: Projector, event: Event) -> None:
    _observed(p, event)
    query = event.attrs.get("query_invocation")
    if type(query) is not str or not query:
        _refuse(p, event, "attrs.query_invocation must name the query's invocation")
    item = {
        "query_invocation": query,
        "code": event.attrs.get("code"),
        "reason": event.attrs.get("reason"),
        "seq": event.seq,
    }
    not_before = event.attrs.get("not_before")
    if not_before is not None:  # an absent finding too soon after the attempt (settle.py)
        if type(not_before) not in (int, float):
            _refuse(p, event, "attrs.not_before must be a time in seconds since the epoch")
        item["not_before"] = not_before
    ev = p._evidence
    ev["reconcile_queries"] = [*ev.get("reconcile_queries", ()), item]


_LISTS = frozenset({"steps", "stale_workers", "reconcile_queries"})
"""Evidence fields holding lists: a protocol's facts cannot be merged into them."""


def _on_observed(p: Projector, event: Event) -> None:
    attrs = event.attrs
    gen = attrs.get("generation")
    if gen is not None:
        if type(gen) is not int or gen != p._generation:
            _stale(p, event, gen)
        # The lifecycle takes PROTOCOL_OBSERVED in every state (a diagnostic); an attempt's
        # other events only while it is open, so only here can a closed one's arrive.
        if p._state in _CLOSED:
            _closed(p, event, gen)
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


def _fenced(rule: Rule) -> Rule:
    """``rule``, first refusing a stale generation (``_stale``): for the rarer kinds an attempt
    writes, whose rules live in ``batch.py`` and ``operation.py``."""

    def fenced(p: Projector, event: Event) -> str | None:
        gen = event.attrs.get("generation")
        if gen is not None and (type(gen) is not int or gen != p._generation):
            _stale(p, event, gen)
        return rule(p, event)

    return fenced


RULES: Mapping[EventKind, Rule] = {
    E.ACTION_ACCEPTED: _on_accepted,
    E.PREFLIGHT_VALIDATED: _on_validated,
    E.PREFLIGHT_FAILED: _on_preflight_failed,
    E.APPROVAL_REQUESTED: _on_approval_requested,
    E.APPROVAL_GRANTED: _on_approval_granted,
    E.APPROVAL_DENIED: _on_approval_denied,
    E.DISPATCH_LEASE_ACQUIRED: _on_dispatch_lease,
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
    E.RECONCILE_INCONCLUSIVE: _on_reconcile_inconclusive,
    E.PROTOCOL_OBSERVED: _on_observed,
    E.LEASE_LOST: _on_lease_lost,
    **OPERATION_RULES,
    E.BATCH_ITEMS_RECORDED: _fenced(on_items_recorded),
    E.OPERATION_ACCEPTED: _fenced(OPERATION_RULES[E.OPERATION_ACCEPTED]),
}
"""Each kind's rule: checks that refuse before any change, then the effect."""

SPLITTING = frozenset({E.REMOTE_RESPONSE_COMPLETE, E.RECONCILED})
"""Kinds whose rule returns the outcome that picks a split destination."""
