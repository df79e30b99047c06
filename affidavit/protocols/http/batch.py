"""The ``batch`` setting: how a target's batch requests name their items and its responses
report each item's result.

Seed: "A batch request needs an outcome for each item ... Record the parent transport outcome and
five child outcomes.  Retry only the item for which the records and the remote contract permit
it, or reconcile the batch as a whole if the remote API applies changes atomically."

The items sent are read from the request body once, when the action is parsed
(``items_sent``, kept as ``HttpAction.batch``), so every item is known whatever happens after
dispatch.  With ``item_id``, every item sent must carry a distinct id (a non-empty string of at
most ``MAX_SCALAR`` characters or an integer; ``7`` and ``"7"`` are one id): results are matched
by it, and an item without one cannot be told apart -- the action is refused ``INVALID_FIELD``
at the item's id, below the field the caller sent (``body.items[1].id``,
``body_base64.items[1].id``), before anything is sent.  Without ``item_id`` the i-th result is
the i-th item's, and only when the list answers exactly as many items as were sent (a shorter
list does not say which was left out).  A body sent to a target declaring ``batch`` is read
strictly (``affidavit.strictjson``), item list or not -- a body the broker sends is as
ambiguous to the remote as to the broker: a field named twice is refused at its path, and
``NaN``, ``1e400``, a 5000-digit integer, invalid UTF-8 in a string or nesting Python gives up
on at the body's field -- the remote may read other items than the broker would record.  A
body that is no JSON text has no item list: no batch.

Only a *complete success* (a 2xx, no code) speaks for items one by one (``read_items``); the
rules, per item status:

* in ``ok`` -> ``committed``, no code, retry ``never``;
* in ``rejected``, or an integer 400-499 -> ``rejected``, ``REMOTE_REJECTED``,
  ``after_correction`` (429 and 503: ``REMOTE_THROTTLED`` -- the remote refused the item and
  asked to slow down -- recorded ``reconcile``; the record gives it the hint a whole request
  answered 429/503 gets: ``backoff`` only for an idempotent method or a usable idempotency key,
  with the response's Retry-After within the maximum and budget left, else ``reconcile``);
* anything else (a 5xx, an unknown value) -> ``committed``, ``REMOTE_ERROR``, ``reconcile``: the
  remote answered for the item with something other than success and may have applied it;
* no entry or no status for an item sent, or entries naming it with different statuses ->
  ``unknown``, ``REMOTE_RESULT_INCOMPLETE``, ``reconcile``: the response does not say (or does
  not say one thing) what happened to it.

A success without a readable item list leaves every item ``unknown``.  A parent that is no
success never gives an item a status of its own nor a hint stronger than its own
(statemachine/batch.py refuses one that does).  A rejection (a 4xx, 401 and 503 included)
speaks for an item only when the body read whole holds no item list at all (no body, no JSON,
another shape: the whole request was refused), or lists that item with a refusal (a status in
``rejected``, 400-499 or 503): then the item keeps the parent's code.  With a list present, an
item it lists with anything else (a 201 beside a 422 under a 400: applied, maybe -- "rejected"
would invite a resend applying it twice), with no readable status (none, ``201.0``, an object),
or leaves out (by id, or a positional list of another length) is ``unknown``; so is every item
when the body was not read whole or is unreadable (it may list any).  Anything else (a 5xx
that may have applied any item, a redirect not followed) leaves each ``unknown``.
``atomic = true``: the remote applies all items or none, so a mixed answer makes every item
``reconcile`` -- the batch is reconciled as a whole, never one item.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from affidavit.adapters.base import RemoteResult
from affidavit.protocols.actions import ActionInvalid
from affidavit.schema import Field, Read, Schema
from affidavit.statemachine import CODES, Code, Outcome, Retry
from affidavit.strictjson import DuplicateField, NotJsonNumber, NotText, loads_bytes

from .selectors import (
    ABSENT,
    MAX_SCALAR,
    UNREADABLE,
    Selector,
    json_body,
    pointer,
    resolve,
    scalar,
    selector_field,
)

if TYPE_CHECKING:  # target.py declares the ``batch`` field with this module's schema
    from .target import HttpTarget

__all__ = ["BATCH", "BatchContract", "Sent", "items_sent", "read_items", "sent_items"]

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
            doc=(
                "an item's id, in each item sent and each result (else matched by position); "
                "every item sent must carry a distinct one"
            ),
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
    """An item id as matched between request and response ("7" and 7 are the same item), or
    None when ``value`` is no id: a boolean, an empty string, one longer than ``MAX_SCALAR``
    (kept whole or not at all: cut, two ids would meet), anything but a string or integer."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        return None
    key = str(value)
    return key if 0 < len(key) <= MAX_SCALAR else None


def _field(root: str, tokens: tuple[str, ...], at: int, then: tuple[str, ...]) -> str:
    """The path the caller can fix, below the field that carried the body (``body.items[1].id``,
    ``body_base64.items[1].id``); the pointers are the target's settings, never the caller's
    text."""
    path = root + "".join(f".{t}" for t in tokens)
    return path + f"[{at}]" + "".join(f".{t}" for t in then)


def _request(body: bytes, root: str) -> Any:
    """The request body as JSON, strictly: what the broker records of the items must be what
    any reader of the body finds.  JSON readers disagree on is refused at ``root`` (a field
    named twice at its own path); a body that is no JSON text has no item list."""
    if not body:
        return ABSENT
    try:
        return loads_bytes(body, root)
    except DuplicateField as exc:
        raise ActionInvalid(Code.INVALID_FIELD, exc.path, exc.what) from None
    except (NotJsonNumber, NotText) as exc:
        raise ActionInvalid(Code.INVALID_FIELD, root, exc.what) from None
    except RecursionError:
        raise ActionInvalid(Code.INVALID_FIELD, root, "nests too deep to be read") from None
    except ValueError:  # no JSON text: no batch
        return ABSENT


