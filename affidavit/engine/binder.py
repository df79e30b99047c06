"""A key bound with nothing recorded under it yet: its binder's, until the binder is provably gone.

Seed, "Idempotency is defined by the remote contract": the key, fingerprint, scope and retention
are persisted before dispatch.  The broker binds the key first (``bind_idempotency``), then writes
the invocation's ACTION_ACCEPTED, and its dispatch gate makes DISPATCH_STARTED durable before a
byte is sent.  A binding with no record under it proves that nothing was sent under it *yet*; it
proves that nothing ever will be once its binder can no longer record, which is when either

* this broker is the journal's only writer (``Journal.exclusive``: the daemon on its SQLite file,
  holding its lock) and no call of its own holds the binding (``Recorder.running``, registered
  before the key is bound): the binder was another process, which stopped before this one took
  the lock; or
* the binder's send deadline has passed, by the clock leases are judged by (``journal.now``:
  the database's on a shared journal), and no call of this broker holds the binding.  The
  deadline is bound with the key (``IdempotencyRecord.send_by``): the lease end the binder's
  ACTION_ACCEPTED carries -- by its caller's timeout, its target's total and its broker's
  ``lease_margin``, never the judging call's, whose target may be another of the scope or
  configured otherwise (a 1 s target judged a 30 s binder gone after 1.1 s) -- recorded in that
  clock.  The binder's dispatch gate refuses a send after that end by the same clock
  (``journal.leases.check_first_deadline``): a binder that stopped, or is merely slow, sends
  nothing once it has passed.  A binding from before the column holds none: it is judged by the
  window of the judging call's target (its total timeout plus ``lease_margin`` from the
  binding's ``created_at``: ``Engine.lease_ttl`` with no caller timeout), which may be shorter
  than the binder's -- which the fence below makes safe.  The binding row holds no boot-clock
  stamp and needs none: nothing is in flight under a binding with no record, and the gate that
  would let the binder send judges by the clock this judges by.

Then the same request takes the invocation over (``invocation.start``, by winning its first
event, whose ``took_over`` records ``BinderGone.evidence``), and a different request closes it
first (``fence``: it wins the same first event and records PREFLIGHT_FAILED there, so a late
binder is refused exactly as on a take-over, naming the binder's target as bound with the key:
the closed invocation is read and listed only where that target is configured) and is
IDEMPOTENCY_MISMATCH as usual.  A fenced record is recognised by its first event's ``fenced``
(``Record.fenced``), not by its close: between the fence's two writes it is fenced already, the
projection refuses every attempt in it, and whoever finds it open -- its late binder, recovery,
the same request -- closes it with the fence's own close (``close_fenced``; the projection
refuses any other close, its binder's SETUP_FAILED among them), while a different
request is answered as the fencing one was.  A mismatch
once answered "nothing was sent under the key" while a binder whose window it misjudged could
still send: the fence makes that answer true however the binder was judged gone.  While the
binder may still record, the same request answers IN_PROGRESS -- the same fingerprint covers the
same target, so that invocation is the caller's to see -- and a different one waits
(``record_or_gone``) for the binder's record, whose answer ``rebound.refusal`` gives, or for the
binder to be gone: never IN_PROGRESS naming an invocation that may be another target's of a
shared scope.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from affidavit.journal import IdempotencyRecord
from affidavit.statemachine import FENCE_RULES, Code, Event, EventKind, ImpossibleEvent, Record

if TYPE_CHECKING:
    from .control import CallControl
    from .engine import Engine
    from .recorder import Recorder

__all__ = [
    "UNKNOWN_TARGET",
    "BinderGone",
    "close_fenced",
    "fence",
    "fenced_close",
    "judge",
    "record_or_gone",
]

UNKNOWN_TARGET = "(unknown)"
"""The target a fence names when the binding does not say (a row from before
``IdempotencyRecord.target``): no configuration may name it (target names start with a letter or
digit), so no caller reads or lists the record (``Engine.callable_target``) -- an operator's
only, as it may be another target's of a shared scope."""

