"""Projection details the model checks do not name: records are snapshots, refusal is atomic
from the very first event, and project_all's GC pause is undone whatever happens."""

from __future__ import annotations

import gc

import pytest

from affidavit.statemachine import (
    Event,
    EventKind,
    ImpossibleEvent,
    Projector,
    project,
    project_all,
)

from .lifecycle_helpers import IID, drive, make_event, operation, path_to, projector_in

E = EventKind


def test_a_record_is_a_snapshot_that_later_events_do_not_change() -> None:
    p = projector_in("dispatched")
    p.apply(Event(E.PROTOCOL_OBSERVED, IID, {"protocol": "http", "state": "a", "facts": {"x": 1}}))
    p.apply(Event(E.LEASE_LOST, IID, {"generation": 0}))
    before = p.record()
    steps, facts, stale = (
        list(before.evidence["steps"]),
        dict(before.evidence["http"]),
        list(before.evidence["stale_workers"]),
    )
    p.apply(Event(E.PROTOCOL_OBSERVED, IID, {"protocol": "http", "state": "b", "facts": {"x": 2}}))
    p.apply(Event(E.LEASE_LOST, IID, {"generation": 0}))
    p.apply(Event(E.ATTEMPT_INTERRUPTED, IID, {"code": "REMOTE_RESULT_INCOMPLETE"}))
    assert before.evidence["steps"] == steps == ["http.a"]
    assert before.evidence["http"] == facts == {"x": 1}
    assert before.evidence["stale_workers"] == stale
    assert before.attempts[-1]["code"] is None
    after = p.record()
    assert after.evidence["steps"] == ["http.a", "http.b"]
    assert after.attempts[-1]["code"] == "REMOTE_RESULT_INCOMPLETE"


def test_a_refused_first_event_leaves_the_projector_untouched() -> None:
    p = Projector()
    before = p.record()
    with pytest.raises(ImpossibleEvent):
        p.apply(Event(E.PREFLIGHT_VALIDATED, "act_1", seq=1))
    assert p.record() == before
    assert p.record().invocation_id == ""
    p.apply(Event(E.ACTION_ACCEPTED, "act_2", {"operation": operation()}, seq=1))
    assert p.record().invocation_id == "act_2"


def test_project_all_matches_one_projection_per_invocation() -> None:
    a = [Event(e.kind, "act_a", e.attrs, source=e.source, seq=None) for e in _events("interrupted")]
    b = [
        Event(e.kind, "act_b", e.attrs, source=e.source, seq=None) for e in _events("setup_failed")
    ]
    interleaved = [x for pair in zip(a, b, strict=False) for x in pair] + a[len(b) :] + b[len(a) :]
    records = project_all(interleaved, now=5.0)
    assert records == {"act_a": project(a, now=5.0), "act_b": project(b, now=5.0)}


def _events(state: str) -> list[Event]:
    events: list[Event] = []
    p = Projector(IID)
    for kind, dest in path_to(state):
        ev = make_event(p, kind, dest, seq=None)
        p.apply(ev)
        events.append(ev)
    return events


@pytest.mark.parametrize("enabled", [True, False])
def test_project_all_restores_the_garbage_collector_state(enabled: bool) -> None:
    was = gc.isenabled()
    try:
        if not enabled:
            gc.disable()
        project_all(_events("delivered_committed"))
        assert gc.isenabled() is enabled
        with pytest.raises(ImpossibleEvent):
            project_all([Event(E.REQUEST_SENT, IID, seq=1)])
        assert gc.isenabled() is enabled
    finally:
        if was:
            gc.enable()


def test_drive_helper_reaches_every_state() -> None:
    # guards the helpers the model checks rely on
    for state in ("reconciled_committed", "retry_setup_failed", "delivery_failed_rejected"):
        assert drive(path_to(state)).state == state
