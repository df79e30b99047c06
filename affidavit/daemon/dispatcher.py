"""The daemon's dispatcher: approved invocations whose caller went away are sent, once.

Seed: "Before approval, bind ... the request fingerprint to the invocation" -- and issue 12: "A
granted invocation is dispatched by the process that holds it: the waiting caller, or
``affidavit serve`` (which also picks up granted, unexpired, undispatched invocations at
start)".  At start the daemon learns every approval the journal has open; while it runs, every
approval its own calls request, and at each sweep those the journal gained since the last one
(asked or granted through another daemon on a shared journal: ``engine.approval.refresh``).
Each sweep -- at once after a decision recorded here, else every
``SWEEP`` seconds -- dispatches those approved that nobody holds (``Broker.approvals_ready``:
no caller here waits for it, no live dispatch lease) as a call of the daemon's own (``calls.py``:
bounded by ``max_calls``, stopped at shutdown like any other), and closes those expired on the
way.  The result is stored for the caller's ``fetch_result``; the dispatch lease and the gate's
re-check of the approval keep it to one send, whoever else tries.  A sweep that cannot read
the journal (a shared journal's database away) is logged once and tried again at the next,
and a dispatch the journal cut short is one warning naming it: the daemon goes on serving.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import trio

from affidavit.api.broker import Broker
from affidavit.engine import CallNotRecorded, unrecorded
from affidavit.journal import JournalError

from .calls import Calls, Overloaded, Running

__all__ = ["SWEEP", "dispatch_approvals"]

log = logging.getLogger("affidavit.daemon")

SWEEP = 1.0


async def dispatch_approvals(
    broker: Broker, calls: Calls, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Run until cancelled (the daemon's shutdown)."""
    broker.watch_approvals()
    task_status.started()
    away = False
    while True:
        try:
            ready = await broker.approvals_ready()
        except JournalError as exc:
            # A shared journal away: the sweep is tried again, never the daemon stopped.
            if not away:
                log.warning("approvals: the journal cannot be read now, sweeping again: %s", exc)
            away, ready = True, []
        else:
            if away:
                log.info("approvals: the journal is readable again")
            away = False
        for iid in ready:
            if not calls.accepting:
                broker.forget_dispatch(iid)
                continue
            try:
                calls.start(functools.partial(_dispatch, broker, iid))
            except Overloaded:
                broker.forget_dispatch(iid)  # the next sweep tries again
        await broker.approvals_changed(SWEEP)


async def _dispatch(broker: Broker, iid: str, call: Running) -> dict[str, Any]:
    try:
        envelope = await broker.dispatch_approved(iid, control=call.control)
    except JournalError as exc:
        # A shared journal away mid-dispatch: nobody waits for this call, so the log is where
        # it is told -- one line naming it and where to look once the journal is back (its
        # record, closed by recovery when its lease runs out, says whether it was sent).
        # ``CallNotRecorded`` says only that: the journal's own words are its cause's.
        why = exc.__cause__ if isinstance(exc, CallNotRecorded) and exc.__cause__ else exc
        log.warning("approvals: dispatching %s: %s: %s", iid, unrecorded(iid), why)
        return {}
    if envelope is not None:
        error = envelope.get("error")
        log.info(
            "dispatched approved %s: %s",
            iid,
            f"{error['code']} ({error['outcome']})" if error else "result stored",
        )
    return envelope or {}
