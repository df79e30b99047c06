"""Recovery of stale records: a non-final record whose holder's lease expired belongs to a
broker that stopped mid-call.  It is closed with what the durable record proves -- never with
what would be convenient.

Seed: "Terminate the broker between every pair of durable transitions, and verify that recovery
never claims ``not_attempted`` after DISPATCH_STARTED."  Design notes, "Leases for the first
attempt": until the lease expires a resuming caller is answered from the record.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any, Final

import trio

from affidavit.journal import (
    AlteredRow,
    JournalError,
    JournalReplaced,
    JournalUnavailable,
    JournalWriteError,
    LeaseBusy,
    ReadFailed,
    ResultUnverified,
    boot_lapsed,
    told,
    with_boot_mark,
)
from affidavit.statemachine import (
    Code,
    Event,
    EventKind,
    ImpossibleEvent,
    Outcome,
    Record,
    project,
)

from .approval import APPROVAL_STATES, expire_if_due
from .binder import fenced_close
from .recorder import Recorder

__all__ = [
    "INTERNAL_CLOSE_WAIT",
    "READ_DECLINED",
    "READ_RETRY",
    "READ_RETRY_AFTER",
    "RESULT_UNVERIFIED",
    "UNAVAILABLE_RETRY_AFTER",
    "UNREADABLE",
    "CallNotRecorded",
    "act_failure",
    "carries_key",
    "closing_event",
    "internal_close",
    "internal_failure",
    "journal_refused",
    "read_failure",
    "recover_stale",
    "result_failure",
    "unread",
    "unreadable",
    "unrecorded",
]

E = EventKind
log = logging.getLogger("affidavit.engine")
_AFTER_DISPATCH = {
    "broker_stopped": "The broker stopped after dispatch, before a result was recorded.",
    "lease_lapsed": "The attempt's lease ran out after dispatch; no result was recorded.",
    "journal": "The journal refused a write after dispatch; no result was recorded.",
    "internal": (
        "A failure inside the broker ended the call after dispatch; no result was recorded."
    ),
}
_BEFORE_DISPATCH_MESSAGE = {
    # (stage, an earlier attempt dispatched): the message of the SETUP_FAILED that closes an
    # attempt before its dispatch gate -- the cause is the journal or a stopped broker, never a
    # transport; "Connection setup failed for another transport reason" would blame the wrong
    # thing.
    ("broker_stopped", False): "The broker stopped before dispatch; nothing was sent.",
    ("broker_stopped", True): (
        "The broker stopped before this retry's dispatch; the retry sent nothing, and an"
        " earlier attempt's outcome stays unknown."
    ),
    # A lease that ran out proves no more than that: its holder may have stopped, or may
    # still run and have given up a close the journal did not take (``internal_close``).
    ("lease_lapsed", False): "The attempt's lease ran out before dispatch; nothing was sent.",
    ("lease_lapsed", True): (
        "The retry's lease ran out before its dispatch; the retry sent nothing, and an"
        " earlier attempt's outcome stays unknown."
    ),
    ("journal", False): (
        "The journal could not record this call before dispatch (it refused a write); nothing"
        " was sent."
    ),
    ("journal", True): (
        "The journal refused a write before this retry's dispatch; the retry sent nothing, and"
        " an earlier attempt's outcome stays unknown."
    ),
    ("internal", False): (
        "A failure inside the broker ended the call before dispatch; nothing was sent."
    ),
    ("internal", True): (
        "A failure inside the broker ended this retry before its dispatch; the retry sent"
        " nothing, and an earlier attempt's outcome stays unknown."
    ),
}
_LEASES = frozenset({E.RETRY_LEASE_ACQUIRED, E.DISPATCH_LEASE_ACQUIRED})
_BEFORE_DISPATCH = frozenset({"accepted", "validated", "authorized", "retry_pending"})
"""The states whose current attempt has not dispatched, closed by SETUP_FAILED."""


async def recover_stale(recorder: Recorder, record: Record, *, holder_gone: bool = False) -> Record:
    """Close ``record``'s stale attempt if its holder's lease has expired -- or at once when the
    caller knows the holder is gone (``holder_gone``: the daemon at start-up, holding the
    journal's exclusive lock); return the record as the journal then holds it (unchanged while
    the lease runs, or when nothing can be proven beyond what it says).  Its words claim what
    is known: "the broker stopped" only when the holder is gone, else only that the attempt's
    lease ran out -- its holder may still run (a close it gave up: ``internal_close``).  Never
    an attempt this broker is running (``Recorder.running``), whatever the clocks say."""
    if record.state in APPROVAL_STATES:
        # Waiting for an operator or a dispatcher is no stale attempt: it ends when decided,
        # dispatched or expired -- and only the expiry is for a reader to record.
        return await expire_if_due(recorder, record)
    if recorder.running(record.invocation_id, record.generation):
        # This broker runs the attempt: it is live, and ends within its lease by trio's
        # monotonic clock.  A wall clock stepped forward must not close it, nor let a same-key
        # call send again while its request is in flight.
        return record
    events = recorder.journal.events(record.invocation_id)
    expires = boot = taken = None
    for ev in events:
        if ev.kind is E.ACTION_ACCEPTED:
            expires, boot = ev.attrs.get("lease_expires_at"), ev.attrs.get("lease_boot")
            taken = ev.at
        elif ev.kind in _LEASES:
            expires, boot = ev.attrs.get("expires_at"), ev.attrs.get("lease_boot")
            taken = ev.at
    deadline = None if expires is None else float(expires)
    if not holder_gone:
        if deadline is not None and time.time() < deadline:
            return record
        # Taken on this boot: its end by the boot clock too (``boot_lapsed``) -- a wall clock
        # stepped forward makes a live lease look run out to every process on the host.  Never
        # for longer than the lease itself ran (its length by the wall clock, as recorded).
        length = None if deadline is None or taken is None else deadline - float(taken)
        if boot_lapsed(boot, length) is False:
            return record
    closing = closing_event(record, "broker_stopped" if holder_gone else "lease_lapsed")
    if closing is None:
        return record
    # This host's clock said the lease ran out; the journal judges it again in the closing
    # transaction by the clock every broker shares (the database's, on PostgreSQL): a clock
    # running ahead here must not close an attempt another broker is still running.
    with contextlib.suppress(ImpossibleEvent, LeaseBusy):  # closed first / still live
        await recorder.append(closing, barrier=True, lapsed=not holder_gone, deadline=deadline)
    return await recorder.record(record.invocation_id)


def closing_event(record: Record, stage: str) -> Event | None:
    """The event that closes a non-final ``record`` with exactly what it proves, when its call
    cannot go on (``stage``: why -- the broker stopped, the journal refused a write); None when
    the record is not in a state such an event can close.  It names the record's generation:
    should another worker take the next lease before it is appended (retry_pending allows it),
    the projection refuses it instead of ending that worker's attempt."""
    fenced = fenced_close(record)
    if fenced is not None:
        # A fence's record, found between its two writes: closed as the fence closes it -- a
        # SETUP_FAILED here let a same-request call take a retry lease in it and send.
        return fenced
    iid = record.invocation_id
    gen = record.generation
    if record.state in _BEFORE_DISPATCH:
        # The current attempt never reached its own DISPATCH_STARTED (that would have moved
        # the state to ``dispatched``): its worker stopped before it, or while it resolved the
        # credential (``validated``: a retry after setup_failed starts there), or right after
        # the record was taken (``accepted``) -- nothing of it was sent.  In ``retry_pending``
        # an *earlier* attempt did, so ``dispatch_started`` is already true and the outcome
        # stays unknown (retry_setup_failed); ATTEMPT_INTERRUPTED is impossible there and
        # would leave the record IN_PROGRESS for ever.
        earlier = bool(record.evidence.get("dispatch_started"))
        return Event(
            E.SETUP_FAILED,
            iid,
            {
                "code": Code.SETUP_FAILED.value,
                "stage": stage,
                "message": _BEFORE_DISPATCH_MESSAGE[stage, earlier],
                "generation": gen,
            },
        )
    if record.evidence.get("dispatch_started") and record.outcome is Outcome.UNKNOWN:
        return Event(
            E.ATTEMPT_INTERRUPTED,
            iid,
            with_boot_mark(
                {
                    "code": Code.REMOTE_OUTCOME_UNKNOWN.value,
                    "message": _AFTER_DISPATCH[stage],
                    "generation": gen,
                }
            ),
        )
    if record.state == "completed_committed" or record.state == "completed_rejected":
        # A complete result was recorded but never stored: keep the proven outcome, never
        # re-run (seed: "Storing the result can fail after remote execution ... not a retry of
        # the remote action").
        return Event(E.RESULT_STORE_FAILED, iid, {"stage": stage, "generation": gen})
    return None