_POLL_FIRST, _POLL_MAX = 0.01, 0.25
"""Seconds between the reads of ``record_or_gone``: a live binder records within milliseconds."""


@dataclass(frozen=True, slots=True)
class BinderGone:
    """Why the binder of a binding with no record can no longer record or send."""

    bound_at: float
    """The binding's ``created_at`` (the lease clock)."""
    judged_at: float
    """When this was judged, by the same clock."""
    window: float | None
    """The binder's window (seconds from ``bound_at``) that is over; None: judged by
    ``only_writer`` or by ``send_by``."""
    send_by: float | None = None
    """The binder's own send deadline (``IdempotencyRecord.send_by``) that has passed."""

    def evidence(self) -> dict[str, Any]:
        """Secret-free facts for the journal: what a take-over or a refusal records."""
        out: dict[str, Any] = {
            "why": "only_writer",
            "bound_at": self.bound_at,
            "judged_at": self.judged_at,
            "recorded": "nothing",
        }
        if self.send_by is not None:
            out.update(why="send_by_passed", send_by=self.send_by)
        elif self.window is not None:
            out.update(why="window_over", window=self.window)
        return out


async def judge(
    engine: Engine, bound: IdempotencyRecord, target: Any
) -> tuple[float, BinderGone | None]:
    """Now by the lease clock, and whether the binder of ``bound`` (which has recorded nothing)
    is provably gone (see the module's docstring); None while it may still record."""
    journal = engine.journal
    at = await engine.recorder.read(functools.partial(journal.now, "the age of a key's binding"))
    if engine.recorder.running(bound.invocation_id, 0):
        return at, None  # a call of this broker is its binder, and it is live
    if journal.exclusive:
        return at, BinderGone(bound.created_at, at, None)
    if bound.send_by is not None:  # the binder's own deadline, bound with the key
        if at < bound.send_by:
            return at, None
        return at, BinderGone(bound.created_at, at, None, bound.send_by)
    window = engine.lease_ttl(target, None)  # a binding from before the deadline was bound
    if at < bound.created_at + window:
        return at, None
    return at, BinderGone(bound.created_at, at, window)


async def record_or_gone(
    engine: Engine,
    bound: IdempotencyRecord,
    target: Any,
    control: CallControl | None = None,
    until: float | None = None,
) -> Record | BinderGone | None:
    """The record the binder of ``bound`` writes, or why it never will: waited for, polling,
    for at most the binder's window (longer only while a call of this broker holds the binding,
    which ends within its own lease).  The record is proven by its chained ACTION_ACCEPTED
    (``bound_record``: ``AlteredRow`` otherwise).  None when this call's caller went away or
    the broker stops it (``control.gone``), or its deadline (``until``, trio's clock) comes,
    first: the call ends with its own cause (``control.code``; the caller's stop, for a
    deadline), before anything was sent, naming nothing of ``bound`` -- a short timeout no
    longer held a call slot for the binder's whole window."""
    journal = engine.journal
    delay = _POLL_FIRST
    while True:
        record = journal.bound_record(bound)
        if record is not None:
            return record
        _at, gone = await judge(engine, bound, target)
        if gone is not None:
            # Recorded between the two reads: its record answers, not the judgment.
            return journal.bound_record(bound) or gone
        if control is not None and control.gone:
            return None
        if until is not None:
            left = until - trio.current_time()
            if left <= 0:
                return None
            delay = min(delay, left)
        await trio.sleep(delay)
        delay = min(delay * 2, _POLL_MAX)


_FENCED = (
    "this invocation's call bound its idempotency key and recorded nothing within its window; "
    "a call with a different request under the key closed it here: nothing was sent under the "
    "key"
)


