"""Model checks over the declared tables (issue 2, item 8a/8b).

(a) h2's test shape: *every* (state, event) pair of every table is either a declared transition
    that lands where the table says, or is refused cleanly — ``ImpossibleEvent`` /
    ``ProtocolViolation`` and nothing else, with the fold left exactly as it was.
(b) graph checks: every state reachable, every state can reach a final one, no path from a
    dispatched state back to ``not_attempted`` — on the real tables (no problems) and on
    deliberately broken copies (a specific problem).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from affidavit import protocols
from affidavit.adapters import load_all
from affidavit.statemachine import (
    ATTEMPT_KINDS,
    DISPATCHED_STATES,
    STATES,
    TRANSITIONS,
    Code,
    Event,
    EventKind,
    EvidenceSource,
    ImpossibleEvent,
    Outcome,
    ProtocolTable,
    build_machine,
    registered,
    render_envelope,
)
from affidavit.statemachine import lifecycle as lc
from affidavit.statemachine.check import check_every_pair_is_declared_or_refused
from affidavit.statemachine.graph import lifecycle_problems
from affidavit.statemachine.projection import fold_rows

from .example_protocol import EXAMPLE
from .lifecycle_helpers import (
    IID,
    make_event,
    operation,
    projector_in,
    rule_refuses,
)

E = EventKind


def protocol_tables() -> list[ProtocolTable]:
    """Every table the checks below cover: the adapters', every protocol's that is installed or
    registered in-process (a plugin's too: tests/toy_protocol), and the example."""
    load_all()
    protocols.registered()  # loads each installed protocol, registering its table
    return [*registered().values(), EXAMPLE]


# --- the transitions machine and the projection's compiled dict agree ------------------------


def _declared(state: str) -> set[tuple[str, str]]:
    """(trigger, dest) pairs of the projection's dict for one state, split like the machine."""
    out = set()
    for kind, (raw, _rule) in fold_rows()[state].items():
        if raw in lc.OUTCOME_SPLIT:
            for outcome, dest in lc.OUTCOME_SPLIT[raw].items():
                out.add((f"{kind.value}:{outcome.value}", dest))
        else:
            out.add((kind.value, raw))
    return out


def test_transitions_machine_agrees_with_projection_table_on_every_pair() -> None:
    from transitions import MachineError

    machine: Any = build_machine()
    triggers = sorted(machine.events)
    # every declared trigger name is an event kind, possibly split by outcome
    for trigger in triggers:
        kind, _, outcome = trigger.partition(":")
        assert kind in EventKind.__members__
        assert outcome in ("", *(o.value for o in Outcome))
    for state in sorted(STATES):
        from_machine = {
            (trigger, t.dest)
            for trigger in triggers
            for t in machine.get_transitions(trigger, source=state)
        }
        assert from_machine == _declared(state), state
        # and firing agrees: declared triggers land on the declared state, others raise
        allowed = dict(_declared(state))
        for trigger in triggers:
            m: Any = build_machine(initial=state)
            if trigger in allowed:
                m.trigger(trigger)
                assert m.state == allowed[trigger]
            else:
                with pytest.raises(MachineError):
                    m.trigger(trigger)
    # the dict is compiled from the same table
    assert set(fold_rows()) == set(STATES) == set(TRANSITIONS)


# --- (a) every (state, event) pair: declared, or refused cleanly ------------------------------


def _any_dest(kind: EventKind) -> str:
    """Some destination of ``kind`` somewhere in the table (to shape an event's attrs)."""
    for src in sorted(TRANSITIONS):
        dests = lc.expand(src, kind)
        if dests:
            return dests[0]
    return "new"


@pytest.mark.parametrize("state", sorted(STATES))
def test_every_lifecycle_pair_with_valid_attrs_is_declared_or_refused(state: str) -> None:
    for kind in EventKind:
        p = projector_in(state)
        before = p.record()
        dests = lc.expand(state, kind)
        if dests and rule_refuses(before, kind):
            dests = []  # declared, but its rule refuses it here (see rule_refuses)
        if dests:
            for dest in dests:
                q = projector_in(state)
                assert q.apply(make_event(q, kind, dest, seq=100)) == dest
        else:
            with pytest.raises(ImpossibleEvent):
                p.apply(make_event(p, kind, _any_dest(kind), seq=100))
            assert p.record() == before


@pytest.mark.parametrize("state", sorted(STATES))
def test_every_kind_an_attempt_writes_is_refused_unless_its_attempt_is_the_open_one(
    state: str,
) -> None:
    # rules._generation_checked, applied to ATTEMPT_KINDS: wherever the lifecycle takes such an
    # event, one naming another generation is refused, and one naming the current generation is
    # refused once its attempt is closed (a final state), else taken as it would be without it.
    for kind in sorted(ATTEMPT_KINDS):
        for dest in lc.expand(state, kind):
            p = projector_in(state)
            if rule_refuses(p.record(), kind):
                continue
            event = make_event(p, kind, dest, seq=100)
            before = p.record()
            for other in (p.generation + 1, True, "0"):
                stale = dataclasses.replace(event, attrs={**event.attrs, "generation": other})
                with pytest.raises(ImpossibleEvent, match="stale generation"):
                    p.apply(stale)
            assert p.record() == before
            current = dataclasses.replace(event, attrs={**event.attrs, "generation": p.generation})
            if STATES[state].final:
                with pytest.raises(ImpossibleEvent, match="attempt is closed"):
                    p.apply(current)
                assert p.record() == before
            else:
                assert p.apply(current) == dest, (state, kind)


_junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 6),
    st.floats(allow_nan=False, allow_infinity=False, min_value=-10, max_value=1e6),
    st.text(max_size=4),
    st.lists(st.integers(0, 3), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(0, 3), max_size=2),
)
_codes = st.one_of(st.sampled_from([c.value for c in Code]), _junk)
_outcomes = st.one_of(st.sampled_from([o.value for o in Outcome]), _junk)
_operations = st.one_of(
    _junk,
    st.builds(
        operation,
        idempotent=st.booleans(),
        key=st.sampled_from([None, "req_1"]),
        expires_at=st.sampled_from([None, 10.0, 1e9]),
        budget=st.integers(1, 4),
    ),
    st.dictionaries(
        st.sampled_from(
            ["budget", "max_retry_after", "idempotency", "idempotent", "fingerprint", "target"]
        ),
        _junk,
        max_size=4,
    ),
)
ATTRS = st.fixed_dictionaries(
    {},
    optional={
        "code": _codes,
        "outcome": _outcomes,
        "generation": st.one_of(st.integers(-1, 4), _junk),
        "operation": _operations,
        "retry_after": st.one_of(st.floats(0, 1e4), _junk),
        "protocol": st.one_of(st.sampled_from(["http", "ssh", "attempts", "evidence"]), _junk),
        "state": st.one_of(st.sampled_from(["headers_sent", "exec_sent"]), _junk),
        "facts": _junk,
        "stage": st.sampled_from(["dns", "tcp_connect"]),
        "message": st.text(max_size=10),
        "field": st.sampled_from(["body", "headers.authorization"]),
        "status": st.integers(100, 599),
    },
)