async def journal_refused(
    recorder: Recorder, iid: str | None, error: JournalWriteError, holder: str
) -> dict[str, Any]:
    """The envelope of a call the journal stopped (disk full, I/O error): what the durable
    events prove, its attempt closed like a stopped broker's would be -- durably if the journal
    takes that one small write, else in memory only, as the same closing recovery will write
    later.  Nothing durable at all means the journal is unusable: ``error`` is raised again.

    Only the call's own attempt is closed (``Recorder.attempt``: the generation it runs, under
    ``holder``): a call that resumes after its lease ran out (a journal away past it, then
    ``CommitUnknown``) may find the record taken over by another worker's attempt, which is not
    this failure's to end -- closed, it read ``interrupted`` while that worker's request was in
    flight.  Such a call is answered LEASE_LOST from the record; one that took no attempt (it
    failed before, or taking one) with the record as it stands."""
    recorder.forget()
    if iid is None:
        raise error
    attempt = recorder.attempt()
    events = recorder.journal.events
    # Read as a call reads (``Recorder.read``): a shared journal away within its reconnect
    # window is waited out.
    durable = await recorder.read(lambda: events(iid))
    if not durable:
        raise error
    # Its hint at the clock the key's retention is recorded in (``Recorder.hint_now``: the
    # database's on a shared journal), as every other answer's.  By this broker's own clock
    # one running ahead answered ``reconcile`` for a key still well within retention.
    now = await recorder.read(recorder.hint_now)
    record = recorder.projected(durable, now)
    mine = _open_attempt(durable, record, iid, attempt, holder)
    closing = None if mine is None else closing_event(record, "journal")
    if closing is None:
        return _answer(recorder, durable, record, iid, attempt, holder)
    try:
        await recorder.append(closing, barrier=True)
    except JournalWriteError:
        recorder.forget()
        durable = await recorder.read(lambda: events(iid))
        if recorder.doubted(iid) and not project(durable, now).evidence.get("dispatch_started"):
            # The call's DISPATCH_STARTED, its commit unknown, may still land: the close did
            # not take the chain head (a shared journal's bounded wait for it ran out), so
            # nothing read under the head says it will not.  Not not_attempted on a read that
            # misses it: the call is not recorded, and its record tells once the journal is
            # back.
            raise CallNotRecorded(iid) from error
        record = recorder.projected(durable, now)
        if _open_attempt(durable, record, iid, attempt, holder) is None:
            return _answer(recorder, durable, record, iid, attempt, holder)  # taken over
        return recorder.envelope(recorder.projected([*durable, closing], now))
    except ImpossibleEvent:
        # Someone else closed the attempt first, or took the invocation over: the record, as
        # it stands, is the answer (folding the refused event in would be refused again).
        recorder.forget()
        durable = await recorder.read(lambda: events(iid))
        record = recorder.projected(durable, now)
        return _answer(recorder, durable, record, iid, attempt, holder)
    return recorder.envelope(await recorder.record(iid))


