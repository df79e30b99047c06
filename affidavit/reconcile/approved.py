"""A reconciliation query that waits for an operator: one at a time, and its answer read once sent.

A query is a call like any other (``engine/invocation.py``): on a target whose ``approval``
policy covers it, it waits for an operator, recorded APPROVAL_REQUESTED like any request --
otherwise any caller could have the broker send it with the credential, as often as it liked,
under ``approval = "always"``.  Its asker waits up to the policy's ``wait``; past it the query's
answer is APPROVAL_PENDING and the reconciliation RECONCILE_INCONCLUSIVE with that code, while the
query itself stays on the operator's list.

One question at a time, for any number of askers in any number of processes: the asker names
the query's id on the record it reconciles -- RECONCILE_INCONCLUSIVE with ``open`` (``claim``),
in the query's first journal write (``engine/takeup.py``), a row the projection refuses, in the
writing transaction, while another query is open under the same generation
(``statemachine.open_query``): refused, nothing of the query is written or asked.  The query stays
open until a row naming it without ``open`` reads its answer or gives it up.  The next ``query``
of the invocation takes the open one up (``earlier``, ``engine/takeup.py``) instead of asking
for another: refused ``QUERY_PENDING`` while it awaits a decision or is being sent, sent now
once approved, its answer read once sent, closed and asked anew once denied, expired or never
asked.  Only a query asked under the record's current
lease generation is open: one asked before a same-key retry took the invocation over observed
nothing of that retry's attempt.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from affidavit.approvals import OperatorError
from affidavit.engine.takeup import claim_expiry, claimed_until, still_open, take_up
from affidavit.statemachine import Event, EventKind, Record, open_query

from .refusals import append, pending

if TYPE_CHECKING:
    from affidavit.engine import CallControl, Engine

__all__ = ["ASKING", "UNSENT", "WAITING", "claim", "earlier", "still_open"]

E = EventKind
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


def claim(engine: Engine, record: Record, query_id: str) -> Event:
    """The row naming ``query_id`` as the invocation's one open query, for the head of the
    query's first write (``Engine.call``'s ``claim``): refused -- another asker's query is open
    (it was first, in any process), or the record moved since it was read (an operator
    attested, a retry took it over) -- nothing of the query is written (``ClaimRefused``), and
    ``refusals.refusal`` says what the record shows."""
    target = _target(engine, record)
    return Event(
        E.RECONCILE_INCONCLUSIVE,
        record.invocation_id,
        {
            "query_invocation": query_id,
            "code": None,
            "reason": ASKING,
            "open": True,
            "generation": record.generation,
            # Lapses, its query not accepted by then (``takeup``; in the lease clock).
            "expires_at": claim_expiry(engine, target),
            # What judges its answer: a query taken up under other rules settles nothing.
            **({"judged_by": engine.snapshot.judging_hash(target)} if target else {}),
        },
    )


async def earlier(
    engine: Engine,
    record: Record,
    control: CallControl | None,
    timeout: float | None,
) -> dict[str, Any] | None:
    """The answer (its envelope) of ``record``'s open query, taken up (``take_up``); None when
    none is open (one nothing was sent for is closed first: ask anew).  ``OperatorError``
    ``QUERY_PENDING`` while it awaits a decision or is being sent."""
    iid = record.invocation_id
    rows = record.evidence.get("reconcile_queries") or ()
    query_id = open_query(rows, record.generation)
    if query_id is None:
        return None
    opened = next(r for r in rows if r.get("query_invocation") == query_id and r.get("open"))
    claim = next((e for e in engine.journal.events(iid) if e.seq == opened.get("seq")), None)
    return await take_up(
        engine,
        query_id,
        linked=lambda link: link.get("reconciles") == iid,
        deadline=claimed_until(engine, _target(engine, record), claim),
        control=control,
        timeout=timeout,
        pending=_pending(query_id, iid),
        close=lambda code: _close(engine, record, query_id, code),
    )


def _pending(query_id: str, iid: str) -> Callable[[str], OperatorError]:
    return lambda doing: pending(query_id, iid, doing)


def _target(engine: Engine, record: Record) -> Any:
    return engine.config.targets.get(record.target or "")


async def _close(engine: Engine, record: Record, query_id: str, code: str | None) -> None:
    """The row that closes an open query nothing was sent for; a concurrent closer (another
    asker taking it up) may have closed it first: then nothing more is written."""
    now = await engine.recorder.record(record.invocation_id)
    if open_query(now.evidence.get("reconcile_queries") or (), now.generation) != query_id:
        return
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
    await append(engine, event)  # refused: what the record shows now (``refusals``)
