"""The operation table: a job the remote accepted and runs on after its response.

Seed, "Cause and outcome answer different questions": "A complete HTTP 202 response confirms
that the job was accepted, not that the queued work was completed.  Record the job identifier
and its status resource returned by the service, and then track the job as a separate
operation.  If you retry the submission because the job is still pending, it may be queued
twice."

So the submission keeps its own lifecycle (a complete 202 is ``committed``: the acceptance is
known), and the job gets this small table of its own::

    none ──OPERATION_ACCEPTED──▶ pending ──OPERATION_POLLED:succeeded──▶ succeeded
                                  │  ▲   └─OPERATION_POLLED:failed─────▶ failed
                                  └──┘ OPERATION_POLLED:pending, OPERATION_POLL_FAILED

Rule 1: everything that decides an operation's state lives in ``STATES`` and ``TRANSITIONS``;
the fold (``rules`` below), the ``transitions`` machine, the diagram and the model checks derive
from them.  A (state, event) pair absent here is impossible, as in the lifecycle.

Rule 2: a poll that fails (no complete answer, or none the broker can read) leaves the state as
it was; a terminal state is never left -- a late or stale "pending" after "succeeded" is refused,
not folded (seed: "The projection must reject impossible state reversals").

The events live in the submitting invocation's event stream (the lifecycle table allows them
after the complete 202), so the journal's one projection check covers them; the operation's id
is the submission's id with ``op_`` for ``act_`` (``operation_id``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from .contract import Code, EvidenceSource
from .events import Event, EventKind
from .graph import can_reach, reachable
from .rules_common import _UNSENT_CLOSES, _refuse, _stale_row

if TYPE_CHECKING:
    from .projection import Projector

__all__ = [
    "INITIAL",
    "OPERATION_RULES",
    "STATES",
    "TRANSITIONS",
    "OperationState",
    "build_machine",
    "edges",
    "invocation_of",
    "operation_id",
    "problems",
    "terminal_states",
    "trigger",
]

E = EventKind


@dataclass(frozen=True, slots=True)
class OperationState:
    terminal: bool
    doc: str


INITIAL: Final = "none"

# fmt: off
STATES: Final[MappingProxyType[str, OperationState]] = MappingProxyType({
    "none":      OperationState(False, "no job was accepted by this invocation"),
    "pending":   OperationState(False, "the remote accepted the job; its completion is not known"),
    "succeeded": OperationState(True,  "a status query read that the job succeeded"),
    "failed":    OperationState(True,  "a status query read that the job failed"),
})

_TABLE: dict[str, dict[EventKind, tuple[str, ...]]] = {
    "none":      {E.OPERATION_ACCEPTED: ("pending",)},
    "pending":   {E.OPERATION_POLLED: ("pending", "succeeded", "failed"),  # by attrs.state
                  E.OPERATION_POLL_FAILED: ("pending",)},
    "succeeded": {},
    "failed":    {},
}
# fmt: on
TRANSITIONS: Final[MappingProxyType[str, MappingProxyType[EventKind, tuple[str, ...]]]] = (
    MappingProxyType({name: MappingProxyType(row) for name, row in _TABLE.items()})
)
"""state -> {event: destinations}.  With more than one destination the event's ``attrs.state``
names it (what the status query read)."""


def terminal_states() -> frozenset[str]:
    return frozenset(name for name, spec in STATES.items() if spec.terminal)


def edges() -> list[tuple[str, str, str]]:
    """Every concrete (source, event, dest) edge of the table, sorted."""
    return sorted(
        (src, ev.value, dst)
        for src, row in TRANSITIONS.items()
        for ev, dsts in row.items()
        for dst in dsts
    )


def problems() -> list[str]:
    """Structural invariants (empty when sound): every state declared and reachable, every
    state can reach a terminal one, no edge leaves a terminal state or returns to ``none``."""
    out: list[str] = []
    for src, ev, dst in edges():
        if src not in STATES or dst not in STATES:
            out.append(f"{src} --{ev}--> {dst}: undeclared state")
    if out:
        return out
    for s in sorted(set(STATES) - reachable(INITIAL, edges())):
        out.append(f"state {s!r} is unreachable")
    for s in sorted(set(STATES) - can_reach(terminal_states(), edges())):
        out.append(f"state {s!r} cannot reach a terminal state")
    for src, ev, dst in edges():
        if STATES[src].terminal:
            out.append(f"{src} --{ev}--> {dst} leaves a terminal state")
        if dst == INITIAL:
            out.append(f"{src} --{ev}--> {dst} returns to {INITIAL}")
    return out


def build_machine(model: object | None = None, initial: str = INITIAL) -> object:
    """A ``transitions.Machine`` from the table (diagrams and the model checks' cross-check);
    a split event's trigger is ``EVENT:state``."""
    from transitions import Machine

    declared = [
        {"trigger": trigger(src, ev, dst), "source": src, "dest": dst} for src, ev, dst in edges()
    ]
    return Machine(
        model=model if model is not None else Machine.self_literal,
        states=sorted(STATES),
        transitions=declared,
        initial=initial,
        auto_transitions=False,
        ignore_invalid_triggers=False,
    )


def trigger(src: str, ev: str, dst: str) -> str:
    """An edge's event as the machine, the diagram and the contract name it: ``EVENT:state``
    where the event's ``attrs.state`` selects the destination."""
    return f"{ev}:{dst}" if len(TRANSITIONS[src][EventKind(ev)]) > 1 else ev


def operation_id(invocation_id: str) -> str:
    """The operation a submission ``act_X`` accepted is ``op_X``."""
    return "op_" + invocation_id.removeprefix("act_")


def invocation_of(op_id: str) -> str | None:
    """The submitting invocation of ``op_X`` (``act_X``), or None for anything else."""
    if not op_id.startswith("op_") or len(op_id) <= 3:
        return None
    return "act_" + op_id[3:]


# --- the fold: what each event does to the submitting invocation's record ----------------------


def _destination(p: Projector, event: Event, state: str) -> str:
    """The operation state ``event`` leads to from ``state``; refused when the table has none."""
    dests = TRANSITIONS[state].get(event.kind)
    if dests is None:
        _refuse(p, event, f"the operation is {state}; {event.kind.value} is not allowed there")
    if len(dests) == 1:
        return dests[0]
    wanted = event.attrs.get("state")
    if wanted not in dests:
        _refuse(p, event, "attrs.state must be one of " + ", ".join(dests))
    return str(wanted)


def _text_or_none(value: object) -> bool:
    return value is None or (isinstance(value, str) and bool(value))


def _on_accepted(p: Projector, event: Event) -> None:
    op = p._operation
    dest = _destination(p, event, INITIAL if op is None else str(op["state"]))
    if event.source is not EvidenceSource.REMOTE_RESPONSE:
        _refuse(p, event, "an accepted job is known from a complete remote_response")
    attrs = event.attrs
    if attrs.get("operation_id") != operation_id(event.invocation_id):
        _refuse(p, event, "attrs.operation_id must name this invocation's operation")
    for key in ("job_id", "status_url", "status_path"):
        if not _text_or_none(attrs.get(key)):
            _refuse(p, event, f"attrs.{key} must be a non-empty string or null")
    p._operation = MappingProxyType(
        {
            "id": attrs["operation_id"],
            "job_id": attrs.get("job_id"),
            "status_url": attrs.get("status_url"),
            "status_path": attrs.get("status_path"),
            "state": dest,
            "accepted_seq": event.seq,
            "polls": 0,
            "last_poll": None,
            "open_poll": None,
        }
    )


def _on_poll(p: Projector, event: Event) -> None:
    op = p._operation
    if op is None:
        _refuse(p, event, "no job was accepted by this invocation")
    dest = _destination(p, event, str(op["state"]))
    attrs = event.attrs
    if attrs.get("operation_id") != op["id"]:
        _refuse(p, event, "attrs.operation_id must name this invocation's operation")
    poll = attrs.get("poll_invocation")
    if not isinstance(poll, str) or not poll:
        _refuse(p, event, "attrs.poll_invocation must name the querying invocation")
    opened = attrs.get("open")
    if opened is not None and type(opened) is not bool:
        _refuse(p, event, "attrs.open must be true or false")
    current = op.get("open_poll")
    if opened and event.kind is E.OPERATION_POLLED:
        _refuse(p, event, "a poll that read a state is not open")
    if opened and current is not None and current != poll:
        # One poll at a time (engine/takeup.py), checked in the writing transaction.
        _refuse(p, event, f"the poll {current} is still open")
    if _stale_row(p, event):
        # A stale row a broker from before the writer refused it stored (``_reopened``): the
        # poll stays closed and ``last_poll`` keeps what the closing row read.  Refused when
        # written (``_stale_row``).
        return
    unsent = attrs.get("unsent")
    if unsent is not None and (unsent is not True or opened or current != poll):
        _refuse(p, event, _UNSENT_CLOSES)
    if (
        opened is None
        and event.kind is E.OPERATION_POLL_FAILED
        and attrs.get("code") == Code.APPROVAL_PENDING.value
    ):
        # A row written before rows named ``open`` left a poll awaiting an operator with
        # APPROVAL_PENDING and no ``open``: open now too, taken up, not asked for again (a
        # second card after an upgrade) -- as a query's (``rules_lease``).  Never refused: a
        # journal folds as it was written.
        opened = True
    open_poll = poll if opened else (None if current == poll else current)
    if opened and attrs.get("code") is None:
        # The poll named before it is asked: open, not yet a poll of the job.
        p._operation = MappingProxyType({**op, "open_poll": open_poll})
        return
    if unsent:
        # Closes an open poll nothing was sent for (denied, expired, never asked): the row
        # that put it on the operator's list counted it; this one is no poll of the job.
        last_unsent = {"invocation_id": poll, "seq": event.seq, "code": attrs.get("code")}
        p._operation = MappingProxyType(
            {**op, "last_poll": {**last_unsent, "reason": attrs.get("reason")}, "open_poll": None}
        )
        return
    last: dict[str, Any] = {"invocation_id": poll, "seq": event.seq}
    if event.kind is E.OPERATION_POLLED:
        if event.source is not EvidenceSource.REMOTE_QUERY:
            _refuse(p, event, "a job's state is known from a remote_query")
        last["state"] = dest
        last["remote_status"] = attrs.get("remote_status")
    else:
        last["code"] = attrs.get("code")
        last["reason"] = attrs.get("reason")
    # A new view: records already handed out keep theirs (see Projector).  ``polls`` counts
    # the polls read (or given up) once each: a row leaving its poll open -- awaiting an
    # operator, nothing sent; or being sent, its answer to be read by the next poll -- is not
    # counted, the row that closes it is (before, a poll approved and sent counted twice, one
    # denied once with nothing sent).
    p._operation = MappingProxyType(
        {
            **op,
            "state": dest,
            "polls": int(op["polls"]) + (0 if opened else 1),
            "last_poll": last,
            "open_poll": open_poll,
        }
    )


OPERATION_RULES: Mapping[EventKind, Any] = {
    E.OPERATION_ACCEPTED: _on_accepted,
    E.OPERATION_POLLED: _on_poll,
    E.OPERATION_POLL_FAILED: _on_poll,
}
"""The operation events' rules, merged into ``rules.RULES`` (the lifecycle decides *where* in
an invocation's life they may come; these decide what the operation table allows)."""