def _open_attempt(
    events: list[Event], record: Record, iid: str, attempt: tuple[str, int] | None, holder: str
) -> int | None:
    """The generation of ``attempt`` -- the one a call runs (``Recorder.attempt``) -- if it is
    ``record``'s current, open attempt under ``holder``; else None: it took none, or another
    worker's attempt (a newer lease, or another task of this broker) is the record's now, or
    it is closed already."""
    if attempt is None or attempt[0] != iid or record.final:
        return None
    generation = attempt[1]
    if record.generation != generation or _holder(events) != holder:
        return None
    return generation


def _answer(
    recorder: Recorder,
    events: list[Event],
    record: Record,
    iid: str,
    attempt: tuple[str, int] | None,
    holder: str,
) -> dict[str, Any]:
    """A failed call's envelope when its attempt is not the record's to close: LEASE_LOST from
    the record when another attempt took the invocation over from the call's own
    (``lease_lost_error``: the record's phase and outcome, no result of another attempt's as
    if it were this call's); the record as it stands when the call ran no attempt of it, or
    its attempt is the record's last (closed already).  The record's attempt is the call's
    only under ``holder`` as well (``_open_attempt``): a take-over of generation 0 wins the
    record's first event at the call's own generation, and that record holds nothing of the
    call's -- its first event was refused, and so was every later write (its gate included)."""
    if attempt is None or attempt[0] != iid:
        return recorder.envelope(record)
    generation = attempt[1]
    if _holder(events) != holder:
        # What the record says of the call's generation is the call's only if the call held
        # it: a taker of generation 0 dispatched in its own name, not the binder's.
        dispatched = (
            generation != record.generation
            and _holder_at(events, generation) == holder
            and _dispatched(record, generation)
        )
    elif generation == record.generation:
        return recorder.envelope(record)
    else:
        dispatched = _dispatched(record, generation)
    return recorder.envelope(record, lost=generation, dispatched=dispatched)


