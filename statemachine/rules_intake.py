"""The rules of an invocation's way to its dispatch gate: acceptance, preflight validation,
approval, the credential and connection setup (DESIGN, "two machines": the lifecycle's states
before ``dispatched``).  Nothing here has crossed the dispatch boundary, so every failure these
rules record is ``not_attempted`` by construction of the lifecycle table.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from .batch import check_batch
from .contract import Code
from .events import Event
from .record import FENCE_RULES
from .rules_common import (
    _APPROVAL_PENDING,
    _CONNECTION_SETUP,
    _CREDENTIAL_INJECTION,
    _FENCED,
    _FENCED_CLOSE,
    _NOT_ATTEMPTED,
    _VALIDATION,
    DEFAULT_BUDGET,
    DEFAULT_MAX_RETRY_AFTER,
    _asked_by,
    _is_int,
    _is_mapping,
    _is_number,
    _lease_evidence,
    _phase_code,
    _refuse,
    _set_error,
    _stale,
)

if TYPE_CHECKING:
    from .projection import Projector

_RETRY_PREFLIGHT = frozenset({"validated", "retry_pending"})
"""States a retry (generation > 0) is in between its lease and its dispatch."""

_BEFORE_GATE = _RETRY_PREFLIGHT | {"accepted", "authorized"}
"""States an attempt ends SETUP_FAILED from with no DISPATCH_STARTED in its generation (the
table has no SETUP_FAILED after it: a dispatched attempt ends ATTEMPT_INTERRUPTED); in
``accepted``, a new call stopped while it waited for its key's binder."""

_STOPS = frozenset({Code.CALLER_CANCELLED, Code.BROKER_SHUTDOWN})
"""Setup-failure codes that are a stop, not the target's answer: the caller withdrew the call
(it hung up) or the broker stopped it, before its dispatch gate, nothing sent.  A refused
connection, a failed handshake, a DNS or proxy failure is the target tried and failing: an
attempt against it, which the budget bounds (seed: "Limit the number of attempts")."""

_RECOVERY_STOPS = frozenset({"broker_stopped", "lease_lapsed"})
"""Stages of recovery's SETUP_FAILED (code SETUP_FAILED) for an attempt whose worker stopped
(the broker stopped, or its lease ran out) before its dispatch gate: DISPATCH_STARTED is a
durable barrier before the first byte, so its absence in the generation proves nothing was
sent -- the same stop as a graceful BROKER_SHUTDOWN at that point."""

_WITHDRAWN_RETRY = {
    Code.CALLER_CANCELLED: "This retry was withdrawn (its caller hung up or its deadline passed)",
    Code.BROKER_SHUTDOWN: "This retry was stopped by the broker's shutdown",
}
"""The message of a retry's stop before its gate after an earlier attempt's dispatch: not the
code's generic meaning, whose "not_attempted" would read as the whole invocation's."""


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
    fenced = attrs.get("fenced")
    if fenced is not None:
        if not _is_mapping(fenced):
            _refuse(p, event, "fenced must be an object")
        if "rules" not in fenced:
            # A fence written before its rules (``FENCE_RULES``): its binder's rows may have
            # landed after it -- honestly -- and the record is read for what they prove.
            fenced = None
        elif type(fenced["rules"]) is not int or fenced["rules"] != FENCE_RULES:
            _refuse(p, event, f"fenced.rules must be {FENCE_RULES}")
    # -- validated: apply --
    p._batch = batch
    p._fenced = (
        None
        if fenced is None
        else MappingProxyType({k: v for k, v in fenced.items() if k != "rules"})
    )
    p._session = attrs.get("session")
    _asked_by(p, event)
    p._target = target
    p._protocol = protocol
    p._idempotent = bool(op.get("idempotent", False))
    p._idempotent_recorded = "idempotent" in op
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
    if p._fenced is not None:
        # Its binder's preamble after its refused ACTION_ACCEPTED (rows of one write are
        # folded one by one): once, it went on to its dispatch in the fenced record and sent.
        _refuse(p, event, _FENCED)
    if "config_hash" in event.attrs:
        p._evidence["config_hash"] = event.attrs["config_hash"]


