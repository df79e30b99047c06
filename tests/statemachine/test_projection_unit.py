"""Projection details the model checks do not name: records are snapshots, refusal is atomic
from the very first event, project_all's GC pause is undone whatever happens, records are
ordinary frozen records, and the tabulated retry hints agree with ``retry_hint``."""

from __future__ import annotations

import copy
import dataclasses
import gc
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from affidavit.statemachine import (
    INITIAL,
    STATES,
    TRANSITIONS,
    Code,
    Event,
    EventKind,
    EvidenceSource,
    ImpossibleEvent,
    Outcome,
    Projector,
    Record,
    Retry,
    fold_runs,
    project,
    project_all,
    stored_event,
)
from affidavit.statemachine.projection import fold_rows
from affidavit.statemachine.retry import retry_hint, static_retry_hint
from affidavit.statemachine.rules import RULES

from .lifecycle_helpers import (
    IID,
    drive,
    make_event,
    operation,
    path_to,
    projector_in,
    valid_moves,
)
from .test_model_check import ATTRS

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
        project_all(_events("delivered_committed"), None)
        assert gc.isenabled() is enabled
        with pytest.raises(ImpossibleEvent):
            project_all([Event(E.REQUEST_SENT, IID, seq=1)], None)
        assert gc.isenabled() is enabled
    finally:
        if was:
            gc.enable()


def test_drive_helper_reaches_every_state() -> None:
    # guards the helpers the model checks rely on
    for state in ("reconciled_committed", "retry_setup_failed", "delivery_failed_rejected"):
        assert drive(path_to(state)).state == state


# --- the record builder and the hint table (tests/benchmarks/projection.py made them fast) -------


def test_records_are_ordinary_frozen_dataclasses_equal_to_constructed_ones() -> None:
    rec = project(_events("delivered_committed"), now=5.0)
    assert type(rec) is Record
    values = {f.name: getattr(rec, f.name) for f in dataclasses.fields(Record)}
    assert Record(**values) == rec
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.state = "new"  # type: ignore[misc]
    assert dataclasses.replace(rec, state="x").state == "x"
    assert rec.final and not rec.is_error


@pytest.mark.parametrize("state", sorted(STATES))
def test_every_state_builds_every_record_field(state: str) -> None:
    # the builder fills an unfrozen twin field by field: a field it missed would be unset
    events = _events(state)
    for rec in (project(events, None), Projector(IID).extend(events).record()):
        values = {f.name: getattr(rec, f.name) for f in dataclasses.fields(Record)}
        assert type(rec) is Record and Record(**values) == rec


def test_stored_events_are_the_constructor_s_events() -> None:
    args = (EventKind.REQUEST_SENT, IID, {"a": 1}, EvidenceSource.REMOTE_QUERY, 4, 1.5, "o", 9)
    ev = stored_event(*args)
    assert type(ev) is Event and ev == Event(*args) and hash(ev.kind) == hash(args[0])
    with pytest.raises(dataclasses.FrozenInstanceError):
        ev.seq = 5  # type: ignore[misc]
    assert dataclasses.replace(ev, seq=5).seq == 5


@pytest.mark.parametrize("live", [True, False])
def test_records_never_share_evidence_with_a_fold_that_goes_on(live: bool) -> None:
    events = _events("dispatched")
    first = Projector(IID).extend(events).record() if live else project(events, None)
    again = project(events, None)
    assert first == again and first.evidence is not again.evidence
    p = Projector(IID).extend(events)
    snap = p.record()
    p.apply(Event(E.PROTOCOL_OBSERVED, IID, {"protocol": "http", "state": "x", "facts": {"y": 1}}))
    assert "http" not in snap.evidence and snap.evidence.get("steps") is None
    assert project(events, None) == snap


