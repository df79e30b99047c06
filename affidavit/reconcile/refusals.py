"""What a reconciliation's row refused by the projection answers: the record as it is now.

Every row a reconciliation appends -- RECONCILED, RECONCILE_INCONCLUSIVE, the ``open`` row that
names a query before it is asked (``approved.claim``), the row that closes one nothing was sent
for -- names the generation of the record it observed, and is written with a barrier: the
projection refuses it, in the writing transaction, once a retry took the invocation over, an
observer settled it, or another asker's query is open.  ``append`` answers each such race with a
stable code (``OperatorError``), never the projection's bare ``ImpossibleEvent``:

* ``STILL_RUNNING`` -- a retry runs; ``NOT_UNKNOWN`` -- it ended with a result, or another
  observer settled it; ``RETRIED_MEANWHILE`` -- it ended unknown again, under a newer attempt;
* ``QUERY_PENDING`` -- another query of the invocation is open (one question at a time).

Only a row the record as observed refuses (a bug, not a race) is left to raise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from affidavit.approvals import OperatorError
from affidavit.statemachine import (
    TRANSITIONS,
    Event,
    EventKind,
    ImpossibleEvent,
    Outcome,
    Record,
    open_query,
)

if TYPE_CHECKING:
    from affidavit.engine import Engine

__all__ = ["append", "not_at_rest", "pending"]

E = EventKind


def not_at_rest(record: Record) -> OperatorError | None:
    """Why ``record`` cannot be reconciled now, or None: it is unknown and at rest."""
    iid = record.invocation_id
    if not record.final:
        return OperatorError(
            "STILL_RUNNING", f"{iid} is still running ({record.state}); reconcile it once it ends"
        )
    if record.outcome is not Outcome.UNKNOWN or E.RECONCILED not in TRANSITIONS[record.state]:
        return OperatorError(
            "NOT_UNKNOWN",
            f"{iid} is {record.outcome.value} ({record.state}): only an unknown outcome is "
            "reconciled",
        )
    return None


def pending(query_id: str, iid: str, doing: str) -> OperatorError:
    """QUERY_PENDING: ``iid``'s open query ``query_id`` ``doing`` -- nothing more asked."""
    # No field: the id is right -- wait; nothing in the request is to change.
    return OperatorError(
        "QUERY_PENDING",
        f"the reconciliation query {query_id} of {iid} {doing}; nothing more was asked or "
        "sent. Query again once it is decided (or answered)",
        409,
    )


async def append(engine: Engine, event: Event) -> None:
    """Append a reconciliation's row (barrier); refused, the ``OperatorError`` the record now
    warrants is raised (the module's list): nothing is claimed beyond what the record shows."""
    iid = event.invocation_id
    try:
        await engine.recorder.append(event, barrier=True)
    except ImpossibleEvent:
        record = await engine.recorder.record(iid)
        refusal = not_at_rest(record)
        observed = event.attrs.get("generation")
        if refusal is None and record.generation != observed:
            # Unknown and at rest again, under a newer attempt than the one observed.
            refusal = OperatorError(
                "RETRIED_MEANWHILE",
                f"{iid} was retried (generation {record.generation}) after generation "
                f"{observed} was observed; observe it again",
            )
        current = open_query(record.evidence.get("reconcile_queries") or (), record.generation)
        if (
            refusal is None
            and current is not None
            and current != event.attrs.get("query_invocation")
        ):
            refusal = pending(current, iid, "is being asked")
        if refusal is None:
            raise  # not a race: the record as observed refuses the event
        raise refusal from None
