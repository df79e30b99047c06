"""Batches: one outcome per item beside the parent's transport outcome.

Seed, "Dispatch shifts the burden of proof": "A batch request needs an outcome for each item.
If the broker sends five changes in one HTTP request and receives a complete response for only
four of them, a single retry hint cannot safely be assigned to the whole batch.  Record the
parent transport outcome and five child outcomes.  Retry only the item for which the records and
the remote contract permit it, or reconcile the batch as a whole if the remote API applies
changes atomically."

The items sent are bound with the invocation (ACTION_ACCEPTED's ``operation.batch``: their ids
and whether the remote applies them atomically).  Until a complete response gives them outcomes
of their own (BATCH_ITEMS_RECORDED, written by the protocol's reading of that response), every
item shares what the parent's record proves -- ``not_attempted`` before dispatch, ``unknown``
after it -- with the parent's code and retry hint: no item can be known better than the request
that carried it.  A parent resolved without item outcomes (its store failed, or the response
named none) leaves every item ``unknown``: the response did not say what happened to it --
unless the batch is atomic and a second observer settled the parent (RECONCILED): then every
item shares the reconciled outcome, with its ``source`` (the remote applied all or none).

A response that was no success (its REMOTE_RESPONSE_COMPLETE carries a code: a 4xx, a 5xx, a
redirect) gives no item more than the parent proves: each item it records is ``unknown`` /
``REMOTE_RESULT_INCOMPLETE`` / ``reconcile`` or -- under a rejection -- refused with the
parent's code, never with a status of its own nor a hint stronger than the parent's (audit
48b: a 401 whose body listed every item 200 recorded them committed / ``never`` under a parent
inviting a corrected resend).  The writer refuses any other; a row written before the rule is
folded as every item ``unknown`` -- what the parent proves, never more -- unless each of its
items is one the writer accepts, or refused with the parent's code beside the status it was
listed with (a refusal, as the code says: read as written) -- and, matched by position, the
list answered every item (each holds a status).  Beside an item such a parent does
not refuse, the record's hint is ``reconcile`` (``parent_retry``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from .contract import CODES, Code, EvidenceSource, Outcome, Phase, Retry
from .events import Event
from .rules_common import _refuse

if TYPE_CHECKING:
    from .projection import Projector

__all__ = ["ITEM_OUTCOMES", "check_batch", "items_view", "on_items_recorded", "parent_retry"]

ITEM_OUTCOMES: Final = frozenset({Outcome.REJECTED, Outcome.COMMITTED, Outcome.UNKNOWN})
"""What a complete response can say of one item (never ``not_attempted``: it was sent)."""
_OUTCOMES = {o.value: o for o in ITEM_OUTCOMES}
_CODES = {c.value: c for c in Code}
_RETRIES = {r.value for r in Retry}
_UNRESOLVED = (Outcome.NOT_ATTEMPTED, Outcome.UNKNOWN)
_THROTTLED = Code.REMOTE_THROTTLED.value
_RESENDS = (Retry.AFTER_CORRECTION, Retry.BACKOFF, Retry.SAME_IDEMPOTENCY_KEY)


def _mixed_atomic(batch: Mapping[str, Any], items: Sequence[Mapping[str, Any]]) -> bool:
    """An atomic batch whose items were neither all applied nor all refused: reconciled as a
    whole (seed: "reconcile the batch as a whole if the remote API applies changes
    atomically"), every item ``reconcile`` whatever its status."""
    if not batch["atomic"]:
        return False
    applied = all(i["outcome"] == "committed" and i["code"] is None for i in items)
    refused = all(i["outcome"] == "rejected" for i in items)
    return not (applied or refused)


def _is_id(value: object) -> bool:
    return (isinstance(value, str) and bool(value)) or (
        isinstance(value, int) and not isinstance(value, bool)
    )


def check_batch(p: Projector, event: Event, value: object) -> Mapping[str, Any]:
    """ACTION_ACCEPTED's ``operation.batch``: ``{"items": [id, ...], "atomic": bool}`` with
    distinct string or integer ids; refused otherwise.  Returns the fold's read-only view."""
    if not isinstance(value, Mapping):
        _refuse(p, event, "operation.batch must be an object")
    ids = value.get("items")
    if not isinstance(ids, list | tuple) or not all(_is_id(i) for i in ids):
        _refuse(p, event, "operation.batch.items must list string or integer item ids")
    if len(set(ids)) != len(ids):
        _refuse(p, event, "operation.batch.items must not repeat an id")
    atomic = value.get("atomic", False)
    if not isinstance(atomic, bool):
        _refuse(p, event, "operation.batch.atomic must be true or false")
    return MappingProxyType({"ids": tuple(ids), "atomic": atomic, "items": None, "seq": None})


def _check_item(p: Projector, event: Event, item: object, want_id: object) -> dict[str, Any]:
    if not isinstance(item, Mapping) or item.get("id") != want_id:
        _refuse(p, event, "attrs.items must give every item sent, in order, by its id")
    outcome = _OUTCOMES.get(item.get("outcome"))  # type: ignore[arg-type]
    if outcome is None:
        _refuse(p, event, "an item's outcome must be rejected, committed or unknown")
    raw_code = item.get("code")
    code = None if raw_code is None else _CODES.get(raw_code)
    if raw_code is not None and code is None:
        _refuse(p, event, "an item's code must be a known code")
    if code is None:
        if outcome is not Outcome.COMMITTED:
            _refuse(p, event, "only a committed item may go without a code")
    elif CODES[code].phase is not Phase.REMOTE_EXECUTION or CODES[code].outcome is not outcome:
        _refuse(p, event, f"{code.value} cannot classify a {outcome.value} item")
    if item.get("retry") not in _RETRIES:
        _refuse(p, event, "an item's retry must be a retry hint")
    out = {"id": want_id, "outcome": outcome.value, "code": raw_code, "retry": item["retry"]}
    if "status" in item:
        out["status"] = item["status"]
    return out


def _incomplete(item_id: object) -> dict[str, Any]:
    return {
        "id": item_id,
        "outcome": Outcome.UNKNOWN.value,
        "code": Code.REMOTE_RESULT_INCOMPLETE.value,
        "retry": Retry.RECONCILE.value,
    }


def _backed(parent: Code, item: Mapping[str, Any], writing: bool) -> bool:
    """Whether a complete response that was no success (``parent``: its code) backs ``item``:
    unknown, or -- under a rejection -- refused with the parent's code and a hint no stronger
    than the code's own (``reconcile`` for a throttled one).  Written now, it has no status of
    its own (the body of a refusal, or of a 500, speaks for no item); a row written before the
    rule gave a refused item the status it was listed with, and its code agreeing with the
    parent's says that status was a refusal too: it is read as written."""
    if dict(item) == _incomplete(item["id"]):
        return True
    return (
        CODES[parent].outcome is Outcome.REJECTED
        and item["outcome"] == Outcome.REJECTED.value
        and item["code"] == parent.value
        and item["retry"] in (CODES[parent].retry.value, Retry.RECONCILE.value)
        and not (writing and "status" in item)
    )


def _misplaced(ids: Sequence[object], items: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a row written before the rule (an item holds a status of its own) may have given
    an item another's status: the items were matched by position (their ids are 0, 1, ...)
    and some item has none -- the list was shorter than the items sent, and the reader then
    took its first entries as the first items' whatever the remote meant."""
    old = any("status" in i for i in items)
    positions = list(ids) == list(range(len(ids)))
    return old and positions and not all("status" in i for i in items)


def on_items_recorded(p: Projector, event: Event) -> None:
    batch = p._batch
    if batch is None:
        _refuse(p, event, "the invocation was not accepted as a batch")
    if event.source is not EvidenceSource.REMOTE_RESPONSE:
        _refuse(p, event, "item outcomes come from a complete remote_response")
    items = event.attrs.get("items")
    ids = batch["ids"]
    if not isinstance(items, list | tuple) or len(items) != len(ids):
        _refuse(p, event, "attrs.items must give every item sent")
    checked = tuple(
        MappingProxyType(_check_item(p, event, item, want))
        for item, want in zip(items, ids, strict=True)
    )
    parent = p._code
    if parent is not None and not all(_backed(parent, i, p._writing) for i in checked):
        if p._writing:
            _refuse(p, event, f"an item cannot say more than its parent's {parent.value}")
        # A row written before the rule: what the parent proves of each item, never more.
        checked = tuple(MappingProxyType(_incomplete(i)) for i in ids)
    elif parent is not None and _misplaced(ids, checked):
        checked = tuple(MappingProxyType(_incomplete(i)) for i in ids)
    # Only a complete result records them (the lifecycle allows it in ``completed_*`` alone),
    # and no dispatch follows one: they are the last attempt's for good.
    p._batch = MappingProxyType({**batch, "items": checked, "seq": event.seq})


def parent_retry(
    items: Sequence[Mapping[str, Any]], outcome: Outcome, code: Code | None, retry: Retry
) -> Retry:
    """The record's hint beside its items (``items_view``): ``retry``, unless a resolved
    response that was no success (``code``) stands beside an item it does not refuse (unknown:
    a 400 listing it 201) -- then ``reconcile`` in place of a hint that resends.  Seed: "a
    single retry hint cannot safely be assigned to the whole batch": the parent's
    ``after_correction`` would resend every item, the one that may have been applied too."""
    if retry not in _RESENDS or code is None or outcome in _UNRESOLVED:
        return retry  # fetch_result, never, reconcile: nothing is sent again
    return retry if all(i["outcome"] == "rejected" for i in items) else Retry.RECONCILE


def items_view(
    batch: Mapping[str, Any],
    outcome: Outcome,
    code: Code | None,
    retry: Retry,
    throttled: Callable[[], Retry],
    reconciled: str | None = None,
) -> tuple[Mapping[str, Any], ...]:
    """The record's items: recorded outcomes, else what the parent proves (module docstring).

    ``reconciled``: the source of the second observer that settled the parent (RECONCILED's
    ``remote_query`` or ``operator_attested``), or None.  An atomic batch settled so gives each
    item the parent's outcome, code and hint, with that ``source``; a batch the remote applies
    item by item is never settled as a whole (the reconciliation service refuses it,
    BATCH_NOT_ATOMIC), and one settled so before it did keeps every item ``unknown``.

    ``throttled``: the hint the whole request would get were it the one answered 429/503
    (``retry.retry_hint`` on this record: the operation's semantics, its idempotency key,
    Retry-After, the budget).  A ``REMOTE_THROTTLED`` item gets it -- one rule for one status,
    whether it answered the request or one item of it: resending a non-idempotent POST's item
    is no safer than resending the POST -- unless an atomic batch's mixed answer already made
    every item ``reconcile``."""
    recorded = batch["items"]
    if recorded is not None:
        if not any(i["code"] == _THROTTLED for i in recorded) or _mixed_atomic(batch, recorded):
            return tuple(recorded)
        hint = throttled().value
        return tuple(
            MappingProxyType({**i, "retry": hint}) if i["code"] == _THROTTLED else i
            for i in recorded
        )
    if outcome in _UNRESOLVED:
        shared = {"outcome": outcome.value, "code": code.value if code else None}
        return tuple({"id": i, **shared, "retry": retry.value} for i in batch["ids"])
    if reconciled is not None and batch["atomic"]:
        # Settled as a whole by a second observer: the remote applied all of the items or none
        # of them, so what was found of the effect is what happened to each.
        whole = {
            "outcome": outcome.value,
            "code": code.value if code else None,
            "retry": retry.value,
            "source": reconciled,
        }
        return tuple({"id": i, **whole} for i in batch["ids"])
    return tuple(
        {
            "id": i,
            "outcome": Outcome.UNKNOWN.value,
            "code": Code.REMOTE_RESULT_INCOMPLETE.value,
            "retry": Retry.RECONCILE.value,
        }
        for i in batch["ids"]
    )