def test_folding_never_edits_an_events_attrs() -> None:
    # Events are recorded facts; evidence values are replaced, never edited in place, so even a
    # protocol whose name matches a dict taken from an event leaves that event as it was.
    hop = {"from": "a", "to": "b"}
    events = [*_events("authorized")]
    seq = len(events)
    events += [
        Event(E.DISPATCH_STARTED, IID, {"generation": 0, "hop": hop}, seq=seq + 1),
        Event(E.PROTOCOL_OBSERVED, IID, {"protocol": "hop", "state": "s", "facts": {"z": 1}}),
        Event(E.LEASE_LOST, IID, {"generation": 0}),
        Event(E.LEASE_LOST, IID, {"generation": 0}),
    ]
    before = copy.deepcopy([e.attrs for e in events])
    rec = project(events, None)
    assert [e.attrs for e in events] == before
    assert hop == {"from": "a", "to": "b"}
    assert rec.evidence["hop"] == {"from": "a", "to": "b", "z": 1}
    assert rec.evidence["steps"] == ["hop.s"]
    assert [w["generation"] for w in rec.evidence["stale_workers"]] == [0, 0]


@pytest.mark.parametrize("facts", [None, {"k": 1}])
@pytest.mark.parametrize("name", ["steps", "stale_workers"])
def test_protocol_facts_cannot_be_merged_into_a_list_field(name: str, facts: Any) -> None:
    # These evidence fields hold lists; merging facts into them used to raise AttributeError.
    p = projector_in("dispatched")
    p.apply(Event(E.LEASE_LOST, IID, {"generation": 0}))
    before = p.record()
    attrs = {"protocol": name, "state": "s", "facts": facts}
    with pytest.raises(ImpossibleEvent, match="collides with an evidence field"):
        p.apply(Event(E.PROTOCOL_OBSERVED, IID, attrs))
    assert p.record() == before


_dynamic = st.tuples(
    st.booleans(),
    st.one_of(st.none(), st.floats(0, 1e4)),
    st.booleans(),
    st.one_of(st.none(), st.floats(0, 1e4)),
    st.floats(0, 600),
    st.integers(-1, 4),
    st.floats(0, 1e4),
)


@settings(max_examples=300, deadline=None)
@given(
    state=st.sampled_from(sorted(STATES)),
    code=st.sampled_from([None, *Code]),
    deliverable=st.booleans(),
    dynamic=st.lists(_dynamic, min_size=1, max_size=8),
)
def test_a_tabulated_hint_is_what_retry_hint_returns_for_any_operation_budget_or_time(
    state: str, code: Code | None, deliverable: bool, dynamic: list[tuple[Any, ...]]
) -> None:
    outcome = STATES[state].outcome
    static = static_retry_hint(state, outcome, code, deliverable=deliverable)
    hints = {retry_hint(state, outcome, code, *d, deliverable=deliverable) for d in dynamic}
    if static is not None:
        assert hints == {static}
    else:
        # untabulated: the hint must depend on something besides (state, code, deliverable)
        assert outcome is Outcome.UNKNOWN or code is not None


@settings(max_examples=200, deadline=None)
@given(
    outcome=st.sampled_from([Outcome.COMMITTED, Outcome.REJECTED]),
    code=st.sampled_from([None, *Code]),
    dynamic=_dynamic,
)
def test_a_failed_delivery_naming_no_requester_is_hinted_as_its_stored_result(
    outcome: Outcome, code: Code | None, dynamic: tuple[Any, ...]
) -> None:
    # No read delivers a record naming no requester: its failed delivery is not "fetch it"
    # but its stored result's hint, whatever the operation, key, Retry-After, budget or time;
    # one naming its requester is sent to fetch it (seed: "set retry=fetch_result").
    failed, stored = f"delivery_failed_{outcome.value}", f"stored_{outcome.value}"
    for deliverable in (True, False):
        assert retry_hint(stored, outcome, code, *dynamic, deliverable=deliverable) is (
            retry_hint(failed, outcome, code, *dynamic, deliverable=False)
        )
    assert retry_hint(failed, outcome, code, *dynamic, deliverable=True) is Retry.FETCH_RESULT


# --- attrs that are not an object: refused, never an AttributeError ----------------------------

NOT_OBJECTS = st.one_of(
    st.lists(st.one_of(st.text(max_size=8), st.integers()), max_size=3),
    st.text(max_size=8),
    st.binary(max_size=4),
    st.integers(),
    st.floats(allow_nan=False),
    st.booleans(),
    st.none(),
    st.tuples(st.text(max_size=4)),
    st.frozensets(st.sampled_from(["code", "generation", "operation"])),
)
"""Event attrs of every JSON-ish shape but an object (a list, a string, a number, null ...)."""


