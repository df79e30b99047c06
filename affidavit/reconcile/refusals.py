"""What a reconciliation's row refused by the projection answers: the record as it is now.

Every row a reconciliation appends -- RECONCILED, RECONCILE_INCONCLUSIVE, the ``open`` row that
names a query (``approved.claim``, written at the head of the query's first write), the row that
closes one nothing was sent for -- names the generation of the record it observed: the
projection refuses it, in the writing transaction, once a retry took the invocation over, an
observer settled it, or another asker's query is open.  ``refusal`` answers each such race with
a stable code (``OperatorError``), never the projection's bare ``ImpossibleEvent``:

* ``STILL_RUNNING`` -- a retry runs; ``NOT_UNKNOWN`` -- it ended with a result, or another
  observer settled it; ``RETRIED_MEANWHILE`` -- it ended unknown again, under a newer attempt;
* ``QUERY_PENDING`` -- a query's claim only (nothing of it asked or sent): another query of the
  invocation is open (one question at a time), or was when the claim was refused and has
  closed since the refusal (read a moment too late to name it): querying again asks anew;
* ``QUERY_SUPERSEDED`` -- the row its asker writes once its query returned (``open``: it
  awaits an operator) was refused because another asker closed that query meanwhile and
  perhaps opened another -- open still (named), or closed since (a claim of it on record);
  else the message says no query is open now: the query was asked (its record
  stays, linked); the message names the row that closed it (``takeup.closed_by``: what it
  says of the query stands) and says only that this answer was not recorded.

* ``ROW_REFUSED`` (500) -- any other row but a claim that the record as observed refuses: no
  race explains it (a bug), but the query may have been sent -- answered, never raised, so
  its answer is kept beside (``service``: ``refused``) and the CLI, the daemon and MCP say
  a stable code, not a traceback or an internal error.  It says the query was asked only
  for a row recording its answer (``asked``), never for the row closing a query nothing was
  sent for (``approved._close``).

Only a claim the record as observed refuses (nothing of its query asked or sent) is left to
raise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from affidavit.approvals import OperatorError
from affidavit.engine.takeup import claimed_since, closed_by, superseded
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

__all__ = ["append", "not_at_rest", "pending", "refusal"]

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


async def append(engine: Engine, event: Event, *, asked: bool = False) -> None:
    """Append a reconciliation's row (barrier); refused, the ``OperatorError`` the record now
    warrants is raised (``refusal``): nothing is claimed beyond what the record shows.
    ``asked``: the row records the answer of the query it names (``service``), not the close
    of one nothing was sent for (``approved._close``)."""
    try:
        await engine.recorder.append(event, barrier=True)
    except ImpossibleEvent as refused:
        raise await refusal(engine, refused, asked=asked) from None


async def refusal(
    engine: Engine, refused: ImpossibleEvent, *, claim: bool = False, asked: bool = False
) -> Exception:
    """What a reconciliation's row ``refused`` by the projection answers -- its own row, or
    (``claim``) the claim heading a query's first write (``engine/takeup.py``): the
    ``OperatorError`` the record now warrants (the module's list); for a claim the record as
    observed refuses (not a race), ``refused`` itself.  ``asked``: the row records the answer
    of the query it names -- only then does ROW_REFUSED say the query was asked."""
    event = refused.event
    iid = event.invocation_id
    record = await engine.recorder.record(iid)
    why = not_at_rest(record)
    observed = event.attrs.get("generation")
    if why is None and record.generation != observed:
        # Unknown and at rest again, under a newer attempt than the one observed.
        why = OperatorError(
            "RETRIED_MEANWHILE",
            f"{iid} was retried (generation {record.generation}) after generation "
            f"{observed} was observed; observe it again",
        )
    current = open_query(record.evidence.get("reconcile_queries") or (), record.generation)
    named = event.attrs.get("query_invocation")
    opened = event.attrs.get("open") is True
    if why is None and opened and not claim and current != named:
        # The row its asker writes once its query returned: the query was asked (its record
        # stays, linked), closed meanwhile by another asker (who may have opened another).
        closer = closed_by(engine, iid, "query_invocation", named)
        claimed = claimed_since(engine, iid, "query_invocation", named)
        text = superseded("query", event, named, closer, current, claimed=claimed)
        why = OperatorError("QUERY_SUPERSEDED", text, 409)
    elif why is None and claim and current is not None and current != named:
        # Only a claim: nothing of its query was asked or sent.  Any other row naming a query
        # other than the open one is no race the projection has (the open row is the first
        # branch's): ROW_REFUSED below.
        why = pending(current, iid, "is being asked")
    elif why is None and current is None and opened and claim:
        # A claim refused while another query was open, closed by the time the record was
        # read: a race like the others, retryable -- never the projection's bare refusal.
        why = OperatorError(
            "QUERY_PENDING",
            f"another reconciliation query of {iid} was open when this one was named, and "
            "has closed since; nothing was asked or sent. Query again",
            409,
        )
    if why is None and not claim:
        # No race the projection has: a bug.  Never raised: a query may have been sent, and
        # its answer is kept beside this (``service``); the reason names states and ids only.
        if not isinstance(named, str):
            row = "this row"
        elif asked:
            row = f"the query {named} was asked: this row"
        else:
            row = f"this row (naming the query {named})"
        why = OperatorError(
            "ROW_REFUSED",
            f"{event.kind.value} of {iid} was refused by its record, though no race explains "
            f"it (a bug: report it) -- in state {refused.state!r}: {refused.reason}; {row} "
            "was not recorded",
            500,
        )
    return refused if why is None else why