def _on_preflight_failed(p: Projector, event: Event) -> None:
    gen = event.attrs.get("generation")
    if gen is not None:
        if type(gen) is not int or gen != p._generation:
            _stale(p, event, gen)
        if p._fenced is not None:  # an attempt's gate: its binder's, its first event refused
            _refuse(p, event, _FENCED)
    code = _phase_code(p, event, _VALIDATION)  # validated before anything changes
    if p._fenced is not None and (
        code is not Code.IDEMPOTENCY_MISMATCH or event.attrs.get("binder_gone") != dict(p._fenced)
    ):
        _refuse(p, event, _FENCED_CLOSE)
    bound_to = event.attrs.get("bound_to")
    if bound_to is not None and type(bound_to) is not str:
        _refuse(p, event, "bound_to must be a string")
    _refund_refused_retry(p)
    _set_error(p, event, code)
    if bound_to is not None:
        # The invocation the refused call's idempotency key is bound to (CONFIG_CHANGED): a
        # field the caller acts on, not a name to parse out of the message.
        p._evidence["idempotency"] = {
            **(p._evidence.get("idempotency") or {}),
            "bound_to": bound_to,
        }


def _on_credential_failed(p: Projector, event: Event) -> None:
    gen = event.attrs.get("generation")
    if gen is not None and (type(gen) is not int or gen != p._generation):
        _stale(p, event, gen)
    code = _phase_code(p, event, _CREDENTIAL_INJECTION)
    _refund_refused_retry(p)
    _set_error(p, event, code)


def _refund_refused_retry(p: Projector, before: frozenset[str] = _RETRY_PREFLIGHT) -> None:
    """A retry refused in its own preflight (re-validation, credential) right after its lease
    never reached dispatch: it was no attempt, so the budget its lease took is given back (seed:
    "Store the retry budget in the action record" -- a budget of attempts).  The lease is where
    the budget is taken and checked, so no writer can reach dispatch around it.  The first
    attempt (generation 0, counted at ACTION_ACCEPTED) refused in its preflight was no attempt
    either: with ``budget = 1`` an APPROVAL_LIMIT refusal (nothing asked, nothing sent) would
    otherwise spend the whole budget, turn its ``backoff`` into ``after_correction`` -- there is
    nothing to correct: the caller waits for a slot -- and refuse the same-key retry its hint
    promises.  ``before``: the states that are before the attempt's dispatch for the caller's
    event (a setup stop may also end an attempt in ``authorized``)."""
    if p._state in before and p._budget_used > 0:
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
    decided = _decided(p, event, "granted")
    if event.attrs.get("blind") is True:  # granted without the request read (approvals.decide)
        decided["blind"] = True
        decided["unreadable"] = event.attrs.get("unreadable")
    p._evidence["approval"] = decided
    p._code = None


def _on_approval_denied(p: Projector, event: Event) -> None:
    code = _phase_code(p, event, _CREDENTIAL_INJECTION)
    p._evidence["approval"] = _decided(p, event, "denied")
    _set_error(p, event, code)


def _on_approval_revoked(p: Projector, event: Event) -> None:
    """A grant taken back: the approval evidence says ``revoked``, by whom and why (the grant's
    own operator and note stay in its APPROVAL_GRANTED row), and the invocation ends as a
    denied one does."""
    code = _phase_code(p, event, _CREDENTIAL_INJECTION)
    p._evidence["approval"] = _decided(p, event, "revoked")
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
    if p._fenced is not None:
        # Its binder's, its preamble refused unawaited: it went on to connect, and its setup
        # failure (CONNECTION_REFUSED, backoff) closed the record -- every same-key retry was
        # answered so, never "use a new key".  Recovery closes it as the fence does.
        _refuse(p, event, _FENCED_CLOSE)
    gen = event.attrs.get("generation")
    if gen is not None and (type(gen) is not int or gen != p._generation):
        _stale(p, event, gen)
    code = _phase_code(p, event, _CONNECTION_SETUP)
    stop = _refunded_stop(p, event, code)
    if stop:
        # Withdrawn (the caller hung up), stopped (the broker's shutdown) or closed by
        # recovery (its worker stopped) before its gate, the target untried: no attempt, as a
        # refused preflight is none -- else another caller holding the key could spend an
        # unknown record's budget by hanging up, sending nothing, and turn its
        # ``same_idempotency_key`` into ``reconcile``.
        _refund_refused_retry(p, _BEFORE_GATE)
    _set_error(p, event, code)
    if stop and p._evidence.get("dispatch_started") is True:
        # The stop is this retry's, not the dispatched attempt's: its code's meaning ("nothing
        # was sent (connection_setup, not_attempted)") or recovery's "nothing was sent" would
        # read as the whole invocation's, beside an earlier attempt's outcome.
        p._message = _withdrawn_message(p, event, code)
    last = p._attempts[-1] if p._attempts else None
    if stop:
        # Consecutive refunded stops, whatever their stage or code, are one entry with a count,
        # across generations: they spend no budget, so only this keeps the record (and every
        # envelope listing its attempts) bounded whatever the number of withdrawals -- merging
        # only same-stage stops let a caller alternate the stage of its hang-up (idle,
        # connecting) and grow it one entry per withdrawal.
        if last is None or "repeated" not in last:
            _add_setup_attempt(p, event)
            last = p._attempts[-1]
            last["repeated"] = 0
            last["stops"] = []
        _count_stop(last, event)
        return
    # The final setup failure is itself an attempt unless it repeats the last recorded one.
    if (
        last is None
        or last.get("seq") is not None
        or last["generation"] != p._generation
        or (last["stage"], last["code"]) != (event.attrs.get("stage"), event.attrs.get("code"))
    ):
        _add_setup_attempt(p, event)