def _dispatched(record: Record, generation: int) -> bool:
    return any(a["generation"] == generation and a["stage"] == "dispatch" for a in record.attempts)


INTERNAL_CLOSE_WAIT: Final = 5.0
"""Seconds ``internal_close`` waits for the journal at most: no longer than a stopping daemon
waits for its stopped calls to record where they stood (``Calls.drain``: at least 5 s)."""


async def internal_close(recorder: Recorder, iid: str | None, holder: str) -> None:
    """Close at once the record of a call that a failure inside the broker (a bug, not the
    journal's) ended without an envelope, with what its events prove and that cause (``stage``
    ``internal``) -- never left open until its lease runs out, to be closed then as if the
    broker had stopped.  Only the attempt the call runs (``Recorder.attempt``: its
    generation, still the record's and under ``holder`` -- the broker's, which every task of
    it shares) and whose state the record proves: one whose DISPATCH_STARTED may yet land
    (``doubted``) without being read is left to recovery, as is any failure of this close
    (the original failure is the caller's answer either way).  The call's queued diagnostic
    events (its preflight's, before its first barrier) are waited for first: read without
    them, the record would not be found.

    Shielded from its caller (``Engine._answered``), so bounded here: a journal that has not
    answered within ``INTERNAL_CLOSE_WAIT`` is waited for no more -- a hung write held the
    call, and a stopping daemon's shutdown, for as long as it hung.  What was queued goes on
    unwaited: the close lands, or the record stays open for recovery, which closes it with
    what the journal then proves (``recover_stale``: its lease ran out, or the broker stopped
    if it restarts first) -- logged, naming the invocation.  Nothing of it is claimed to the
    caller either way."""
    with trio.move_on_after(INTERNAL_CLOSE_WAIT) as bound:
        try:
            await recorder.settle(cancellable=True)
            if iid is None:
                return
            events = await recorder.read(lambda: recorder.journal.events(iid))
            now = await recorder.read(recorder.hint_now)
            record = recorder.projected(events, now)
            if _open_attempt(events, record, iid, recorder.attempt(), holder) is None:
                return  # another worker's attempt (or none): not this failure's to close
            if recorder.doubted(iid) and not record.evidence.get("dispatch_started"):
                return
            closing = None if record.final else closing_event(record, "internal")
            if closing is not None:
                with contextlib.suppress(ImpossibleEvent):  # closed first, or taken over
                    await recorder.append(closing, barrier=True, cancellable=True)
        except JournalError:
            recorder.forget()  # the record stays as durable: recovery closes it later
    if bound.cancelled_caught:
        recorder.forget()  # the journal did not answer in time: as above
        if iid is not None:
            log.warning(
                "the close of %s was not answered by the journal within %s s: left to "
                "recovery once its lease runs out",
                iid,
                INTERNAL_CLOSE_WAIT,
            )


def _holder(events: list[Event]) -> str | None:
    """Who took the record's current lease (its first attempt's, or the last one taken)."""
    holder = None
    for ev in events:
        if ev.kind is E.ACTION_ACCEPTED or ev.kind in _LEASES:
            holder = ev.attrs.get("holder")
    return holder


def _holder_at(events: list[Event], generation: int) -> str | None:
    """Who held ``generation``: the first event's holder for 0, else the lease event's that
    took it (None: no one did)."""
    for ev in events:
        if generation == 0 and ev.kind is E.ACTION_ACCEPTED:
            return ev.attrs.get("holder")
        if ev.kind in _LEASES and ev.attrs.get("generation") == generation:
            return ev.attrs.get("holder")
    return None