@settings(max_examples=300, deadline=None)
@given(
    state=st.sampled_from(sorted(STATES)),
    kind=st.sampled_from(list(EventKind)),
    attrs=NOT_OBJECTS,
    seq=st.one_of(st.none(), st.integers(0, 200)),
)
def test_a_new_event_whose_attrs_are_not_an_object_is_impossible_in_every_state(
    state: str, kind: EventKind, attrs: Any, seq: int | None
) -> None:
    """The rules read an event's attrs as an object; a new event (one no journal row checked)
    carrying a list or a string is refused like any impossible event -- ``ImpossibleEvent``,
    the record as it was -- never an ``AttributeError`` out of a rule.  ``project_all`` and
    ``fold_runs`` (``apply`` inlined) refuse it with the same reason."""
    p = projector_in(state)
    before = p.record()
    event = Event(kind, IID, attrs, seq=seq)
    with pytest.raises(ImpossibleEvent) as info:
        p.apply(event)
    assert info.value.event is event and info.value.state == state
    assert p.record() == before and p.state == state
    if state == INITIAL:  # a log that is this one event
        for fold in (lambda log: project_all(log, None), lambda log: list(fold_runs(log))):
            with pytest.raises(ImpossibleEvent) as folded:
                fold([event])
            assert folded.value.reason == info.value.reason


def test_the_refusal_of_attrs_that_are_not_an_object_names_their_type() -> None:
    for attrs, name in (([1, 2], "list"), ("code", "str"), (None, "NoneType")):
        with pytest.raises(ImpossibleEvent) as info:
            Projector().apply(Event(E.ACTION_ACCEPTED, IID, attrs, seq=1))
        assert info.value.reason == f"attrs are a {name}, not an object"


# --- project_all inlines Projector.apply: the two must agree, refusals included ---------------

_any_event = st.builds(
    Event,
    st.sampled_from(list(EventKind)),
    st.sampled_from(["act_a", "act_b", "act_c"]),
    st.one_of(ATTRS, NOT_OBJECTS),
    source=st.sampled_from(list(EvidenceSource)),
    seq=st.one_of(st.none(), st.integers(0, 400)),
)


def _valid_runs(
    data: st.DataObject, choose: Any, at: st.SearchStrategy[float | None] | None = None
) -> list[list[Event]]:
    """Up to 12 events the lifecycle accepts for each of three invocations, ``seq`` rising
    across all of them; each event's ``at`` is its own, or drawn from ``at`` when given."""
    runs: list[list[Event]] = []
    seq = 0
    for iid in ("act_a", "act_b", "act_c"):
        p, events = Projector(iid), []
        for _ in range(data.draw(st.integers(0, 12))):
            moves = valid_moves(p)
            if not moves:
                break
            kind, dest = choose(moves)
            seq += 1
            ev = make_event(p, kind, dest, seq, choose)
            ev = Event(
                ev.kind,
                iid,
                ev.attrs,
                ev.source,
                ev.seq,
                ev.at if at is None else data.draw(at),
                ev.observer,
                ev.observer_seq,
            )
            p.apply(ev)
            events.append(ev)
        runs.append(events)
    return runs


@settings(max_examples=200, deadline=None)
@given(data=st.data(), junk=st.lists(st.tuples(st.integers(0, 60), _any_event), max_size=3))
def test_project_all_agrees_with_projector_apply_on_interleaved_logs(
    data: st.DataObject, junk: list[tuple[int, Event]]
) -> None:
    def choose(options: Any) -> Any:
        return data.draw(st.sampled_from(list(options)))

    per_invocation = _valid_runs(data, choose)
    log: list[Event] = []
    queues = [list(evs) for evs in per_invocation]
    while any(queues):
        q = choose([q for q in queues if q])
        log.append(q.pop(0))
    for pos, ev in junk:
        log.insert(min(pos, len(log)), ev)

    # the reference: one Projector per invocation, through the public apply
    folds: dict[str, Projector] = {}
    refused: ImpossibleEvent | None = None
    for ev in log:
        p = folds.setdefault(ev.invocation_id, Projector(ev.invocation_id))
        try:
            p.apply(ev)
        except ImpossibleEvent as exc:
            refused = exc
            break
    if refused is not None:
        with pytest.raises(ImpossibleEvent) as info:
            project_all(log, now=7.0)
        assert (info.value.event, info.value.state, info.value.reason) == (
            refused.event,
            refused.state,
            refused.reason,
        )
    else:
        assert project_all(log, now=7.0) == {iid: p.record(7.0) for iid, p in folds.items()}


