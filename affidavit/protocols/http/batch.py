"""The ``batch`` setting: how a target's batch requests name their items and its responses
report each item's result.

Seed: "A batch request needs an outcome for each item ... Record the parent transport outcome and
five child outcomes.  Retry only the item for which the records and the remote contract permit
it, or reconcile the batch as a whole if the remote API applies changes atomically."

The items sent are read from the request body when the invocation is accepted (``sent_items``),
so every item is known whatever happens after dispatch.  Only a *complete* response gives an item
an outcome of its own (``read_items``); the rules, per item status:

* in ``ok`` -> ``committed``, no code, retry ``never``;
* in ``rejected``, or an integer 400-499 -> ``rejected``, ``REMOTE_REJECTED``,
  ``after_correction`` (429 and 503: ``REMOTE_THROTTLED`` -- the remote refused the item and
  asked to slow down -- recorded ``reconcile``; the record gives it the hint a whole request
  answered 429/503 gets: ``backoff`` only for an idempotent method or a usable idempotency key,
  with the response's Retry-After within the maximum and budget left, else ``reconcile``);
* anything else (a 5xx, an unknown value) -> ``committed``, ``REMOTE_ERROR``, ``reconcile``: the
  remote answered for the item with something other than success and may have applied it;
* no entry or no status for an item sent -> ``unknown``, ``REMOTE_RESULT_INCOMPLETE``,
  ``reconcile``: the complete response does not say what happened to it.

A response without an item list gives every item the parent's rejection (a whole-batch 4xx) or,
otherwise, ``unknown``.  ``atomic = true``: the remote applies all items or none, so a mixed
answer makes every item ``reconcile`` -- the batch is reconciled as a whole, never one item.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from affidavit.adapters.base import RemoteResult
from affidavit.schema import Field, Read, Schema
from affidavit.statemachine import CODES, Code, Outcome, Retry

from .selectors import ABSENT, Selector, json_body, pointer, resolve, scalar, selector_field

if TYPE_CHECKING:  # target.py declares the ``batch`` field with this module's schema
    from .target import HttpTarget

__all__ = ["BATCH", "BatchContract", "read_items", "sent_items"]

THROTTLED = frozenset({429, 503})


@dataclass(frozen=True)
class BatchContract:
    items: Selector
    request_items: Selector
    item_id: Selector | None
    item_status: Selector
    ok: tuple[str | int, ...]
    rejected: tuple[str | int, ...]
    atomic: bool


def _values(r: Read) -> tuple[str | int, ...]:
    raw = r.raw()
    if not isinstance(raw, list):
        raise r.error("must be an array of statuses (integers or strings)")
    for i, v in enumerate(raw):
        if isinstance(v, bool) or not isinstance(v, int | str) or v == "":
            raise r.error("must be an integer or a non-empty string", f"[{i}]")
    return tuple(raw)


def _rejected(r: Read) -> tuple[str | int, ...]:
    values = _values(r)
    both = [v for v in values if v in r.values["ok"]]
    if both:
        raise r.error(f"names statuses that also mean ok: {', '.join(map(str, both))}")
    return values


def _request_items(r: Read) -> Selector:
    sel: Selector | None = selector_field("json")(r)
    return r.values["items"] if sel is None else sel


BATCH = Schema(
    BatchContract,
    (
        Field("items", selector_field("json"), doc="the response's list of item results"),
        Field(
            "request_items",
            _request_items,
            default=None,
            shown="`items`",
            doc="the request body's list of items sent",
        ),
        Field(
            "item_id",
            selector_field("json"),
            default=None,
            shown="position",
            doc="an item's id, in each item sent and each result (else matched by position)",
        ),
        Field("item_status", selector_field("json"), doc="an item result's status"),
        Field("ok", _values, default=[200, 201, 202, 204], doc="item statuses meaning applied"),
        Field(
            "rejected",
            _rejected,
            default=[],
            doc="item statuses meaning refused (besides integers 400-499)",
        ),
        Field("atomic", Read.boolean, default=False, doc="the remote applies all items or none"),
    ),
)


def _key(value: Any) -> str | None:
    """An item id as matched between request and response ("7" and 7 are the same item)."""
    v = scalar(value)
    return None if v is None else str(v)


def _sent(action: Any, target: HttpTarget) -> tuple[list[str | int], bool] | None:
    """(the items' ids, whether they are real ids rather than positions), or None when the
    action is not a batch: the target declares none, or the body has no item list."""
    contract = target.batch
    if contract is None:
        return None
    elems = resolve(json_body(action.body), pointer(contract.request_items.path))
    if not isinstance(elems, list):
        return None
    if contract.item_id is not None:
        tokens = pointer(contract.item_id.path)
        ids = [scalar(resolve(e, tokens)) for e in elems]
        keys = [_key(i) for i in ids]
        # Every item must carry a distinct id to be matched by it; otherwise by position.
        if None not in keys and len(set(keys)) == len(keys):
            return [i for i in ids if i is not None], True
    return list(range(len(elems))), False


def sent_items(action: Any, target: HttpTarget) -> Mapping[str, Any] | None:
    """What ACTION_ACCEPTED binds: the ids of the items sent and ``atomic``, or None."""
    sent = _sent(action, target)
    if sent is None or target.batch is None:
        return None
    return {"items": sent[0], "atomic": target.batch.atomic}


def _item(
    item_id: Any, outcome: Outcome, code: Code | None, status: Any = ABSENT
) -> dict[str, Any]:
    retry = Retry.NEVER if code is None else CODES[code].retry
    if code is Code.REMOTE_THROTTLED:
        # The response alone never makes resending an item safe: the record's hint applies
        # the whole request's rule (statemachine/batch.py, ``items_view``).
        retry = Retry.RECONCILE
    out: dict[str, Any] = {
        "id": item_id,
        "outcome": outcome.value,
        "code": code.value if code is not None else None,
        "retry": retry.value,
    }
    if status is not ABSENT:
        out["status"] = status
    return out


def _classify(contract: BatchContract, item_id: Any, status: Any) -> dict[str, Any]:
    if status is None:
        return _item(item_id, Outcome.UNKNOWN, Code.REMOTE_RESULT_INCOMPLETE)
    if status in contract.ok:
        return _item(item_id, Outcome.COMMITTED, None, status)
    if isinstance(status, int) and status in THROTTLED:
        return _item(item_id, Outcome.REJECTED, Code.REMOTE_THROTTLED, status)
    if status in contract.rejected or (isinstance(status, int) and 400 <= status < 500):
        return _item(item_id, Outcome.REJECTED, Code.REMOTE_REJECTED, status)
    return _item(item_id, Outcome.COMMITTED, Code.REMOTE_ERROR, status)


def read_items(
    action: Any, target: HttpTarget, result: RemoteResult, body: bytes | None
) -> list[dict[str, Any]] | None:
    """Each item's outcome from a complete response, or None when the action is no batch.
    ``body`` is None when it was not kept or not received whole (``affidavit.engine.readable``):
    no item is classified from it."""
    sent = _sent(action, target)
    contract = target.batch
    if sent is None or contract is None:
        return None
    ids, by_id = sent
    results = resolve(json_body(body), pointer(contract.items.path))
    if not isinstance(results, list):
        if result.outcome is Outcome.REJECTED and result.code is not None:
            # The whole request was refused: no item was applied.
            items = [_item(i, Outcome.REJECTED, result.code) for i in ids]
        else:
            items = [_item(i, Outcome.UNKNOWN, Code.REMOTE_RESULT_INCOMPLETE) for i in ids]
        return _atomic(contract, items)
    status_at = pointer(contract.item_status.path)
    answers: dict[str, Any] = {}
    if by_id and contract.item_id is not None:
        id_at = pointer(contract.item_id.path)
        for elem in results:
            key = _key(resolve(elem, id_at))
            if key is not None:
                answers.setdefault(key, scalar(resolve(elem, status_at)))
    else:
        for n, elem in enumerate(results[: len(ids)]):
            answers[str(n)] = scalar(resolve(elem, status_at))
    items = [_classify(contract, i, answers.get(str(i))) for i in ids]
    return _atomic(contract, items)


def _atomic(contract: BatchContract, items: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """All applied or all refused stand as they are; anything else in an atomic batch is
    reconciled as a whole (seed: "reconcile the batch as a whole if the remote API applies
    changes atomically")."""
    out = [dict(i) for i in items]
    if not contract.atomic:
        return out
    applied = all(i["outcome"] == "committed" and i["code"] is None for i in out)
    refused = all(i["outcome"] == "rejected" for i in out)
    if not (applied or refused):
        for i in out:
            i["retry"] = Retry.RECONCILE.value
    return out
