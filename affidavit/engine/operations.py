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
from typing import TYPE_CHECKING, Any

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

from .contracts import contracts_of
from .readable import unreadable
from .recovery import act_failure

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
    cannot be queried now."""

    def __init__(self, message: str, field: str | None = None) -> None:
        self.field = field
        super().__init__(message)


def poll_failure(exc: Exception, op_id: str, *, operator: bool = False) -> tuple[int, str, str]:
    """A poll the journal could not take, as every surface answers it (``act_failure``): the
    poll's own call not recorded (``CallNotRecorded``'s words), its OPERATION_POLLED write
    failed -- 503 JOURNAL_UNAVAILABLE, ``affidavit operations`` tells once the journal is
    back -- or the operation unread (503, or 500 JOURNAL_UNREADABLE); the poll's own stored
    answer failing its verification: 500 RESULT_UNVERIFIED, the operation as it was.
    ``operator``: the command line's own poll (``act_failure``)."""
    return act_failure(
        exc,
        f"the operation {op_id}",
        f"the poll of {op_id}",
        "`affidavit operations`",
        operator=operator,
    )


def find(engine: Engine, op_id: str) -> Record:
    """The submitting invocation's record of ``op_id``; ``OperationError`` if there is none."""
    iid = invocation_of(op_id)
    record = engine.journal.record(iid) if iid is not None else None
    if record is None or record.operation is None or record.operation["id"] != op_id:
        raise OperationError(f"no operation {echoed(op_id)} in the journal", "operation_id")
    return record


async def poll(
    engine: Engine,
    op_id: str,
    *,
    timeout: float | None = None,
    control: CallControl | None = None,
    requester: int | None = None,
) -> dict[str, Any]:
    """Query the job's status resource once (unless the operation is already succeeded or
    failed); return ``{"operation": ..., "poll": the poll's envelope or None}``.  The poll is
    a call like any other: a target whose approval policy covers it waits for an operator
    first (``requester`` asked: it may not approve its own poll)."""
    record = find(engine, op_id)
    op = record.operation
    assert op is not None
    if op["state"] != "pending":
        return {"operation": operation_json(record), "poll": None}
    target = engine.config.targets.get(record.target or "")
    contracts = contracts_of(target) if target is not None else None
    if target is None or contracts is None or target.kind != record.protocol:
        raise OperationError(f"the target of {op_id} is no longer configured as it was")
    moved = engine.snapshot.moved(engine.journal.events(record.invocation_id), target)
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
    if record.session is not None:
        action["session"] = record.session
    link = {"operation": op_id, "invocation": record.invocation_id}
    envelope = await engine.call(
        action, timeout=timeout, link=link, control=control, requester=requester
    )
    await _record_poll(engine, record.invocation_id, op_id, envelope, target, contracts)
    return {"operation": operation_json(find(engine, op_id)), "poll": envelope}


async def _record_poll(
    engine: Engine, iid: str, op_id: str, envelope: dict[str, Any], target: Any, contracts: Any
) -> None:
    poll_iid = envelope["invocation_id"]
    attrs: dict[str, Any] = {"operation_id": op_id, "poll_invocation": poll_iid}
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
    # ImpossibleEvent: another poll finished first and the job is no longer pending (the table
    # refuses a move out of a terminal state); the journal holds the answer that counted.
    with contextlib.suppress(ImpossibleEvent):
        await engine.recorder.append(event, barrier=True)