@settings(max_examples=400, deadline=None)
@given(
    state=st.sampled_from(sorted(STATES)),
    kind=st.sampled_from(list(EventKind)),
    attrs=ATTRS,
    source=st.sampled_from(list(EvidenceSource)),
    seq=st.one_of(st.none(), st.integers(0, 200)),
)
def test_every_lifecycle_pair_with_generated_attrs_is_declared_or_refused(
    state: str, kind: EventKind, attrs: Mapping[str, Any], source: EvidenceSource, seq: int | None
) -> None:
    p = projector_in(state)
    before = p.record()
    event = Event(kind, IID, attrs, source=source, seq=seq)
    try:
        dest = p.apply(event)
    except ImpossibleEvent as exc:
        assert exc.state == state and exc.event is event
        assert p.record() == before, "a refused event changed the record"
        assert p.state == state
        return
    assert dest in lc.expand(state, kind), f"{state} --{kind}--> {dest} is not declared"
    after = p.record()
    assert after.events == before.events + 1
    if state in DISPATCHED_STATES:
        assert after.outcome is not Outcome.NOT_ATTEMPTED
    json.dumps(render_envelope(after))


# --- (a) the same shape over every protocol table ---------------------------------------------


def test_every_protocol_pair_is_declared_or_refused() -> None:
    tables = protocol_tables()
    assert EXAMPLE in tables
    for table in tables:
        check_every_pair_is_declared_or_refused(table)


# --- (b) graph checks ------------------------------------------------------------------------


def test_real_lifecycle_table_has_no_structural_problems() -> None:
    assert lc.problems() == []