def _nothing_sent(keyed: bool) -> str:
    """What a call the journal ended before it named an invocation sent: nothing -- but with an
    idempotency_key, an earlier call under it may have run (its binding unread), so "nothing was
    sent" would claim more than this request's own record proves."""
    if keyed:
        return "this request sent nothing; an earlier call under its idempotency_key may have run"
    return "nothing was sent"


def carries_key(action: object) -> bool:
    """Whether the caller's ``action`` (its JSON, unparsed) carries an idempotency_key: ended
    before it named an invocation, it is worded so (``_nothing_sent``).  A plain dict is
    told apart first: ``isinstance`` against the ``Mapping`` ABC on every call was a check
    tests/broker/test_loop_frames.py keeps out of a warm call (issue 15)."""
    if type(action) is not dict and not isinstance(action, Mapping):
        return False
    return action.get("idempotency_key") is not None


def unrecorded(invocation_id: str | None, keyed: bool = False) -> str:
    """What a caller is told when the journal could not record its call, so that no envelope
    can be rendered from a durable record (the daemon's 503 JOURNAL_UNAVAILABLE, and
    ``CallNotRecorded``): which invocation, and where its record says -- once the journal is
    back -- whether it was sent; never more.  ``None``: the call wrote nothing, so it sent
    nothing (a dispatch is preceded by its durable DISPATCH_STARTED); ``keyed``: the call
    carries an idempotency_key (``_nothing_sent``)."""
    if invocation_id is None:
        return (
            f"the journal could not record the call before it was accepted: {_nothing_sent(keyed)}"
        )
    return (
        f"the journal could not record the call ({invocation_id}: `affidavit result "
        f"{invocation_id}` once it is back tells whether it was sent)"
    )


def internal_failure(
    name: str, invocation_id: str | None, fetch: str = "`affidavit result {}`"
) -> tuple[int, str, str]:
    """A call that ended without an envelope for a reason not the journal's (a bug: ``name``,
    the exception's type only -- its text may quote remote bytes), as every surface answers it:
    500 INTERNAL, naming the invocation once one was recorded, so that its caller finds it --
    whose record says whether it was sent (closed at once by ``internal_close`` with what its
    events prove: unknown if dispatched), never more.  ``fetch``: how the surface's caller reads
    it (``{}``: the id) -- the CLI's and the daemon's ``affidavit result``, MCP's
    ``fetch_result``.  ``None``: the call wrote nothing (``Engine._answered`` names the
    invocation it last wrote for), so nothing was sent."""
    if invocation_id is None:
        where = "before anything was recorded: nothing was sent"
    else:
        where = f"{invocation_id}: {fetch.format(invocation_id)} tells whether it was sent"
    return 500, "INTERNAL", f"the call failed inside the broker ({name}; {where})"


def unreadable(invocation_id: str) -> str:
    """What a caller is told when a read of an invocation (a fetch) found a shared journal
    away beyond its reconnect window (JOURNAL_UNAVAILABLE): the record is unread, not wrong."""
    return (
        f"the journal cannot be read now ({invocation_id}); a fetch sends nothing -- fetch it "
        "again once the journal is back"
    )


def unread(what: str) -> str:
    """What a caller is told when a read (a record, a view) found a shared journal away
    beyond its reconnect window (JOURNAL_UNAVAILABLE): ``what`` could not be read -- unread,
    not wrong; a read changes nothing, so reading again once the journal is back is safe."""
    return f"the journal cannot be read now ({what}); read it again once the journal is back"


def read_failure(exc: Exception, what: str, *, operator: bool = False) -> tuple[int, str, str]:
    """A read of ``what`` the journal could not answer, as every surface answers it: (HTTP
    status, code, message) -- 503 JOURNAL_UNAVAILABLE (``unread``) when a shared journal is
    away beyond ``[journal] reconnect``, 503 ``READ_DECLINED`` with the database's words when it
    declined the read this once (``ReadFailed``: a statement timeout, a lock not granted; the
    same read may succeed), 503 ``JOURNAL_REPLACED`` with the journal's words when the file at
    its path is no longer the one the broker writes (``JournalReplaced``: nothing read; it
    lasts until the broker is restarted), else 500 ``UNREADABLE`` with the journal's own
    one-line words (altered, refused): never blurred -- those a caller may read (``told``: a
    key file refused, without its owner's uid or an ACL entry's).  ``operator``: the answer is
    the operator's own (the command line, run here): the journal's whole words, paths and uids
    included -- they are what the operator mends."""
    if isinstance(exc, JournalUnavailable):
        return 503, CallNotRecorded.code, unread(what)
    if isinstance(exc, JournalReplaced):
        return 503, JournalReplaced.code, f"{exc} ({what} not read)"
    if isinstance(exc, ReadFailed):
        return 503, READ_DECLINED, f"{exc} (the same read may succeed: try again)"
    return 500, UNREADABLE, str(exc) if operator else told(exc)


