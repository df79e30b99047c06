"""Polling an operation: a linked invocation queries the job's status resource, and the answer
moves the operation (statemachine/operation.py) -- or, when there is no readable answer, leaves
it where it was.  Readable means a complete successful answer whose body is whole (not withheld,
not truncated) and whose final hop is on the target's origin (``readable.py``).

Seed: "Record the job identifier and its status resource returned by the service, and then track
the job as a separate operation."  A poll is an ordinary invocation of the submission's target
(validation, credential injection, its own dispatch barrier and journal record, its own id),
linked both ways: its ACTION_ACCEPTED names the operation and the submission, and the
submission's OPERATION_POLLED names the poll.  What it read is evidence of source
``remote_query`` about the job -- never a rewrite of the submission, whose outcome (the job was
accepted) stays as recorded.  A poll never re-sends the submission.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from affidavit.protocols.actions import ActionInvalid, parse_action
from affidavit.statemachine import (
    Event,
    EventKind,
    EvidenceSource,
    ImpossibleEvent,
    Record,
    invocation_of,
    operation_json,
)
from affidavit.text import echoed

from .approval import needs_approval
from .contracts import contracts_of
from .delivery import Deliver, deliver_linked, linked_deliver, taken_up
from .ids import new_invocation_id
from .readable import unreadable
from .recovery import act_failure
from .takeup import (
    ClaimRefused,
    Close,
    claim_expiry,
    claimed_since,
    claimed_until,
    closed_by,
    still_open,
    superseded,
    take_up,
)

if TYPE_CHECKING:
    from .control import CallControl
    from .engine import Engine

__all__ = ["OperationError", "find", "poll", "poll_failure"]

E = EventKind


class OperationError(Exception):
    """No such operation, or it cannot be queried (its message says why, for the operator).
    ``field``: ``"operation_id"`` when the id names no operation -- the one case where the
    caller should correct what it sent (the daemon's 422 names it, MCP answers INVALID_FIELD
    there); ``"targets.<name>"`` when the target now reaches another account than the
    submission did (the operator's setting to look at); None when the operation exists but
    cannot be queried now.  ``code``/``status``: ``OPERATION_ERROR`` (422), ``POLL_TOO_SOON``
    (429: polled less than its target's ``operations.min_poll_interval`` ago -- poll again
    after ``retry_after`` seconds), or ``POLL_PENDING`` (409: an earlier poll of it awaits an
    operator or is being sent -- poll again later)."""

    def __init__(
        self,
        message: str,
        field: str | None = None,
        *,
        code: str = "OPERATION_ERROR",
        status: int = 422,
        retry_after: int | None = None,
    ) -> None:
        self.field = field
        self.code = code
        self.status = status
        self.retry_after = retry_after
        super().__init__(message)


def poll_failure(
    exc: Exception, op_id: str, *, operator: bool = False, check: str = "`affidavit operations`"
) -> tuple[int, str, str]:
    """A poll the journal could not take, as every surface answers it (``act_failure``): the
    poll's own call not recorded (``CallNotRecorded``'s words), its OPERATION_POLLED write
    failed -- 503 JOURNAL_UNAVAILABLE, ``check`` tells once the journal is back -- or the
    operation unread (503, or 500 JOURNAL_UNREADABLE); the poll's own stored answer failing
    its verification: 500 RESULT_UNVERIFIED, the operation as it was.  ``operator``: the
    command line's own poll (``act_failure``).  ``check``: how the surface's caller reads what
    was recorded -- the command line's ``affidavit operations``, the submission's record to
    the daemon's callers (``daemon.operators.RECORD_CHECK``), MCP's ``get_record`` of it
    (``mcp.backends``); ``{0}`` in it: the submission, whose record holds the polls."""
    check = check.format(invocation_of(op_id) or op_id)  # its polls are on that record
    return act_failure(
        exc, f"the operation {op_id}", f"the poll of {op_id}", check, operator=operator
    )


def find(engine: Engine, op_id: str, *, operator: bool) -> Record:
    """The submitting invocation's record of ``op_id``; ``OperationError`` if there is none --
    and, unless ``operator`` (an operator's channel), if its submission is one a caller may not
    read (``Engine.callable_by_caller``: on a target the configuration no longer names, or
    another broker's on a shared journal): the same words as for an id that names nothing, so
    that neither its existence nor its state (an ended job answered whole) can be probed."""
    iid = invocation_of(op_id)
    record = engine.journal.record(iid) if iid is not None else None
    if record is None or record.operation is None or record.operation["id"] != op_id:
        record = None
    if record is None or not (operator or engine.callable_by_caller(record)):
        raise OperationError(f"no operation {echoed(op_id)} in the journal", "operation_id")
    return record


async def poll(
    engine: Engine,
    op_id: str,
    *,
    timeout: float | None = None,
    control: CallControl | None = None,
    requester: int | None = None,
    deliver: Deliver | None = None,
    operator: bool = False,
) -> dict[str, Any]:
    """Query the job's status resource once (unless the operation is already succeeded or
    failed); return ``{"operation": ..., "poll": the poll's envelope or None}``, and
    ``"refused"`` (``{code, message}``, ``_poll_refused``) when the row leaving the poll open
    was refused: another asker closed it meanwhile and opened another.  The poll is
    a call like any other: a target whose approval policy covers it waits for an operator
    first (``requester`` asked: it may not approve its own poll).  ``deliver``: the surface's
    (the daemon's answer, MCP's), through which that answer is written -- the poll's result is
    recorded delivered only once it was written whole (``deliver_linked``); None: returned
    in-process, which is the transfer.  ``operator``: ``find``'s."""
    record = find(engine, op_id, operator=operator)
    op = record.operation
    assert op is not None
    if op["state"] != "pending":
        return await deliver_linked(
            engine, {"operation": operation_json(record), "poll": None}, None, deliver
        )
    target = engine.config.targets.get(record.target or "")
    contracts = contracts_of(target) if target is not None else None
    if target is None or contracts is None or target.kind != record.protocol:
        raise OperationError(f"the target of {op_id} is no longer configured as it was")
    # The submission's PREFLIGHT_VALIDATED (its one, before the job was accepted): read through
    # ``accepted_seq``, never the polls recorded since.  (``find`` still folds the whole record
    # unless this writer's copy of it is current: ``Journal.record``.)
    accepted = op.get("accepted_seq")
    through = accepted if isinstance(accepted, int) else None
    moved = await engine.snapshot.moved(
        engine.journal.events(record.invocation_id, through=through), target
    )
    if moved is not None:
        # The poll runs against the target as configured now: another origin, credential or
        # scope reads another account's job (ConfigSnapshot.moved).  Nothing is sent.
        raise OperationError(
            f"the target {target.name} may no longer reach what {op_id} was submitted to: "
            f"{moved}; nothing was polled",
            f"targets.{target.name}",
        )
    try:
        action = dict(contracts.poll(target, op))
    except ValueError as exc:
        raise OperationError(str(exc)) from None
    interval = contracts.min_poll_interval(target)
    if op.get("open_poll") is None:  # one open is taken up: nothing new is asked
        ended = _paced_or_ended(engine, record, op_id, interval, operator)
        if ended is not None:
            return await deliver_linked(engine, ended, None, deliver)
    if record.session is not None:
        action["session"] = record.session
    link = {"operation": op_id, "invocation": record.invocation_id}
    # A poll still open is taken up, never asked for twice (``takeup``).
    envelope = await _earlier(engine, record, op_id, target, control, timeout)
    asked = envelope is not None
    # The poll this request runs, or one it took up that its asker asked: its delivery is this
    # answer's.
    ran = None if envelope is None else await taken_up(engine, envelope, requester)
    if envelope is None and op.get("open_poll") is not None:
        # The open poll was never sent (``take_up`` closed it): this one asks anew, paced.
        ended = _paced_or_ended(engine, record, op_id, interval, operator, closed=True)
        if ended is not None:
            return await deliver_linked(engine, ended, None, deliver)
    if envelope is None:
        poll_id = new_invocation_id()
        claim = None
        if _covered(engine, action):  # one poll at a time: named in its first write
            claim, asked = _claim(engine, record, op_id, poll_id, target), True
        try:
            envelope = await engine.call(
                action,
                timeout=timeout,
                link=link,
                control=control,
                requester=requester,
                invocation_id=poll_id,
                claim=claim,
                deliver=linked_deliver(deliver),
            )
        except ClaimRefused:
            await _refused(engine, record, op_id)
            # Ended since it was read: answered as a read a moment later would have been.
            answer = {
                "operation": operation_json(find(engine, op_id, operator=operator)),
                "poll": None,
            }
            return await deliver_linked(engine, answer, None, deliver)
        ran = poll_id
    still = asked and still_open(envelope)  # the next poll takes it up
    refused = await _record_poll(
        engine, record.invocation_id, op_id, envelope, target, contracts, still
    )
    answer = {"operation": operation_json(find(engine, op_id, operator=operator)), "poll": envelope}
    if refused is not None:
        answer["refused"] = refused
    return await deliver_linked(engine, answer, ran, deliver)


def _paced_or_ended(
    engine: Engine,
    record: Record,
    op_id: str,
    interval: float,
    operator: bool,
    *,
    closed: bool = False,
) -> dict[str, Any] | None:
    """``paced``; when it refuses, the record read again: an operation no longer pending (a
    poll in flight here, or another broker's, recorded its end since ``record`` was read --
    ``moved`` may have hopped to a thread meanwhile) is answered as it now stands, never
    ``POLL_TOO_SOON`` with the state of an out-of-date read.  None: the poll may go on.
    ``closed``: ``take_up`` just closed the open poll, never sent (its row written)."""
    try:
        paced(engine, record, op_id, interval, closed=closed)
    except OperationError as exc:
        if exc.code != "POLL_TOO_SOON":
            raise
        now = find(engine, op_id, operator=operator)
        if (now.operation or {}).get("state") == "pending":
            raise
        return {"operation": operation_json(now), "poll": None}
    return None


def paced(
    engine: Engine, record: Record, op_id: str, interval: float, *, closed: bool = False
) -> None:
    """``POLL_TOO_SOON`` (429, ``retry_after``: whole seconds) when the operation's status
    resource was asked less than ``interval`` seconds ago (its target's
    ``operations.min_poll_interval``), before anything is asked or written; else this broker's
    next poll of it is due ``interval`` from now.  Every poll adds to its submission's record,
    so it grows by at most a poll per interval of the job's life (audit 50) -- bounding the
    rate, not the count, leaves no poll refused for good, and no caller can spend another's:
    any caller's poll, past the interval, learns the job's state for all, on the same record.
    Two clocks: this broker's polls in flight (``Engine.poll_due``, set before any await, so
    that concurrent polls here are paced too) and the record's last poll row, whoever wrote it
    (``at``, another broker's or the command line's on a shared journal; a row labelled in the
    future by a skewed clock holds a poll back by ``interval`` at most).  The answer is the
    record's, never fresher: a job still pending, as its last poll left it.  ``closed``: the
    open poll, never sent, was closed just before (one row): the message says so."""
    now = time.monotonic()
    due = engine.poll_due
    wait = due.get(op_id, now) - now
    at = _last_poll_at(engine, record)
    if at is not None:
        wait = max(wait, min(interval, at + interval - time.time()))
    if wait > 0:
        after = max(1, math.ceil(wait))
        state = (record.operation or {}).get("state")
        done = (
            "nothing was asked; the unsent poll was closed"
            if closed
            else "nothing was asked or sent"
        )
        raise OperationError(
            f"{op_id} was polled less than {interval:g} s ago (the target's "
            f"operations.min_poll_interval); {done}. Its state as last "
            f"polled: {state} (its submission's record). Poll again in {after} s",
            code="POLL_TOO_SOON",
            status=429,
            retry_after=after,
        )
    if len(due) >= DUE_KEPT:  # the lapsed go first: a due time past is no bound
        for key in [k for k, t in due.items() if t <= now]:
            del due[key]
    due[op_id] = now + interval


DUE_KEPT = 1024
"""``Engine.poll_due``'s length past which its lapsed entries are dropped."""


def _last_poll_at(engine: Engine, record: Record) -> float | None:
    """The time label of the row that recorded the operation's last poll (``last_poll``): one
    seek of the rows naming that poll (``events_naming``), not the record's length."""
    last = (record.operation or {}).get("last_poll")
    if not isinstance(last, Mapping) or not isinstance(last.get("invocation_id"), str):
        return None
    for event in engine.journal.events_naming(record.invocation_id, last["invocation_id"]):
        if event.seq == last.get("seq"):
            return event.at
    return None


ASKING = (
    "the poll is being asked (the target's approval policy covers it): until its answer is "
    "read, a poll of this operation takes it up instead of asking again"
)
"""The reason of the row that names a poll before it is asked -- stable text."""
UNSENT = "the poll was not sent (denied, expired, cancelled, or never asked): a new one is asked"
"""The reason of the row that closes an open poll nothing was sent for -- stable text."""


def _covered(engine: Engine, action: Mapping[str, Any]) -> bool:
    """Whether the target's approval policy covers the poll (it may wait for an operator)."""
    try:
        parsed = parse_action(action, engine.config)
    except ActionInvalid:
        return False  # refused by the call itself, before anything is asked
    return needs_approval(parsed, engine.config.targets[parsed.target]) is not None


def _pending(op_id: str, poll_id: str) -> Callable[[str], OperationError]:
    def refusal(doing: str) -> OperationError:
        return OperationError(
            f"the poll {poll_id} of {op_id} {doing}; nothing more was asked or sent. Poll "
            "again once it is decided (or answered)",
            code="POLL_PENDING",
            status=409,
        )

    return refusal


def _claim(engine: Engine, record: Record, op_id: str, poll_id: str, target: Any) -> Event:
    """The row naming ``poll_id`` as the operation's one open poll, for the head of the poll's
    first write (``Engine.call``'s ``claim``; ``takeup``): refused, nothing of the poll is
    written (``ClaimRefused``, answered by ``_refused``)."""
    attrs = {"operation_id": op_id, "poll_invocation": poll_id, "code": None, "reason": ASKING}
    expiry = {"open": True, "expires_at": claim_expiry(engine, target)}  # ``takeup``
    return Event(E.OPERATION_POLL_FAILED, record.invocation_id, {**attrs, **expiry})


async def _refused(engine: Engine, record: Record, op_id: str) -> None:
    """A poll's claim was refused, nothing of the poll written: POLL_PENDING when another
    asker's poll is open (it was first, in any process), or was and has closed since the
    refusal (read a moment too late to name it: poll again, a new one is asked); returns when
    the job ended since ``record`` was read (nothing to ask)."""
    op = (await engine.recorder.record(record.invocation_id)).operation or {}
    current = op.get("open_poll")
    if op.get("state") != "pending":
        return  # the job ended meanwhile (another poll read it): nothing to ask
    if current is None:
        raise OperationError(
            f"another poll of {op_id} was open when this one was named, and has closed since; "
            "nothing more was asked or sent. Poll again",
            code="POLL_PENDING",
            status=409,
        )
    raise _pending(op_id, current)("is being asked")


async def _earlier(
    engine: Engine,
    record: Record,
    op_id: str,
    target: Any,
    control: CallControl | None,
    timeout: float | None,
) -> dict[str, Any] | None:
    """The answer of the operation's open poll, taken up (``takeup``); None when none is open."""
    op = record.operation or {}
    poll_id = op.get("open_poll")
    if not isinstance(poll_id, str):
        return None
    iid = record.invocation_id
    # The rows naming the poll alone (not the operation's earlier polls); the record once when
    # ``linked_calls`` names no claim of the poll the chain says is open (a row of the derived
    # table removed: ``verify`` reports it) -- a claim missed would close the poll as unsent and
    # ask again.
    claim = _open_claim(engine.journal.events_naming(iid, poll_id), poll_id)
    if claim is None:
        claim = _open_claim(engine.journal.events(iid), poll_id)
    return await take_up(
        engine,
        poll_id,
        linked=lambda link: link.get("operation") == op_id and link.get("invocation") == iid,
        deadline=claimed_until(engine, target, claim),
        control=control,
        timeout=timeout,
        pending=_pending(op_id, poll_id),
        close=_closer(engine, record, op_id, poll_id),
    )


def _open_claim(events: Iterable[Event], poll_id: str) -> Event | None:
    """The first of ``events`` opening ``poll_id`` (its claim, ``_claim``); None if none."""
    for event in events:
        if event.attrs.get("poll_invocation") == poll_id and event.attrs.get("open"):
            return event
    return None


def _closer(engine: Engine, record: Record, op_id: str, poll_id: str) -> Close:
    async def close(code: str | None) -> None:
        """The row that closes an open poll nothing was sent for (unless another closed it)."""
        iid = record.invocation_id
        op = (await engine.recorder.record(iid)).operation or {}
        if op.get("open_poll") != poll_id:
            return
        attrs = {"operation_id": op_id, "poll_invocation": poll_id, "code": code}
        event = Event(E.OPERATION_POLL_FAILED, iid, {**attrs, "reason": UNSENT, "unsent": True})
        # Refused when the poll is no longer open here: the job ended, or another asker
        # closed this poll between the read above and this append -- nothing to close.
        with contextlib.suppress(ImpossibleEvent):
            await engine.recorder.append(event, barrier=True)

    return close


async def _record_poll(
    engine: Engine,
    iid: str,
    op_id: str,
    envelope: dict[str, Any],
    target: Any,
    contracts: Any,
    still: bool = False,
) -> dict[str, str] | None:
    """Fold the poll's answer into the operation -- only a complete, readable one moves it.
    ``still``: the poll stays open (it awaits an operator, or is being sent): the next poll
    takes it up.  Refused, what the record shows now (``_poll_refused``): ``{code, message}``
    for the answer's ``refused``, or None."""
    poll_iid = envelope["invocation_id"]
    attrs: dict[str, Any] = {"operation_id": op_id, "poll_invocation": poll_iid}
    if still:
        attrs["open"] = True
    event: Event
    error = envelope.get("error")
    stored = engine.journal.read_result(poll_iid) if error is None else None
    if error is not None or stored is None:
        # No complete successful answer (refused, unknown, a 404...): the job's state is what
        # it was.
        code = error["code"] if error is not None else None
        reason = "no complete successful answer from the status resource"
        event = Event(E.OPERATION_POLL_FAILED, iid, {**attrs, "code": code, "reason": reason})
    elif (why := unreadable(stored.summary, origin=getattr(target, "origin", None))) is not None:
        # A body withheld or cut (a gzip without its trailer) may still parse as a prefix
        # naming a state; an answer a redirect fetched from another origin is not the
        # status resource's.  Neither moves the job: it stays where it was, polled again.
        event = Event(E.OPERATION_POLL_FAILED, iid, {**attrs, "code": None, "reason": why})
    else:
        state, remote = contracts.poll_state(target, stored.summary, stored.streams.get("body"))
        if state is None:
            reason = "the status resource's answer names no state"
            event = Event(E.OPERATION_POLL_FAILED, iid, {**attrs, "code": None, "reason": reason})
        else:
            event = Event(
                E.OPERATION_POLLED,
                iid,
                {**attrs, "state": state, "remote_status": remote},
                source=EvidenceSource.REMOTE_QUERY,
            )
    try:
        await engine.recorder.append(event, barrier=True)
    except ImpossibleEvent as refused:
        return await _poll_refused(engine, iid, op_id, refused)
    return None


async def _poll_refused(
    engine: Engine, iid: str, op_id: str, refused: ImpossibleEvent
) -> dict[str, str] | None:
    """What the refused row of a poll that ran answers: ``POLL_SUPERSEDED`` when the row
    leaving the poll open (it awaits an operator, or is being sent) was refused because another
    asker closed the poll meanwhile and opened another, or the job ended meanwhile: the poll
    was asked (its record stays, linked) -- the message names the row that closed it (and the
    one that ended the job) and says only that this answer was not recorded
    (``takeup.superseded``).  None for any other row once the job is no longer pending --
    another poll finished first (the table refuses a move out of a terminal state; the journal
    holds the answer that counted, the operation shows it).  Any other refusal is raised: not
    a race, a bug."""
    event = refused.event
    op = (await engine.recorder.record(iid)).operation or {}
    poll_id = event.attrs.get("poll_invocation")
    opened = event.attrs.get("open") is True
    ended = op.get("state") != "pending"
    if ended and not opened:
        return None
    current = op.get("open_poll")
    if not opened or (current == poll_id and not ended):
        raise refused
    closer = closed_by(engine, iid, "poll_invocation", poll_id)
    end = _ended_by(engine, iid) if ended else None
    claimed = claimed_since(engine, iid, "poll_invocation", poll_id)
    now = None if ended else current
    text = superseded("poll", event, poll_id, closer, now, end, claimed=claimed)
    return {"code": "POLL_SUPERSEDED", "message": text}


def _ended_by(engine: Engine, iid: str) -> Event | None:
    """The row that ended the operation: the last OPERATION_POLLED (none may follow it)."""
    found = None
    for event in engine.journal.events(iid):
        if event.kind is E.OPERATION_POLLED:
            found = event
    return found
