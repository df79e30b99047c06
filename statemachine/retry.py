"""Retry hints and ``decide()``.

Seed, "Retry code must be simple and testable": the hint is derived from the evidence (state,
outcome, code), the operation's semantics (idempotent *by configuration*, not by method name),
the configured remote idempotency contract and its retention, Retry-After and the remaining
budget.  It is never derived from an exception's text — no function here sees an exception.

``decide()`` is the seed's pseudocode, line for line.  Automation may add rate limits on top of it,
but it must not upgrade an unsafe hint.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from .contract import CODES, Code, Outcome, Retry

if TYPE_CHECKING:
    from .record import Record

__all__ = [
    "Decision",
    "Operation",
    "compute_retry",
    "decide",
    "key_moment",
    "send_window",
    "static_retry_hint",
    "within_send_window",
]

RETENTION_MARGIN_S = 60.0
"""Stop retrying with the same key this long before the remote forgets it (seed: "stop automatic
retries before it arrives, and then perform reconciliation")."""


class Decision(StrEnum):
    FETCH = "FETCH"
    RETRY_NEW_ATTEMPT = "RETRY_NEW_ATTEMPT"
    STOP_FOR_CORRECTION = "STOP_FOR_CORRECTION"
    RETRY_SAME_KEY = "RETRY_SAME_KEY"
    RECONCILE = "RECONCILE"
    RETRY_WHEN_ALLOWED = "RETRY_WHEN_ALLOWED"
    RETURN_RECORDED_RESULT = "RETURN_RECORDED_RESULT"


@dataclass(frozen=True, slots=True)
class Operation:
    """What the caller is about to (re)do: its configured semantics and its fingerprint."""

    idempotent: bool
    fingerprint: str | None = None


def decide(record: Record, operation: Operation) -> Decision:
    """The seed's ``decide(record, operation)``, exactly."""
    if record.retry == Retry.FETCH_RESULT:
        return Decision.FETCH

    if record.outcome == Outcome.NOT_ATTEMPTED:
        if record.retry == Retry.BACKOFF:
            return Decision.RETRY_NEW_ATTEMPT
        return Decision.STOP_FOR_CORRECTION

    if record.outcome == Outcome.UNKNOWN:
        if operation.idempotent:
            return Decision.RETRY_NEW_ATTEMPT
        if (
            record.retry == Retry.SAME_IDEMPOTENCY_KEY
            and operation.fingerprint == record.fingerprint
        ):
            return Decision.RETRY_SAME_KEY
        return Decision.RECONCILE

    if record.outcome == Outcome.REJECTED and record.retry == Retry.BACKOFF:
        return Decision.RETRY_WHEN_ALLOWED

    return Decision.RETURN_RECORDED_RESULT


@dataclass(frozen=True, slots=True)
class HintInputs:
    """Everything ``compute_retry`` may look at — and nothing else."""

    state: str
    outcome: Outcome
    code: Code | None
    idempotent: bool
    key_expires_at: float | None
    """When the remote forgets the idempotency key; None when there is no usable key."""
    has_key: bool
    retry_after: float | None
    """Seconds the remote asked to wait (Retry-After), if it said."""
    max_retry_after: float
    budget_left: int
    now: float
    deliverable: bool
    """Whether a read can deliver the stored result: the record names its requester
    (``Record.requester``).  One naming none (an older record's) is delivered to no one, so a
    failed delivery of it is not sent to fetch it (``static_retry_hint``)."""
    send_window: float = 0.0
    """How long a retry taken at ``now`` may still send (its lease with the target's default
    timeout: ``timeout.total + lease_margin``, recorded at acceptance); 0 for a record written
    before it was recorded.  The key must stay usable until the window ends."""


def compute_retry(h: HintInputs) -> Retry:
    """The retry hint for a record; see docs/contract.md for the table this implements."""
    return retry_hint(
        h.state,
        h.outcome,
        h.code,
        h.idempotent,
        h.key_expires_at,
        h.has_key,
        h.retry_after,
        h.max_retry_after,
        h.budget_left,
        h.now,
        h.send_window,
        deliverable=h.deliverable,
    )


def static_retry_hint(
    state: str, outcome: Outcome, code: Code | None, *, deliverable: bool
) -> Retry | None:
    """The hint when the state, its outcome, the code and ``deliverable`` alone decide it; None
    when it also depends on the operation's semantics, the idempotency key's retention,
    Retry-After, the budget or the clock.  ``retry_hint`` starts here, and the projection
    tabulates it once per (state, code, deliverable) so that building a record looks the
    common cases up instead of deriving them."""
    if state.startswith("delivery_failed_") and deliverable:
        # Seed: "keep outcome=committed or rejected, and set retry=fetch_result".  Not of a
        # record naming no requester: no read delivers it, so "fetch it" would be asked again
        # after every fetch -- its hint is its stored result's (as ``stored_*``: no rule below
        # names a delivery_failed_* state), as another uid's read shows it
        # (``engine.delivery.read_by_another``).
        return Retry.FETCH_RESULT
    if state.startswith("store_failed_"):
        # Seed: what needs fixing is storage, "not a retry of the remote action".
        return Retry.NEVER
    if state == "reconciled_committed":
        return Retry.NEVER
    if state == "reconciled_rejected":
        return Retry.AFTER_CORRECTION
    if state == "retry_invalid":
        # A value bound to the invocation (config snapshot, credential version) changed before a
        # retry.  Seed: "create a new invocation; do not edit the previous record" — and a new
        # one is only safe once the earlier, unknown attempt has been reconciled.
        return Retry.RECONCILE

    if outcome == Outcome.NOT_ATTEMPTED:
        if code is None:
            return Retry.NEVER  # not finished yet; nothing to retry
        info = CODES[code]
        # A stop cause (CALLER_CANCELLED, BROKER_SHUTDOWN) that struck before dispatch takes
        # its before-dispatch hint; its default one is for an unknown outcome.
        base = info.before_dispatch if info.outcome is not Outcome.NOT_ATTEMPTED else None
        base = base or info.retry
        return None if base == Retry.BACKOFF else base  # backoff needs budget left

    if outcome == Outcome.UNKNOWN:
        return None  # the three safe paths depend on the operation and the budget

    if code is None:
        return Retry.NEVER  # a complete success: use it
    if code == Code.REMOTE_THROTTLED:
        return None  # depends on safety, Retry-After and the budget
    return CODES[code].retry


def retry_hint(
    state: str,
    outcome: Outcome,
    code: Code | None,
    idempotent: bool,
    key_expires_at: float | None,
    has_key: bool,
    retry_after: float | None,
    max_retry_after: float,
    budget_left: int,
    now: float,
    send_window: float = 0.0,
    *,
    deliverable: bool,
) -> Retry:
    """``compute_retry`` with positional inputs: the projection calls it once per record and
    building a ``HintInputs`` there cost more than the rules themselves."""
    hint = static_retry_hint(state, outcome, code, deliverable=deliverable)
    if hint is not None:
        return hint

    if outcome == Outcome.NOT_ATTEMPTED:
        # a backoff code before dispatch: only while the budget lasts
        return Retry.AFTER_CORRECTION if budget_left <= 0 else Retry.BACKOFF

    if outcome == Outcome.UNKNOWN:
        proven = CODES[code].when_idempotent if code is not None else None
        if proven is not None:
            # Evidence that the identical request meets the same end (CodeInfo.when_idempotent):
            # backoff would only repeat it until the budget is spent.  A non-idempotent one
            # may have acted and has no same-key path either: under the remote's deduplication
            # contract a same-key resend gets back the first result the remote stored -- the
            # one past the limit -- so only reconciliation leads out of unknown.
            return proven if idempotent else Retry.RECONCILE
        return _unknown_hint(idempotent, has_key, key_expires_at, budget_left, now + send_window)

    # REMOTE_THROTTLED.  Seed: "may permit backoff if the method is safe to retry and the
    # response specifies a suitable time".  Without either, the caller must look before
    # sending again.
    safe = idempotent or _key_usable(has_key, key_expires_at, now + send_window)
    # Seed: backoff only if "the response specifies a suitable time" — no Retry-After, no
    # backoff: the caller must look before sending again.
    timely = retry_after is not None and retry_after <= max_retry_after
    if safe and timely and budget_left > 0:
        return Retry.BACKOFF
    return Retry.RECONCILE


def send_window(idempotency: Mapping[str, Any] | None) -> float:
    """The send window recorded with an invocation's idempotency contract (``HintInputs``);
    0 when none was recorded (a record written before it was, a key without a remote
    contract): the key is then judged at the moment itself, as it was."""
    window = idempotency.get("send_window") if idempotency else None
    return float(window) if window is not None else 0.0


def key_moment(idempotency: Mapping[str, Any] | None, now: float, elapsed: float | None) -> float:
    """The moment an idempotency key is judged at when the clock reads ``now``: the key's age
    by the wall clock alone can be undone by a step back (an NTP step, a VM restored), which
    re-opened a retention window the remote had already closed -- a same-key resend, a second
    effect.  The key was bound at ``expires_at - retention_s`` (by the clock ``now`` is read
    from: the database's on a shared journal); ``elapsed``: seconds since then by a clock that
    does not step (``journal/boot.py``: the boot clock, on the boot that bound it; None
    otherwise).  The key is then at least that old: the later of ``now`` and the binding plus
    ``elapsed``.  A ``now`` before the binding is a clock stepped back past it: how much of
    the retention is left is unknown, so infinity (no hint resting on the key; ``reconcile``).
    A record naming no retention (an older one) is judged at ``now``, as before."""
    if not idempotency:
        return now
    expires, retention = idempotency.get("expires_at"), idempotency.get("retention_s")
    if not isinstance(expires, (int, float)) or not isinstance(retention, (int, float)):
        return now
    if isinstance(expires, bool) or isinstance(retention, bool):
        return now
    bound = float(expires) - float(retention)
    if now < bound - CLOCK_ROUNDING_S:
        return math.inf
    return now if elapsed is None else max(now, bound + elapsed)


CLOCK_ROUNDING_S = 0.001
"""How far ``now`` may read before a key's binding moment and still be taken for it: that moment
is recomputed as ``expires_at - retention_s``, which rounds."""


def within_send_window(
    record: Record, now: float, window: float, moment: float | None = None
) -> Record:
    """``record`` with the hints that rest on its idempotency key judged for a retry whose lease
    is ``window`` seconds from ``now`` -- the lease a same-key retry takes under the current
    settings (``[service] lease_margin`` raised since the record was accepted: longer than the
    ``send_window`` it recorded) -- and at ``moment`` (``key_moment``: the key's age by a clock
    that does not step) when that is later than ``now``.  ``journal/leases.py`` refuses a
    same-key lease the key could not outlast, judged by that current lease and that moment; a
    hint judged by the shorter recorded window, or by a wall clock stepped back, would invite
    exactly that refused retry.  Only ever more conservative: a hint that needs the key usable
    (``same_idempotency_key``; ``backoff`` of a throttled, non-idempotent request) becomes
    ``reconcile`` when the key would not outlast ``window``; a window no longer than the
    recorded one at ``now`` itself changes nothing (the record's own hint already judged it)."""
    idem = record.idempotency
    at = now if moment is None else max(now, moment)
    if idem is None or (window <= send_window(idem) and at <= now):
        return record
    expires = idem.get("expires_at")
    end = at + max(window, send_window(idem))
    if expires is None or _key_usable(True, float(expires), end):
        return record
    retry = _without_key(record.retry, record.code, record.idempotent)
    items = record.items
    if items is not None:
        items = tuple(
            {**i, "retry": _without_key(Retry(i["retry"]), _code(i), record.idempotent).value}
            for i in items
        )
    if retry is record.retry and items == record.items:
        return record
    return replace(record, retry=retry, items=items)


def _code(item: Mapping[str, Any]) -> Code | None:
    raw = item.get("code")
    return Code(raw) if isinstance(raw, str) else None


def _without_key(retry: Retry, code: Code | None, idempotent: bool) -> Retry:
    """``retry`` once the idempotency key no longer makes a resend safe: the hints that only a
    usable key gave (rules 5 and 7 of docs/contract.md) become ``reconcile``."""
    if retry is Retry.SAME_IDEMPOTENCY_KEY:
        return Retry.RECONCILE
    if retry is Retry.BACKOFF and code is Code.REMOTE_THROTTLED and not idempotent:
        return Retry.RECONCILE
    return retry


def _key_usable(has_key: bool, key_expires_at: float | None, now: float) -> bool:
    """Whether the key is still usable at ``now`` -- for a hint, the end of the send window of
    a retry taken now: the remote checks the key when the request arrives, and a retry may
    send at any moment its lease runs (journal/leases.py refuses one whose lease could outlive
    the key; a hint that promised it would claim more than the broker then does)."""
    if not has_key:
        return False
    return key_expires_at is None or now < key_expires_at - RETENTION_MARGIN_S


def _unknown_hint(
    idempotent: bool, has_key: bool, key_expires_at: float | None, budget_left: int, now: float
) -> Retry:
    # The three safe paths out of unknown (seed, "Idempotency is defined by the remote contract").
    if budget_left <= 0:
        return Retry.RECONCILE
    if idempotent:
        return Retry.BACKOFF
    if _key_usable(has_key, key_expires_at, now):
        return Retry.SAME_IDEMPOTENCY_KEY
    return Retry.RECONCILE