def result_failure(
    exc: Exception, invocation_id: str, *, operator: bool = False
) -> tuple[int, str, str]:
    """A read of the stored result of ``invocation_id`` (``fetch_result``, ``result --raw``)
    that ended in a ``JournalError``, as every surface answers it, embedded or through the
    daemon: (HTTP status, code, message).  The record unread (a shared journal away): 503
    JOURNAL_UNAVAILABLE (``unreadable``); declined this once or a row altered in place:
    ``read_failure``; else a stored result that fails its verification: 500
    ``RESULT_UNVERIFIED`` with the journal's words -- never its bytes.  ``operator``: as
    ``read_failure``'s."""
    if isinstance(exc, JournalUnavailable):
        return 503, CallNotRecorded.code, unreadable(invocation_id)
    if isinstance(exc, (ReadFailed, AlteredRow, JournalReplaced)):
        return read_failure(exc, f"the result of {invocation_id}", operator=operator)
    return 500, RESULT_UNVERIFIED, str(exc) if operator else told(exc)


def call_failure(
    exc: Exception, invocation_id: str | None, keyed: bool = False
) -> tuple[int, str, str]:
    """A call that ended without an envelope because of the journal, as every surface answers
    it: (HTTP status, code, message).  A row the journal proves altered (``AlteredRow``: a
    removed idempotency binding, a changed event) is 500 JOURNAL_UNREADABLE with the journal's
    own words -- no outage that passes: the same call meets it again until an operator restores
    the journal, and a retry told "unavailable" would only repeat it.  Anything else (a write
    not committed, a shared journal away): 503 JOURNAL_UNAVAILABLE (``unrecorded``) -- except a
    read the database declined this once (``ReadFailed``: a statement timeout, a lock not
    granted), which is 503 JOURNAL_READ_DECLINED, as every read answers it: the journal is not
    away, and reading the record again may succeed.  A stored result the call answers with (a
    same-key call replaying it) that fails its verification (``ResultUnverified``) is 500
    RESULT_UNVERIFIED with the journal's words, as a fetch of it is (``result_failure``):
    never the result, nor an outage that passes -- the same call meets it again.  The file at
    the journal's path no longer the one the broker writes (``JournalReplaced``, refused before
    its transaction began): 503 JOURNAL_REPLACED with the journal's words and the invocation:
    one refused past its dispatch may have been sent, and its record is in the file the
    broker held.  ``keyed``: the call carries an idempotency_key (``unrecorded``)."""
    if isinstance(exc, JournalReplaced):
        if invocation_id is None:
            where = f"before the call was accepted: {_nothing_sent(keyed)}"
        else:  # its record, whatever it says, is in the file the broker held, not at the path
            where = f"{invocation_id}: whether it was sent is recorded in the file this broker held"
        return 503, JournalReplaced.code, f"the call ended without an envelope: {exc} ({where})"
    if isinstance(exc, ResultUnverified):
        return (
            500,
            RESULT_UNVERIFIED,
            f"the call ended without an envelope: {exc} (`affidavit journal verify` lists what "
            "was altered)",
        )
    if isinstance(exc, ReadFailed):
        if invocation_id is None:
            where = f"before the call was accepted: {_nothing_sent(keyed)}"
        else:
            where = f"{invocation_id}: `affidavit result {invocation_id}` tells whether it was sent"
        return 503, READ_DECLINED, f"the call ended without an envelope: {exc} ({where})"
    if isinstance(exc, AlteredRow):
        return (
            500,
            UNREADABLE,
            f"the call ended without an envelope: {exc} (`affidavit journal verify` lists what "
            "was altered)",
        )
    return 503, CallNotRecorded.code, unrecorded(invocation_id, keyed)