@settings(max_examples=200, deadline=None)
@given(data=st.data(), junk=st.lists(st.tuples(st.integers(0, 60), _any_event), max_size=3))
def test_fold_runs_agrees_with_projector_apply_on_grouped_logs(
    data: st.DataObject, junk: list[tuple[int, Event]]
) -> None:
    """``fold_runs`` (``Projector.apply`` inlined, for the journal's grouped views) hands out
    what a new ``Projector`` per run, fed through ``apply``, would hold -- the same records,
    the ``at`` of each run's first and last events -- and refuses the same event with the same
    state and reason, after handing out every run before it (never the refused one)."""

    def choose(options: Any) -> Any:
        return data.draw(st.sampled_from(list(options)))

    log = [ev for run in _valid_runs(data, choose, st.none() | st.floats(0, 1e9)) for ev in run]
    for pos, ev in junk:
        log.insert(min(pos, len(log)), ev)

    want: list[tuple[Record, float | None, float | None]] = []
    refused: ImpossibleEvent | None = None
    run: tuple[Projector, float | None, float | None] | None = None
    for ev in log:
        if run is None or ev.invocation_id != run[0]._invocation_id:
            if run is not None:
                want.append((run[0].record(7.0), run[1], run[2]))
            run = (Projector(ev.invocation_id), ev.at, ev.at)
        try:
            run[0].apply(ev)
        except ImpossibleEvent as exc:
            refused, run = exc, None
            break
        run = (run[0], run[1], ev.at)
    if run is not None:
        want.append((run[0].record(7.0), run[1], run[2]))

    got: list[tuple[Record, float | None, float | None]] = []
    if refused is None:
        got = [(p.record(7.0), first, last) for p, first, last in fold_runs(log)]
    else:
        with pytest.raises(ImpossibleEvent) as info:
            for p, first, last in fold_runs(log):
                got.append((p.record(7.0), first, last))
        assert (info.value.event, info.value.state, info.value.reason) == (
            refused.event,
            refused.state,
            refused.reason,
        )
    assert got == want


def test_the_fold_dict_is_the_lifecycle_table_with_a_rule_per_kind() -> None:
    # fold_rows() is what apply and project_all look up.  Same pairs as the lifecycle table,
    # same destinations ("=" resolved), every kind ruled -- and it cannot be edited from outside.
    rows = fold_rows()
    assert set(rows) == set(TRANSITIONS) == set(STATES)
    for state, row in TRANSITIONS.items():
        assert set(rows[state]) == set(row)
        for kind, dest in row.items():
            got, rule = rows[state][kind]
            assert got == (state if dest == "=" else dest)
            assert rule is RULES[kind]
    assert set(RULES) == set(EventKind)
    with pytest.raises(TypeError):
        rows["new"] = {}  # type: ignore[index]
    with pytest.raises(TypeError):
        rows["new"][EventKind.ACTION_ACCEPTED] = ("x", RULES[EventKind.ACTION_ACCEPTED])  # type: ignore[index]


def test_result_size_limit_stands_only_on_its_evidence() -> None:
    """RESULT_SIZE_LIMIT says why an attempt ended: the projection takes it only with the limit
    and the bytes received (into ``evidence.result_size_limit``), and that evidence with no other
    code."""
    over = {"limit": 1024, "received_bytes": 1500}
    for attrs in (
        {"code": "RESULT_SIZE_LIMIT"},
        {"code": "RESULT_SIZE_LIMIT", "result_size_limit": {"limit": 1024}},
        {"code": "RESULT_SIZE_LIMIT", "result_size_limit": {"limit": "1k", "received_bytes": 5}},
        {"code": "REMOTE_RESULT_INCOMPLETE", "result_size_limit": over},
    ):
        p = projector_in("dispatched")
        before = p.record()
        with pytest.raises(ImpossibleEvent):
            p.apply(Event(E.ATTEMPT_INTERRUPTED, IID, attrs))
        assert p.record() == before
    p = projector_in("dispatched")
    p.apply(
        Event(E.ATTEMPT_INTERRUPTED, IID, {"code": "RESULT_SIZE_LIMIT", "result_size_limit": over})
    )
    rec = p.record()
    assert (rec.state, rec.outcome, rec.code) == (
        "interrupted",
        Outcome.UNKNOWN,
        Code.RESULT_SIZE_LIMIT,
    )
    assert rec.evidence["result_size_limit"] == over


