"""A reconciliation query that waits for an operator: one at a time, and its answer read once sent.

A query is a call like any other (``engine/invocation.py``): on a target whose ``approval``
policy covers it, it waits for an operator, recorded APPROVAL_REQUESTED like any request --
otherwise any caller could have the broker send it with the credential, as often as it liked,
under ``approval = "always"``.  Its asker waits up to the policy's ``wait``; past it the query's
answer is APPROVAL_PENDING and the reconciliation RECONCILE_INCONCLUSIVE with that code, while the
query itself stays on the operator's list.

One question at a time, for any number of askers in any number of processes: before it asks,
the asker names the query's id on the record it reconciles -- RECONCILE_INCONCLUSIVE with
``open`` (``claim``), a barrier the projection refuses, in the writing transaction, while
another query is open under the same generation (``statemachine.open_query``).  The query stays
open until a row naming it without ``open`` reads its answer or gives it up.  The next ``query``
of the invocation takes the open one up (``earlier``) instead of asking for another:

* still awaiting a decision, being sent, or approved and held by another process (the daemon's
  dispatcher): refused ``QUERY_PENDING`` -- nothing more is asked or sent;
* approved and not yet sent (its asker gone): sent now, through the same gate that re-checks
  the grant (``dispatch_approved``), within the caller's timeout, and its answer read;
* sent after its asker stopped waiting (the dispatcher; or its asker was answered IN_PROGRESS):
  its recorded answer is read -- an approved query is never sent for nothing, nor sent twice;
* denied, expired, cancelled before it was sent, or never asked (its asker stopped between the
  claim and the query's acceptance, past the target's lease): closed, and a new query asked.

A query left mid-send by a process that stopped is closed first by what its evidence proves
(``recover_stale``), then read like any other.  Only a query asked under the record's current
lease generation is open: one asked before a same-key retry took the invocation over observed
nothing of that retry's attempt.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import trio

from affidavit.approvals import OperatorError
from affidavit.engine.delivery import STORE_ONLY
from affidavit.engine.recovery import recover_stale
from affidavit.statemachine import Code, Event, EventKind, ImpossibleEvent, Record, open_query

if TYPE_CHECKING:
    from affidavit.engine import CallControl, Engine

__all__ = ["ASKING", "UNSENT", "WAITING", "abandoned", "claim", "earlier", "still_open"]

E = EventKind
_PENDING = Code.APPROVAL_PENDING.value
WAITING = (
    "the query awaits an operator's approval (the target's approval policy covers it); nothing "
    "was sent: query again once it is decided -- this query is taken up, not asked for again"
)
"""The reason a query answered APPROVAL_PENDING leaves the invocation unknown -- stable text."""
ASKING = (
    "the query is being asked (the target's approval policy covers it): until its answer is "
    "read, a query of this invocation takes it up instead of asking again"
)
"""The reason of the row that names a query before it is asked (``claim``) -- stable text."""
UNSENT = "the query was not sent (denied, expired, cancelled, or never asked): a new one is asked"
"""The reason of the row that closes an open query nothing was sent for -- stable text."""


def still_open(answer: Mapping[str, Any]) -> bool:
    """Whether a query's answer leaves the query open: it awaits an operator, or its asker
    stopped waiting while it was sent (its answer to be read by the next query)."""
    error = answer.get("error")
    return (error is not None and error.get("retry") == "fetch_result") or (
        error is not None and error.get("code") == _PENDING
    )


async def claim(engine: Engine, record: Record, query_id: str) -> None:
    """Name ``query_id`` as the invocation's one open query before it is asked; refused
    ``QUERY_PENDING`` when another asker's query is open (it was first, in any process)."""
    event = Event(
        E.RECONCILE_INCONCLUSIVE,
        record.invocation_id,
        {
            "query_invocation": query_id,
            "code": None,
            "reason": ASKING,
            "open": True,
            "generation": record.generation,
        },
    )
    try:
        await engine.recorder.append(event, barrier=True)
    except ImpossibleEvent:
        now = await engine.recorder.record(record.invocation_id)
        current = open_query(now.evidence.get("reconcile_queries") or (), now.generation)
        if current is None:
            raise  # not another asker: the caller's refusal (a retry, a settlement) answers
        raise _pending(current, record.invocation_id, "is being asked") from None