Sent = tuple[tuple[str | int, ...], bool]
"""The ids of the items sent (their positions without ``item_id``), and whether they are real
ids."""


def items_sent(body: bytes, root: str, target: HttpTarget) -> Sent | None:
    """What a body sent to ``target`` in the action's field ``root`` (``body``,
    ``body_base64``) holds as a batch, or None when it is none: the target declares no batch,
    or the body has no item list.  Read once, when the action is parsed (``HttpAction.batch``).
    Raises ``ActionInvalid`` for a batch whose items cannot be told apart, or a JSON body
    readers disagree on (the module docstring)."""
    contract = target.batch
    if contract is None:
        return None
    list_at = pointer(contract.request_items.path)
    elems = resolve(_request(body, root), list_at)
    if not isinstance(elems, list):
        return None
    if contract.item_id is None:
        return tuple(range(len(elems))), False
    id_at = pointer(contract.item_id.path)
    ids: list[str | int] = []
    first: dict[str, int] = {}
    for n, elem in enumerate(elems):
        value = resolve(elem, id_at)
        key = _key(value)
        if key is None:
            raise ActionInvalid(
                Code.INVALID_FIELD,
                _field(root, list_at, n, id_at),
                "needs an id (a non-empty string of at most "
                f"{MAX_SCALAR} characters, or an integer): results are matched to items by it",
            )
        if key in first:
            raise ActionInvalid(
                Code.INVALID_FIELD,
                _field(root, list_at, n, id_at),
                f"repeats the id of item {first[key]}: results are matched to items by it",
            )
        first[key] = n
        ids.append(value)
    return tuple(ids), True


def sent_items(action: Any, target: HttpTarget) -> Mapping[str, Any] | None:
    """What ACTION_ACCEPTED binds: the ids of the items sent and ``atomic``, or None."""
    sent: Sent | None = action.batch
    if sent is None or target.batch is None:
        return None
    return {"items": list(sent[0]), "atomic": target.batch.atomic}


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
    contract = target.batch
    sent: Sent | None = action.batch
    if sent is None or contract is None:
        return None
    ids, by_id = sent
    answers = _answers(contract, ids, by_id, body)
    heard = answers if isinstance(answers, dict) else {}
    if result.outcome is not Outcome.COMMITTED or result.code is not None:
        # No success: the parent's word is each item's (the module docstring).
        if result.outcome is Outcome.REJECTED and result.code is not None:
            # A refusal may stand beside applied items its body lists (a 400 whose body lists
            # one 201 and one 422): it speaks for an item only when the body lists no items at
            # all, or lists that item refused.  A body not read whole or unreadable may list
            # any; an item a list leaves out, or lists with no readable status, is not said.
            def refused(i: str | int) -> bool:
                if answers is NO_LIST:
                    return True
                said = answers.get(str(i), ()) if isinstance(answers, dict) else ()
                return bool(said) and all(_refusal(contract, s) for s in said)

            items = [
                _item(i, Outcome.REJECTED, result.code)
                if refused(i)
                else _item(i, Outcome.UNKNOWN, Code.REMOTE_RESULT_INCOMPLETE)
                for i in ids
            ]
        else:
            items = [_item(i, Outcome.UNKNOWN, Code.REMOTE_RESULT_INCOMPLETE) for i in ids]
        return _atomic(contract, items)
    items = []
    for i in ids:
        said = heard.get(str(i), [None])
        # Named twice with different statuses: the response does not say one thing of it.
        status = said[0] if all(s == said[0] for s in said) else None
        items.append(_classify(contract, i, status))
    return _atomic(contract, items)


def _refusal(contract: BatchContract, status: Any) -> bool:
    """Whether an item's listed status refuses it (a status in ``rejected``, 400-499, 503)."""
    if status is None:
        return False
    if status in contract.rejected:
        return True
    return isinstance(status, int) and (400 <= status < 500 or status in THROTTLED)


NO_LIST: Final[Any] = object()
"""``_answers`` of a body read whole that holds no item list (no JSON, another shape)."""


def _answers(
    contract: BatchContract, ids: Sequence[str | int], by_id: bool, body: bytes | None
) -> dict[str, list[Any]] | Any:
    """Each item's statuses as the response's list gives them (by id, or by position when the
    list answers every item), keyed by ``str(id)``; an item it does not name is not a key (a
    positional list of another length names none).  ``NO_LIST`` when the body read whole holds
    no item list; None when the body was not read whole (``body`` None) or is unreadable: it
    may name any."""
    doc = json_body(body)
    if body is None or doc is UNREADABLE:
        return None
    results = resolve(doc, pointer(contract.items.path))
    if not isinstance(results, list):
        return NO_LIST
    status_at = pointer(contract.item_status.path)
    answers: dict[str, list[Any]] = {}
    if by_id and contract.item_id is not None:
        id_at = pointer(contract.item_id.path)
        for elem in results:
            key = _key(resolve(elem, id_at))
            if key is not None:
                answers.setdefault(key, []).append(scalar(resolve(elem, status_at)))
    elif len(results) == len(ids):
        for n, elem in enumerate(results):
            answers[str(n)] = [scalar(resolve(elem, status_at))]
    return answers


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
