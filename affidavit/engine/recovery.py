"""Recovery of stale records: a non-final record whose holder's lease expired belongs to a
broker that stopped mid-call.  It is closed with what the durable record proves -- never with
what would be convenient.

Seed: "Terminate the broker between every pair of durable transitions, and verify that recovery
never claims ``not_attempted`` after DISPATCH_STARTED."  Design notes, "Leases for the first
attempt": until the lease expires a resuming caller is answered from the record.
"""

from __future__ import annotations

import contextlib
import time

from affidavit.statemachine import Code, Event, EventKind, ImpossibleEvent, Outcome, Record

from .recorder import Recorder

__all__ = ["recover_stale"]

E = EventKind


async def recover_stale(recorder: Recorder, record: Record, *, holder_gone: bool = False) -> Record:
    """Close ``record``'s stale attempt if its holder's lease has expired -- or at once when the
    caller knows the holder is gone (``holder_gone``: the daemon at start-up, holding the
    journal's exclusive lock); return the record as the journal then holds it (unchanged while
    the lease runs, or when nothing can be proven beyond what it says)."""
    events = recorder.journal.events(record.invocation_id)
    expires = None
    for ev in events:
        if ev.kind is E.ACTION_ACCEPTED:
            expires = ev.attrs.get("lease_expires_at")
        elif ev.kind is E.RETRY_LEASE_ACQUIRED:
            expires = ev.attrs.get("expires_at")
    if not holder_gone and expires is not None and time.time() < float(expires):
        return record
    if record.state == "authorized" or record.state == "retry_pending":
        # The current attempt never reached its own DISPATCH_STARTED (that would have moved
        # the state to ``dispatched``).  In ``retry_pending`` an *earlier* attempt did, so
        # ``dispatch_started`` is already true and the outcome stays unknown
        # (retry_setup_failed); ATTEMPT_INTERRUPTED is impossible there and would leave the
        # record IN_PROGRESS for ever.
        closing = Event(
            E.SETUP_FAILED,
            record.invocation_id,
            {"code": Code.SETUP_FAILED.value, "stage": "broker_stopped"},
        )
    elif record.evidence.get("dispatch_started") and record.outcome is Outcome.UNKNOWN:
        closing = Event(
            E.ATTEMPT_INTERRUPTED,
            record.invocation_id,
            {
                "code": Code.REMOTE_OUTCOME_UNKNOWN.value,
                "message": "The broker stopped after dispatch, before a result was recorded.",
            },
        )
    elif record.state == "completed_committed" or record.state == "completed_rejected":
        # A complete result was recorded but never stored (the broker stopped before
        # RESULT_COMMITTED): keep the proven outcome, never re-run (seed: "Storing the
        # result can fail after remote execution ... not a retry of the remote action").
        closing = Event(E.RESULT_STORE_FAILED, record.invocation_id, {"stage": "broker_stopped"})
    else:
        return record
    with contextlib.suppress(ImpossibleEvent):  # someone closed it first; the journal knows
        await recorder.append(closing, barrier=True)
    return await recorder.record(record.invocation_id)