def _refunded_stop(p: Projector, event: Event, code: Code | None) -> bool:
    """Whether this SETUP_FAILED ends an attempt that sent nothing and tried no target: a stop
    (``_STOPS``, or recovery's close of a stopped worker, ``_RECOVERY_STOPS``) before the
    dispatch gate, with no SETUP_ATTEMPT_FAILED in this generation -- a refused connection
    try is the target tried, which spends its budget whatever stopped the attempt after it."""
    if p._state not in _BEFORE_GATE:
        return False
    if code not in _STOPS and not (
        code is Code.SETUP_FAILED and event.attrs.get("stage") in _RECOVERY_STOPS
    ):
        return False
    gen = p._generation
    for attempt in reversed(p._attempts):
        if attempt["generation"] != gen:
            break
        if "repeated" not in attempt and attempt.get("seq") is None:
            return False  # a setup try of this generation: the target was tried
    return True


_MAX_STOP_KINDS = 16
"""Rows of a run's per-(stage, code) breakdown.  The broker's own journal never reaches it: a
refunded stop's code is CALLER_CANCELLED or BROKER_SHUTDOWN with a stage among the protocol
tables' states before the gate (``attempt.machine.state``: idle, dns_resolved, tcp_connected,
proxy_tunnel_open, tls_established ...), or SETUP_FAILED with one of ``_RECOVERY_STOPS``; this
cap bounds the entry whatever a journal holds -- stops of further kinds count in ``repeated``
and in a last ``stage: null, code: null`` row."""


def _count_stop(run: dict[str, Any], event: Event) -> None:
    """Count a refunded stop in its run's entry: ``repeated`` (the total), ``stops`` (per
    stage and code, first seen first, bounded), ``stage``/``code`` (the latest stop's)."""
    stage, code = event.attrs.get("stage"), event.attrs.get("code")
    run["repeated"] += 1
    run["stage"], run["code"] = stage, code
    # A new list of new rows: a snapshot (``Projector.record``) copies each entry shallowly.
    stops = [dict(r) for r in run["stops"]]
    kinds = [(r["stage"], r["code"]) for r in stops]
    if (stage, code) not in kinds and len(stops) >= _MAX_STOP_KINDS - 1:
        stage = code = None  # the overflow row
    if (stage, code) in kinds:
        stops[kinds.index((stage, code))]["repeated"] += 1
    else:
        stops.append({"stage": stage, "code": code, "repeated": 1})
    run["stops"] = stops


_RECOVERY_RETRY = {
    "broker_stopped": "The broker stopped before this retry's dispatch gate",
    "lease_lapsed": "This retry's lease ran out before its dispatch gate",
}
"""Recovery's close of a retry stopped before its gate, after an earlier dispatch: recovery's
"nothing was sent" (older journals) would read as the whole invocation's."""


def _withdrawn_message(p: Projector, event: Event, code: Code | None) -> str:
    earlier = next((a for a in reversed(p._attempts) if a["stage"] == "dispatch"), None)
    outcome = earlier["outcome"] if earlier is not None else "unknown"
    who = _WITHDRAWN_RETRY.get(code) if code is not None else None
    if who is not None:
        return (
            f"{who} before its dispatch gate and sent nothing; the earlier attempt's outcome"
            f" ({outcome}) stands."
        )
    cause = _RECOVERY_RETRY.get(str(event.attrs.get("stage")), "This retry stopped")
    return (
        f"{cause}; this retry sent nothing, and the earlier attempt's outcome ({outcome}) stands."
    )
