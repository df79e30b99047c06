"""What the engine asks a protocol's ``ResultContracts`` (asynchronous jobs and batches), and the
events it journals from the answers.

Seed: "A batch request needs an outcome for each item" -- the items sent are bound when the
invocation is accepted (``batch_facts``: ACTION_ACCEPTED's ``operation.batch``), and only a
complete result whose body is whole (``readable.py``) gives them outcomes of their own.  "A
complete HTTP 202 response confirms that the job was accepted ... Record the job identifier
and its status resource" -- both are read from the complete result before it is stored
(``reader``; from its body only when whole), and journaled in the same transaction as
RESULT_COMMITTED, so a stored result never lacks them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from affidavit.adapters.base import RemoteResult
from affidavit.protocols import ResultContracts, get
from affidavit.statemachine import Event, EventKind, EvidenceSource, operation_id

from .readable import from_elsewhere, unreadable

__all__ = ["Reader", "batch_facts", "contracts_of", "reader"]

E = EventKind

Reader = Callable[[str, RemoteResult, Mapping[str, bytes] | None], list[Event]]
"""``(invocation id, complete result, its kept streams or None) -> events`` to journal with it."""


def contracts_of(target: Any) -> ResultContracts | None:
    spec = get(target.kind)
    return spec.contracts if spec is not None else None


def batch_facts(action: Any, target: Any) -> Mapping[str, Any] | None:
    """The batch ACTION_ACCEPTED binds (item ids, atomic), or None for any other action."""
    contracts = contracts_of(target)
    return contracts.batch(action, target) if contracts is not None else None


def reader(action: Any, target: Any) -> Reader | None:
    """How this action's complete result is read for jobs and items (None: never)."""
    contracts = contracts_of(target)
    if contracts is None:
        return None
    origin = getattr(target, "origin", None)

    def read(iid: str, result: RemoteResult, kept: Mapping[str, bytes] | None) -> list[Event]:
        # ``kept`` is None when the result was too large to keep in memory: it is not read
        # back, and the reading says only what a result without a body says.  So is a body
        # withheld or cut (``readable.py``): a prefix of a 207 may parse and name outcomes the
        # rest would have contradicted; no item outcome, no job id is taken from it.  Nor from
        # an answer a followed redirect fetched from another origin, sent without the
        # credential: it says nothing of what the target did with the items -- nor its headers:
        # a 202's relative Location there, resolved against the target's URL, named a status
        # resource on the target that the target never gave, polled with the credential.
        if origin is not None and from_elsewhere(result.summary, origin=origin):
            return []
        body = None
        if kept is not None and unreadable(result.summary, origin=origin) is None:
            body = kept.get("body", b"")
        reading = contracts.read(action, target, result, body)
        out: list[Event] = []
        if reading.items is not None:
            out.append(
                Event(
                    E.BATCH_ITEMS_RECORDED,
                    iid,
                    {"items": [dict(i) for i in reading.items]},
                    source=EvidenceSource.REMOTE_RESPONSE,
                )
            )
        if reading.operation is not None:
            out.append(
                Event(
                    E.OPERATION_ACCEPTED,
                    iid,
                    {"operation_id": operation_id(iid), **reading.operation},
                    source=EvidenceSource.REMOTE_RESPONSE,
                )
            )
        return out

    return read
