"""One question at a time, never asked again once answered, on any log of a record's linked
calls (reconciliation queries, an operation's polls): rows naming a call from a small pool,
``open`` or not, stale ones included (a row naming a closed call ``open``: the writer refuses
it, a stored one folds as a no-op -- ``statemachine/rules_common._reopened``).  The general walk
(test_projection_machine) seldom reaches a record with a query or a pending job and then
lingers there; this one starts there.  Properties: no row reopens a closed call (the open
query and open poll never name one), and ``project_all`` / ``fold_runs`` agree with
``Projector.apply`` on every such log.  A claim (``open``, no code) names a new call: one
drawn naming a call an earlier row named (with a record of its own or, as a claim written on
its own before 530d267 left it, none) is refused by the writer (``refuse_reclaiming``), never
folded -- folded, it would reopen that call; one naming a new call passes that check."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from affidavit.statemachine import (
    Event,
    EventKind,
    ImpossibleEvent,
    Projector,
    claimed_call,
    fold_runs,
    project_all,
    refuse_reclaiming,
)

from .lifecycle_helpers import IID, make_event, path_to
from .test_operation_and_batch import _accepted
from .test_projection_machine import _LINKED, _chooser, _linked_invariants

E = EventKind


def _prefix(start: str) -> tuple[Projector, list[Event]]:
    """The events that take a new record to ``start``: ``interrupted`` (unknown, a query may
    reconcile it) or ``pending`` (a delivered 202 whose job is pending: polls may read it)."""
    p, events = Projector(IID), []
    target = "interrupted" if start == "interrupted" else "completed_committed"
    for kind, dest in path_to(target):
        events.append(make_event(p, kind, dest, len(events) + 1))
        p.apply(events[-1])
    if start == "pending":
        events.append(_accepted(p, len(events) + 1))
        p.apply(events[-1])
        for kind, dest in ((E.RESULT_COMMITTED, "stored_committed"), (E.RESULT_DELIVERED, "")):
            events.append(make_event(p, kind, dest, len(events) + 1))
            p.apply(events[-1])
    return p, events


_KINDS = {
    "interrupted": [E.RECONCILE_INCONCLUSIVE],
    "pending": [E.OPERATION_POLL_FAILED, E.OPERATION_POLL_FAILED, E.OPERATION_POLLED],
}
"""The rows drawn from each start (a poll that read a state mostly ends the job: drawn less)."""


@settings(max_examples=150, deadline=None)
@given(data=st.data(), start=st.sampled_from(sorted(_KINDS)), rows=st.integers(1, 12))
def test_no_row_reopens_a_closed_call_and_every_fold_agrees(
    data: st.DataObject, start: str, rows: int
) -> None:
    choose: Any = _chooser(data)
    p, log = _prefix(start)
    closed: set[str] = set()
    called: set[str] = set()  # the calls rows named: each has a record of its own
    for _ in range(rows):
        op = p.record().operation
        if op is not None and op["state"] != "pending":
            break  # the job ended: no poll reads it
        event = make_event(p, choose(_KINDS[start]), p.state, len(log) + 1, choose)
        claimed = claimed_call(event)
        if claimed is not None and called and choose([False, True]):
            _reclaim_refused(p, event, choose(sorted(called)), log, choose([False, True]))
            continue
        if claimed is not None and claimed not in called:  # a new call: the writer's check passes
            refuse_reclaiming(p, event, Projector(claimed), [e.attrs for e in log])
        p.apply(event)  # a generated row is never refused: a stale one is a no-op
        log.append(event)
        _linked_invariants(event, p.record(), closed)
        named = event.attrs.get(_LINKED[event.kind])
        if isinstance(named, str):
            called.add(named)
    want = p.record(7.0)
    assert project_all(log, now=7.0) == {IID: want}
    assert [run.record(7.0) for run, _, _ in fold_runs(log)] == [want]


def _reclaim_refused(
    p: Projector, claim: Event, call: str, log: list[Event], own_record: bool
) -> None:
    """``claim`` renamed to name ``call``, which an earlier row of the record named: the
    writer's check refuses it -- by the call's own record (its ACTION_ACCEPTED, as the linked
    call's first write left it), or, with none (a claim written on its own before 530d267),
    by the record's rows that name it."""
    name = _LINKED[claim.kind]
    event = Event(claim.kind, claim.invocation_id, {**claim.attrs, name: call}, claim.source)
    record = Projector(call)
    if own_record:
        kind, dest = path_to("interrupted")[0]
        record.apply(make_event(record, kind, dest, 1))
    why = "already has a record" if own_record else "is named by an earlier row"
    with pytest.raises(ImpossibleEvent, match=f"{call} {why}"):
        refuse_reclaiming(p, event, record, [e.attrs for e in log])