def test_result_size_limit_with_its_counts_withheld() -> None:
    """A result that echoed a secret or was not scanned whole is cut at the limit with its
    counts withheld (engine/echoed.py): ``{limit, received_withheld}`` stands, and only with a
    known reason and no count beside it."""
    for bad in (
        {"limit": 1024, "received_withheld": "because"},
        {"limit": 1024, "received_withheld": "redacted", "received_bytes": 1500},
        {"limit": 1024, "received_withheld": "unscanned", "decoded_bytes": 9000},
        {"received_withheld": "redacted"},
        {"limit": 1024, "received_withheld": ["redacted"]},  # unhashable: refused, not raised
    ):
        p = projector_in("dispatched")
        with pytest.raises(ImpossibleEvent):
            p.apply(
                Event(
                    E.ATTEMPT_INTERRUPTED,
                    IID,
                    {"code": "RESULT_SIZE_LIMIT", "result_size_limit": bad},
                )
            )
    for reason in ("redacted", "tail_redacted", "unscanned"):
        over = {"limit": 1024, "received_withheld": reason}
        p = projector_in("dispatched")
        attrs = {"code": "RESULT_SIZE_LIMIT", "result_size_limit": over}
        p.apply(Event(E.ATTEMPT_INTERRUPTED, IID, attrs))
        rec = p.record()
        assert (rec.state, rec.code) == ("interrupted", Code.RESULT_SIZE_LIMIT)
        assert rec.evidence["result_size_limit"] == over


def test_result_size_limit_evidence_is_the_attempts_own() -> None:
    """A retry's attempt starts without the previous attempt's result_size_limit."""
    p = projector_in("dispatched")
    over = {"limit": 1024, "received_bytes": 1500}
    p.apply(
        Event(E.ATTEMPT_INTERRUPTED, IID, {"code": "RESULT_SIZE_LIMIT", "result_size_limit": over})
    )
    assert p.record().evidence["result_size_limit"] == over
    for kind, dest in (
        (E.RETRY_LEASE_ACQUIRED, "retry_pending"),
        (E.DISPATCH_STARTED, "dispatched"),
    ):
        assert p.apply(make_event(p, kind, dest, None)) == dest
    assert "result_size_limit" not in p.record().evidence


def _size_limit_schema() -> dict[str, Any]:
    """The envelope schema's ``result_size_limit`` object (``envelope_schema``)."""
    from affidavit.statemachine import envelope_schema

    found: list[dict[str, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            props = node.get("properties")
            if isinstance(props, dict) and {"limit", "received_withheld"} <= set(props):
                found.append(node)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(envelope_schema())
    assert len(found) == 1
    return found[0]


def test_the_envelope_schema_admits_the_result_size_limit_the_projection_does() -> None:
    """What the schema tells clients ``result_size_limit`` can be is what a record can hold:
    counts beside ``received_withheld`` are refused by both (a withheld count is told
    nowhere), not let through by the schema's first ``oneOf`` branch."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(_size_limit_schema())
    for value in (
        {"limit": 1024, "received_bytes": 1500},
        {"limit": 1024, "received_bytes": 1500, "decoded_bytes": 9000},
        {"limit": 1024, "received_withheld": "redacted"},
        {"limit": 1024, "received_withheld": "unscanned"},
        {"limit": 1024, "received_withheld": "tail_redacted"},
        {"limit": 1024, "received_withheld": "redacted", "received_bytes": 1500},
        {"limit": 1024, "received_withheld": "unscanned", "received_bytes": 1, "decoded_bytes": 2},
        {"limit": 1024, "received_withheld": "because"},
        {"limit": 1024},
    ):
        p = projector_in("dispatched")
        attrs = {"code": "RESULT_SIZE_LIMIT", "result_size_limit": value}
        try:
            p.apply(Event(E.ATTEMPT_INTERRUPTED, IID, attrs))
            projected = True
        except ImpossibleEvent:
            projected = False
        assert validator.is_valid(value) == projected, value