def act_failure(
    exc: Exception, what: str, act: str, check: str, *, operator: bool = False
) -> tuple[int, str, str]:
    """An operator's act (a decision, an attestation, a reconciliation query) the journal
    could not take, as every surface answers it: (HTTP status, code, message).  A call of its
    own not recorded (a query: ``CallNotRecorded``): its words.  The act's write failed (a
    shared journal away beyond ``[journal] reconnect``, perhaps while committing): 503
    JOURNAL_UNAVAILABLE -- ``act`` may or may not be recorded; ``check``, once the journal is
    back, tells which.  A read failed (``what``, before anything was written): as
    ``read_failure`` -- as is a refusal of the act's write because the file at the journal's
    path is not the one the broker writes (``JournalReplaced``: nothing written).  The stored
    result of the act's own call (a poll's, a query's) failing its verification
    (``ResultUnverified``, a sealed summary or chunk the broker key does not open among them)
    is 500 RESULT_UNVERIFIED with the journal's words, as a fetch of it and a same-key call
    replaying it are: a verdict on the stored bytes, not a journal that cannot be read --
    nothing of it is read, so nothing of it is folded into what ``act`` would have recorded.
    ``operator``: as ``read_failure``'s (the command line, run here: the journal's whole words)."""
    if isinstance(exc, CallNotRecorded):
        return 503, CallNotRecorded.code, str(exc)
    if isinstance(exc, ResultUnverified):
        return (
            500,
            RESULT_UNVERIFIED,
            f"{exc} (nothing of it is taken into {act}; {check} tells what is recorded, "
            "`affidavit journal verify` what was altered)",
        )
    if isinstance(exc, JournalReplaced):
        return read_failure(exc, what, operator=operator)
    if isinstance(exc, JournalWriteError):
        return (
            503,
            CallNotRecorded.code,
            f"the journal could not record {act} ({check} once it is back tells whether it was)",
        )
    return read_failure(exc, what, operator=operator)


READ_DECLINED = "JOURNAL_READ_DECLINED"
"""The code for a read the database declined this once (``ReadFailed``)."""
RESULT_UNVERIFIED = "RESULT_UNVERIFIED"
"""The code for a stored result that fails its verification (a chunk, its marker or summary
altered): never its bytes."""
UNREADABLE = "JOURNAL_UNREADABLE"
"""The code for a read the journal refused for another reason than being away (a table or a
row altered, a database the broker may not read): a fault of the journal, not of its network,
which reading again will not mend -- never called JOURNAL_UNAVAILABLE."""


class CallNotRecorded(JournalUnavailable):
    """A shared journal's database went away during a call and stayed away beyond ``[journal]
    reconnect``: the call's record cannot be read, so it has no envelope (``Engine.call``
    raises this instead of the error of whichever read failed last).  ``invocation_id`` names
    the call (None: it wrote nothing); once the journal is back, its record -- closed by
    recovery when the call's lease has run out -- says what was sent.  ``keyed``: the call
    carries an idempotency_key (``unrecorded``).  ``code`` is what the
    daemon answers such a call with (503), and MCP with an ``api_error``."""

    code = "JOURNAL_UNAVAILABLE"

    def __init__(self, invocation_id: str | None, keyed: bool = False) -> None:
        self.invocation_id = invocation_id
        super().__init__(unrecorded(invocation_id, keyed))


READ_RETRY_AFTER = 1
"""``Retry-After`` (seconds) of a read declined this once (503 ``JOURNAL_READ_DECLINED``)."""
UNAVAILABLE_RETRY_AFTER = 5
"""``Retry-After`` (seconds) of a read a shared journal could not answer, its database away
beyond ``[journal] reconnect`` (503 ``JOURNAL_UNAVAILABLE``): the broker already tried that
long, so sooner would mostly meet the same outage; a small constant, not a promise."""
READ_RETRY: Final = {
    READ_DECLINED: READ_RETRY_AFTER,
    CallNotRecorded.code: UNAVAILABLE_RETRY_AFTER,
}
"""``Retry-After`` of a read's answer, by its code (the daemon's ``_journal_problem``, the
console's read pages): only the journal's transient refusals.  Not ``JOURNAL_REPLACED`` (the
file at the path is not the one the broker writes: only a restart mends it), nor a 500
(altered, unverified: the same read meets it again).  A call's or an act's answer never carries
one (the daemon's ``Api.calls``, ``operators.act_problem``; the console's decisions): it may
have been recorded or sent, and resending it is the caller's decision from its record, not a
timer's."""
