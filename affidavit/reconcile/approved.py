"""A reconciliation query that waits for an operator: one at a time, and its answer read once sent.

A query is a call like any other (``engine/invocation.py``): on a target whose ``approval``
policy covers it, it waits for an operator, recorded APPROVAL_REQUESTED like any request --
otherwise any caller could have the broker send it with the credential, as often as it liked,
under ``approval = "always"``.  Its asker waits up to the policy's ``wait``; past it the query's
answer is APPROVAL_PENDING and the reconciliation RECONCILE_INCONCLUSIVE with that code, while the
query itself stays on the operator's list.  The next ``query`` of the same invocation then takes
that query up again instead of asking for another (``earlier``):

* still awaiting a decision, or approved and being sent by another (the daemon's dispatcher):
  refused ``QUERY_PENDING`` -- nothing more is asked or sent, so a caller cannot fill the
  operator's list with copies of one question;
* approved and not yet sent (its asker, and nobody else, gone): sent now, through the same gate
  that re-checks the grant (``dispatch_approved``), and its answer read;
* sent after its asker stopped waiting (the daemon's dispatcher): its recorded answer is read --
  an approved query is never sent for nothing, nor sent twice;
* denied, expired, cancelled before it was sent: a new query is asked for.

Only a query asked under the record's current lease generation is taken up: one asked before a
same-key retry took the invocation over observed nothing of that retry's attempt.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from affidavit.approvals import OperatorError
from affidavit.engine.approval import APPROVAL_STATES, expire_if_due
from affidavit.engine.delivery import STORE_ONLY
from affidavit.statemachine import Code, Event, EventKind, Record

if TYPE_CHECKING:
    from affidavit.engine import CallControl, Engine

__all__ = ["WAITING", "earlier"]

E = EventKind
_PENDING = Code.APPROVAL_PENDING.value
WAITING = (
    "the query awaits an operator's approval (the target's approval policy covers it); nothing "
    "was sent: query again once it is decided -- this query is taken up, not asked for again"
)
"""The reason a query answered APPROVAL_PENDING leaves the invocation unknown -- stable text."""


async def earlier(
    engine: Engine, record: Record, events: Iterable[Event], control: CallControl | None
) -> dict[str, Any] | None:
    """The answer (its envelope) of the query of ``record`` that last waited for an operator, as
    the module docstring takes it up; None when there is none to take up (ask anew).
    ``OperatorError`` ``QUERY_PENDING`` while it awaits a decision or another sends it."""
    query_id = _waited(record, events)
    if query_id is None:
        return None
    recorder = engine.recorder
    found = await recorder.read(lambda: engine.journal.record(query_id))
    if found is None:
        return None
    query = await expire_if_due(recorder, found)
    iid = record.invocation_id
    if query.state == "approved":
        answer = await engine.dispatch_approved(query_id, STORE_ONLY, control)
        if answer is not None:
            return answer
        query = await recorder.record(query_id)  # another took it (its lease), or it moved on
    if query.state in APPROVAL_STATES or not query.final:
        if query.state == "awaiting_approval":
            doing = "awaits an operator's decision"
        elif query.state == "approved":
            doing = "was approved and another process holds it to send"
        else:
            doing = "is being sent"
        raise OperatorError(
            "QUERY_PENDING",
            f"the reconciliation query {query_id} of {iid} {doing}; nothing more was asked or "
            "sent. Query again once it is decided (or answered)",
            409,  # no field: the id is right -- wait, nothing to correct (``act_refused``)
        )
    if not query.evidence.get("dispatch_started"):
        return None  # denied, expired, cancelled: nothing was sent, nothing to read
    return recorder.envelope(query)


def _waited(record: Record, events: Iterable[Event]) -> str | None:
    """The query whose APPROVAL_PENDING answer the record's last reconciliation event names,
    under its current generation; else None."""
    last = None
    for event in events:
        if event.kind in (E.RECONCILE_INCONCLUSIVE, E.RECONCILED):
            last = event
    if last is None or last.kind is not E.RECONCILE_INCONCLUSIVE:
        return None
    attrs: Mapping[str, Any] = last.attrs
    if attrs.get("code") != _PENDING or attrs.get("generation") != record.generation:
        return None
    query_id = attrs.get("query_invocation")
    return query_id if isinstance(query_id, str) else None
