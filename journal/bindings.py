"""Idempotency bindings proven by the chain: a ``(scope, key) -> invocation`` row is not chained
itself, but the invocation's ACTION_ACCEPTED is, and it names the key, its scope and the request
fingerprint (``operation.idempotency``, ``operation.fingerprint``).  So a binding is believed only
as far as that chained event agrees with it.

* At lookup (``JournalReader.bound_record``: the engine, before it answers a same-key call from
  the record the key names): the named invocation's ACTION_ACCEPTED must name the same scope, key
  and fingerprint -- else ``AlteredRow``, never the other invocation's result.
* At a miss (``leases.bind_op``, in the bind's transaction; SQLite only, through its index of
  ACTION_ACCEPTED by key, ``Tables.accepted_with_key``): a key with no binding row that a chained
  ACTION_ACCEPTED names was bound and its row removed -- ``AlteredRow`` (``removed``), never a
  second binding and a second dispatch.  Likewise a binding naming an invocation with no event
  whose key another invocation's ACTION_ACCEPTED names (``unbound``, in ``bound_record``).
* In ``verify`` (``check``): every binding row against the chained event of its invocation, and
  every chained ACTION_ACCEPTED that names a key against the binding row of that key -- a removed
  binding (whose key a retry would dispatch again) is found here too, on every backend.

Legitimate states that are not a mismatch: a binding whose invocation has no ACTION_ACCEPTED yet
(the key is bound, in its own transaction, before the first event; a binder that stopped there
leaves it so, and the next same-key call takes the invocation over).  The binding is committed
before its ACTION_ACCEPTED, so a chained event naming a key with no binding row is never one the
broker left.  A row's ``expires_at`` and ``created_at`` are not compared: a take-over writes
ACTION_ACCEPTED with its own retention deadline, and nothing of either is answered to a caller
from the row.

Messages name the scope, the invocations and the seq, never the key (the caller's identifier).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from affidavit.statemachine import EventKind, Record

from .errors import IdempotencyRecord
from .rows import AlteredRow
from .verify_codes import BINDING_ALTERED, BINDING_MISSING

__all__ = ["ACCEPTED", "Claim", "check", "claim_of", "mismatch", "removed", "unbound"]

ACCEPTED = EventKind.ACTION_ACCEPTED.value

Claim = tuple[Any, Any, Any]
"""(scope, key, fingerprint) an ACTION_ACCEPTED names."""


def mismatch(binding: IdempotencyRecord, record: Record) -> str | None:
    """Why ``record`` (the invocation ``binding`` names) does not prove ``binding``; None if it
    does."""
    idem = record.idempotency or {}
    if idem.get("scope") != binding.scope or idem.get("key") != binding.key:
        return "its ACTION_ACCEPTED names another idempotency key"
    if record.fingerprint != binding.fingerprint:
        return "its ACTION_ACCEPTED names another request fingerprint"
    return None


def removed(where: str, scope: str, seq: int) -> AlteredRow:
    """The error for a key with no binding row that the ACTION_ACCEPTED at ``seq`` names."""
    return AlteredRow(
        f"journal {where}: the idempotency key in scope {scope!r} has no binding row, but the "
        f"ACTION_ACCEPTED at seq {seq} names it: the binding was altered (removed)"
    )


def unbound(where: str, binding: IdempotencyRecord, seq: int) -> AlteredRow:
    """The error for a binding naming an invocation with no event whose key the
    ACTION_ACCEPTED at ``seq`` (another invocation's) names."""
    return AlteredRow(
        f"journal {where}: the idempotency binding in scope {binding.scope!r} names invocation "
        f"{binding.invocation_id}, which has no event, but the ACTION_ACCEPTED at seq {seq} "
        "names its key: the binding was altered"
    )


def claim_of(attrs_json: Any) -> Claim | None:
    """The (scope, key, fingerprint) an ACTION_ACCEPTED row's stored attrs name; None when they
    name no key (or are not an object: the chain and the reads report that)."""
    try:
        attrs = json.loads(attrs_json)
        op = attrs["operation"]
        idem = op.get("idempotency")
        if not isinstance(idem, Mapping) or idem.get("key") is None:
            return None
        return (idem.get("scope"), idem["key"], op.get("fingerprint"))
    except (TypeError, ValueError, KeyError, AttributeError):
        return None


def check(
    rows: Iterable[tuple[Any, ...]],
    accepted: Mapping[str, tuple[int, Claim | None]],
    add: Callable[[int | None, str, str], None],
) -> int:
    """Each binding row (``rows``, as ``IDEMPOTENCY_COLUMNS``) against ``accepted`` (invocation
    -> (seq, claim) of each chained ACTION_ACCEPTED the walk reached), and each claim against
    its row; ``add(seq, reason, code)`` for every mismatch (``verify_codes``).  Returns the
    bindings found proven."""
    claims: dict[tuple[Any, Any], tuple[str, int, Any]] = {}
    for iid, (seq, c) in accepted.items():
        if c is None:
            continue
        other = claims.setdefault((c[0], c[1]), (iid, seq, c[2]))
        if other[0] != iid:
            add(max(seq, other[1]), f"invocations {other[0]} and {iid} both name one "
                f"idempotency key in scope {c[0]!r}: an ACTION_ACCEPTED was altered",
                BINDING_ALTERED)  # fmt: skip
    proven = 0
    seen: set[tuple[str, str]] = set()
    for row in rows:
        scope, key, fp, iid = row[0], row[1], row[2], row[3]
        if not all(type(v) is str for v in (scope, key, fp, iid)):
            add(
                None, "an idempotency row was altered: a column is not of its type", BINDING_ALTERED
            )
            continue
        seen.add((scope, key))
        named = accepted.get(iid)
        claimed = claims.get((scope, key))
        if claimed is not None and claimed[0] != iid:
            add(claimed[1], f"the idempotency binding in scope {scope!r} names invocation {iid}, "
                f"but the key is invocation {claimed[0]}'s (seq {claimed[1]}): the binding "
                "was altered", BINDING_ALTERED)  # fmt: skip
        elif named is not None and (named[1] is None or named[1][:2] != (scope, key)):
            add(named[0], f"the idempotency binding in scope {scope!r} names invocation {iid}, "
                f"whose ACTION_ACCEPTED (seq {named[0]}) names another key: the binding was "
                "altered", BINDING_ALTERED)  # fmt: skip
        elif claimed is not None and claimed[2] != fp:
            add(claimed[1], f"the idempotency binding in scope {scope!r} of invocation {iid} "
                f"names another fingerprint than its ACTION_ACCEPTED (seq {claimed[1]}): the "
                "binding was altered", BINDING_ALTERED)  # fmt: skip
        elif named is not None:
            proven += 1
    for (scope, _key), (iid, seq, _fp) in claims.items():
        if (scope, _key) not in seen:
            add(seq, f"invocation {iid}'s ACTION_ACCEPTED (seq {seq}) names an idempotency key in "
                f"scope {scope!r} that has no binding row (it was removed: a retry with that key "
                "would be sent again)", BINDING_MISSING)  # fmt: skip
    return proven
