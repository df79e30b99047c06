"""A protocol table's milestones become their journal kinds, and its facts the protocol
summary (``attempt._observer``, ``attempt.observed_events``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import affidavit.engine.attempt as attempt_mod
from affidavit.adapters.http.machine import HTTP_TABLE
from affidavit.engine.steps import StepPath
from affidavit.statemachine import EventKind
from affidavit.statemachine.protocol import Step


def _attempt(table: object) -> SimpleNamespace:
    return SimpleNamespace(
        machine=SimpleNamespace(table=table),
        steps=StepPath(),
        facts={},
        milestones_seen=set(),
        dispatch_recorded=True,
        pending=[],
        generation=3,
        iid="act_1",
        withheld=lambda: ([], "redacted"),  # no stream withheld (``echoed.py``)
    )


def test_each_milestone_is_recorded_as_its_kind_without_calling_the_enum(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 15: a milestone's kind is looked up by its value (twice per call), not made by
    ``EventKind(value)``'s enum call -- the same member, the same event."""

    def no_enum_call(value: str) -> EventKind:
        raise AssertionError("EventKind was called")

    monkeypatch.setattr(attempt_mod, "EventKind", no_enum_call)
    attempt = _attempt(HTTP_TABLE)
    observe = attempt_mod._observer(attempt)  # type: ignore[arg-type]
    for dest in sorted(HTTP_TABLE.milestones):
        observe(Step("x", "e", dest, False, False), {"status": 200})
    kinds = [e.kind for e in attempt.pending]
    assert kinds == [EventKind(v) for _, v in sorted(HTTP_TABLE.milestones.items())]
    assert all(e.attrs == {"status": 200, "generation": 3} for e in attempt.pending)


def test_the_protocol_summary_keeps_the_json_facts_without_a_call_per_fact(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 15: ``observed_events`` keeps the facts that are JSON (and scrubs them) with the
    type test inline, not a ``_jsonable`` call per fact; what it keeps is unchanged."""

    def no_call(value: object) -> bool:
        raise AssertionError("_jsonable was called")

    monkeypatch.setattr(attempt_mod, "_jsonable", no_call)
    attempt = _attempt(HTTP_TABLE)
    attempt.steps.append("headers_sent")
    attempt.machine.state = "headers_sent"
    attempt.facts = {"a": "x", "b": 1, "c": None, "d": [1], "e": {"f": 2}, "g": (1,), "h": b"x"}
    attempt.scrub = lambda value: value
    [(event, payload)] = attempt_mod.observed_events(attempt)  # type: ignore[arg-type]
    assert payload is None and event.kind is EventKind.PROTOCOL_OBSERVED
    assert event.attrs["facts"] == {
        "a": "x", "b": 1, "c": None, "d": [1], "e": {"f": 2},
        "path": ["headers_sent"], "path_repeats": [], "path_left_out": None,
        "received_withheld": None,
    }  # fmt: skip