def test_real_protocol_tables_have_no_structural_problems() -> None:
    for table in protocol_tables():
        assert table.problems() == [], table.name


def _lifecycle_problems_with(
    extra: list[tuple[str, str, str]], drop: set[str] = frozenset()
) -> list[str]:  # type: ignore[assignment]
    outcomes = {n: s.outcome.value for n, s in STATES.items()}
    edges = [e for e in lc.edges() if e[0] not in drop and e[2] not in drop] + extra
    return lifecycle_problems(lc.INITIAL, outcomes, lc.final_states(), edges)


def test_checker_rejects_a_transition_from_dispatched_back_to_not_attempted() -> None:
    # The seed's central rule: "The broker never moves it back to not_attempted."
    problems = _lifecycle_problems_with([("interrupted", "SETUP_FAILED", "setup_failed")])
    assert (
        "interrupted --SETUP_FAILED--> setup_failed moves outcome back from unknown to "
        "not_attempted" in problems
    )
    assert "a path leads from interrupted (unknown) to setup_failed (not_attempted)" in problems


def test_checker_rejects_a_path_from_dispatched_to_not_attempted_through_a_chain() -> None:
    # committed -> unknown is itself flagged, and the path check sees beyond single edges.
    problems = _lifecycle_problems_with([("stored_committed", "X", "interrupted")])
    assert any("changes a resolved outcome" in p or "moves outcome back" in p for p in problems)
    assert "a path leads from stored_committed (committed) to interrupted (unknown)" in problems


def test_checker_rejects_unreachable_and_stuck_states() -> None:
    outcomes = {n: s.outcome.value for n, s in STATES.items()}
    edges = [e for e in lc.edges() if e[2] != "approval_denied"]
    problems = lifecycle_problems(lc.INITIAL, outcomes, lc.final_states(), edges)
    assert problems == ["state 'approval_denied' is unreachable"]
    # a non-final state with no way out
    edges = [e for e in lc.edges() if e[0] != "completed_committed" or e[2] == e[0]]
    problems = lifecycle_problems(lc.INITIAL, outcomes, lc.final_states(), edges)
    assert "state 'completed_committed' cannot reach a final state" in problems


def _table_with(base: ProtocolTable, **changes: Any) -> list[str]:
    """Problems of a modified copy (construction refuses it, so ask via the error)."""
    fields = {
        "name": base.name + "-broken",
        "initial": base.initial,
        "states": dict(base.states),
        "transitions": {s: dict(r) for s, r in base.transitions.items()},
        "dispatch": base.dispatch,
        "completes": base.completes,
        "final": base.final,
        "milestones": dict(base.milestones),
        "doc": base.doc,
    }
    fields.update(changes)
    with pytest.raises(ValueError) as info:
        ProtocolTable(**fields)
    return str(info.value).split(": ", 1)[1].split("; ")


def test_protocol_checker_rejects_a_dispatched_state_leading_back_before_dispatch() -> None:
    transitions = {s: dict(r) for s, r in EXAMPLE.transitions.items()}
    transitions["acked"]["retry_connect"] = "connected"
    problems = _table_with(EXAMPLE, transitions=transitions)
    assert (
        "acked --retry_connect--> connected: leads from a dispatched state back before "
        "dispatch" in problems
    )


def test_protocol_checker_rejects_missing_marks_and_unreachable_states() -> None:
    problems = _table_with(EXAMPLE, dispatch=frozenset())
    assert "no transition is marked as the dispatch boundary" in problems
    # without a boundary nothing is "after dispatch", so the completes marks are premature too
    assert "acked --end--> proves completeness before dispatch" in problems
    assert _table_with(EXAMPLE, completes=frozenset()) == [
        "no transition is marked as proving completeness"
    ]
    states = {**EXAMPLE.states, "orphan": "never entered"}
    assert _table_with(EXAMPLE, states=states) == ["state 'orphan' is unreachable"]
    problems = _table_with(EXAMPLE, completes=frozenset({("idle", "connect")}))
    assert "idle --connect--> proves completeness before dispatch" in problems


def test_every_dispatched_lifecycle_state_is_only_reachable_through_dispatch() -> None:
    from affidavit.statemachine.graph import post_boundary_states

    boundary = {(s, ev) for s, ev, _d in lc.edges() if ev == E.DISPATCH_STARTED.value}
    post = post_boundary_states(lc.INITIAL, lc.edges(), boundary)
    assert post == DISPATCHED_STATES