async def earlier(
    engine: Engine,
    record: Record,
    control: CallControl | None,
    timeout: float | None,
) -> dict[str, Any] | None:
    """The answer (its envelope) of ``record``'s open query, taken up as the module docstring
    says; None when none is open (one nothing was sent for is closed first: ask anew).
    ``OperatorError`` ``QUERY_PENDING`` while it awaits a decision or is being sent."""
    iid = record.invocation_id
    query_id = open_query(record.evidence.get("reconcile_queries") or (), record.generation)
    if query_id is None:
        return None
    recorder = engine.recorder
    found = await recorder.read(lambda: engine.journal.record(query_id))
    if found is None or not _linked(engine, query_id, iid):
        if found is None and not _claim_lapsed(engine, record, query_id):
            raise _pending(query_id, iid, "is being asked")
        await _close(engine, record, query_id, None)  # never asked, or not this one's query
        return None
    # A sender that stopped is closed first by what its evidence proves; an undecided request
    # past its expiry is recorded expired (``recover_stale`` does both).
    query = await recover_stale(recorder, found)
    if query.state == "approved":
        answer = await engine.dispatch_approved(query_id, STORE_ONLY, control, timeout)
        if answer is not None and not still_open(answer):
            return answer
        query = await recorder.record(query_id)  # another holds it (its lease), or it moved on
    if query.state == "awaiting_approval":
        raise _pending(query_id, iid, "awaits an operator's decision")
    if query.state == "approved":
        raise _pending(
            query_id,
            iid,
            "was approved and is not sent yet (another process, the daemon's dispatcher, may "
            "hold it to send, or its request can be read back only by its asker)",
        )
    if not query.final:
        raise _pending(query_id, iid, "is being sent")
    if not query.evidence.get("dispatch_started"):
        code = query.code.value if query.code is not None else None
        await _close(engine, record, query_id, code)  # denied, expired, cancelled: nothing sent
        return None
    return recorder.envelope(query)


def _pending(query_id: str, iid: str, doing: str) -> OperatorError:
    # No field: the id is right -- wait; nothing in the request is to change (``act_refused``).
    return OperatorError(
        "QUERY_PENDING",
        f"the reconciliation query {query_id} of {iid} {doing}; nothing more was asked or "
        "sent. Query again once it is decided (or answered)",
        409,
    )


def _linked(engine: Engine, query_id: str, iid: str) -> bool:
    """Whether ``query_id``'s ACTION_ACCEPTED names ``iid`` as the invocation it reconciles."""
    for event in engine.journal.events(query_id):
        if event.kind is E.ACTION_ACCEPTED:
            link = event.attrs.get("link")
            return isinstance(link, Mapping) and link.get("reconciles") == iid
    return False


def _claim_lapsed(engine: Engine, record: Record, query_id: str) -> bool:
    """Whether the claim naming ``query_id`` is older than its asker could have taken to
    accept the query (the target's lease; on a shared journal, plus the brokers' clock skew):
    its asker stopped between the two."""
    at = None
    for item in record.evidence.get("reconcile_queries") or ():
        if item.get("query_invocation") == query_id and item.get("open"):
            seq = item.get("seq")
            at = next(
                (e.at for e in engine.journal.events(record.invocation_id) if e.seq == seq), None
            )
            break
    target = engine.config.targets.get(record.target or "")
    ttl = engine.lease_ttl(target, None) if target is not None else 0.0
    return at is None or time.time() - at > ttl + engine.settings.lease_margin


async def _close(engine: Engine, record: Record, query_id: str, code: str | None) -> None:
    """The row that closes an open query nothing was sent for; a concurrent closer (another
    asker taking it up) may have closed it first: then nothing more is written."""
    event = Event(
        E.RECONCILE_INCONCLUSIVE,
        record.invocation_id,
        {
            "query_invocation": query_id,
            "code": code,
            "reason": UNSENT,
            "generation": record.generation,
        },
    )
    now = await engine.recorder.record(record.invocation_id)
    if open_query(now.evidence.get("reconcile_queries") or (), now.generation) != query_id:
        return
    await engine.recorder.append(event, barrier=True)


async def abandoned(engine: Engine, record: Record, query_id: str) -> None:
    """Its asker stopped (cancelled, or the call raised) after naming ``query_id``: closed
    when the query was never accepted, left open (to be taken up) when it was.  Shielded, and
    silent when the journal cannot tell: the claim then lapses with the target's lease."""
    with trio.CancelScope(shield=True), contextlib.suppress(Exception):
        if engine.journal.record(query_id) is None:
            await _close(engine, record, query_id, None)