def fenced_close(record: Record) -> Event | None:
    """The event that closes ``record`` when it is fenced and not yet closed: PREFLIGHT_FAILED,
    IDEMPOTENCY_MISMATCH, with ``binder_gone`` its fence's evidence -- what ``fence`` writes
    second, and what whoever finds it open writes instead (recovery, its late binder, a
    same-request caller); None otherwise.  Built from the chained fact alone, so the closed
    record reads the same whoever closes it."""
    if record.fenced is None or record.state != "accepted":
        return None
    return _closing(record.invocation_id, record.fenced)


def _closing(iid: str, evidence: Mapping[str, Any]) -> Event:
    attrs = {
        "code": Code.IDEMPOTENCY_MISMATCH.value,
        "field": "idempotency_key",
        "message": _FENCED,
        "binder_gone": dict(evidence),
    }
    return Event(EventKind.PREFLIGHT_FAILED, iid, attrs)


async def close_fenced(recorder: Recorder, record: Record) -> Record:
    """``record`` closed as its fence closes it (``fenced_close``), if it is fenced and still
    open -- a call that finds it so between the fence's two writes must neither wait for the
    fencing call nor act in the record -- else as the journal holds it."""
    closing = fenced_close(record)
    if closing is None:
        return record
    with contextlib.suppress(ImpossibleEvent):  # closed first (``append`` is shielded)
        await recorder.append(closing, barrier=True)
    return await recorder.record(record.invocation_id)


async def fence(engine: Engine, bound: IdempotencyRecord, gone: BinderGone) -> Record | None:
    """Close the invocation ``bound`` names, whose binder is ``gone``, before a different request
    is told that nothing was sent under the key: win its first event (ACTION_ACCEPTED, a barrier
    of its own -- the projection refuses a second one) naming the binding's scope, key and
    fingerprint (so ``bound_record`` proves it) with ``fenced`` (``Record.fenced``: how a fenced
    record is recognised), then PREFLIGHT_FAILED with ``binder_gone`` (``fenced_close``).  A
    binder that resumes later has its ACTION_ACCEPTED refused, as a late binder is on a
    take-over, and is answered from the closed record: IDEMPOTENCY_MISMATCH, nothing sent.
    None once closed; the record when the binder, a taker or another fence recorded first (its
    answer is ``rebound.refusal``'s, or the fence's when fenced).  The record names the binder's
    target (``IdempotencyRecord.target``; ``UNKNOWN_TARGET`` for a binding from before it:
    never the fencing call's, nor None, which every caller reads) and nothing of the fencing
    call -- no ``requester`` either: the fencing call did not ask for this invocation, and its
    asker (the binder's) recorded nothing; the record holds no result to deliver to anyone."""
    iid, recorder = bound.invocation_id, engine.recorder
    operation = {
        "target": UNKNOWN_TARGET if bound.target is None else bound.target,
        "protocol": None,
        "idempotent": False,
        "fingerprint": bound.fingerprint,
        "idempotency": {"key": bound.key, "scope": bound.scope},
    }
    evidence = gone.evidence()
    # ``rules``: the record is fenced under the rules that refuse its binder's attempt
    # (``FENCE_RULES``); a fence written before them is read for what its rows prove.
    fenced = {**evidence, "rules": FENCE_RULES}
    accepted = Event(EventKind.ACTION_ACCEPTED, iid, {"operation": operation, "fenced": fenced})
    with trio.CancelScope(shield=True):
        try:
            await recorder.write(accepted, barrier=True)
        except ImpossibleEvent:
            found = engine.journal.bound_record(bound)  # the binder (or a taker) was first
            if found is None:
                raise
            return found
        # Fenced from here: its first event says so, and no attempt of its own is taken in it.
        # Whoever finds it open meanwhile -- recovery (it holds no lease), its late binder, a
        # same-request caller -- closes it with this same event (``close_fenced``), which is
        # then refused here: the record reads the same.
        with contextlib.suppress(ImpossibleEvent):
            await recorder.write(_closing(iid, evidence), barrier=True)
    return None
