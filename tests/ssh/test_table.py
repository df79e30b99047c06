"""The SSH protocol table: structure, dispatch boundary, completeness — without sockets."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from affidavit.adapters.ssh import SSH_TABLE
from affidavit.statemachine import ProtocolMachine, ProtocolViolation, registered
from tests.statemachine.lifecycle_helpers import protocol_paths, protocol_walks

EVENTS = sorted({ev for row in SSH_TABLE.transitions.values() for ev in row})
SETUP = ["tcp_connected", "transport_ready", "host_key_verified", "authenticated", "session_open"]
START = [*SETUP, "exec", "exec_sent", "exec_accepted"]


def _run(events: list[str]) -> ProtocolMachine:
    m = ProtocolMachine(SSH_TABLE)
    m.fire_all(events)
    return m


def test_table_is_registered_and_sound() -> None:
    assert registered()["ssh"] is SSH_TABLE
    assert SSH_TABLE.problems() == []


def test_the_exec_request_is_the_only_dispatch_boundary() -> None:
    assert SSH_TABLE.dispatch == frozenset({("session_open", "exec")})
    m = _run(SETUP)
    assert not m.dispatched and m.crosses_dispatch("exec")
    m.fire("exec")
    assert (m.dispatched, m.state) == (True, "exec_requesting")


def test_every_setup_state_can_fail_as_not_attempted() -> None:
    for n in range(len(SETUP) + 1):
        m = _run([*SETUP[:n], "setup_failed"])
        assert m.state == "setup_failed" and not m.dispatched


@pytest.mark.parametrize(
    "tail",
    [
        ["stdout", "stderr", "exit_status", "eof", "channel_closed"],
        ["stdout", "eof", "exit_status", "channel_closed"],
        ["exit_status", "stdout", "stderr", "eof", "channel_closed"],
        ["stderr", "exit_signal", "eof", "channel_closed"],
        ["eof", "exit_signal", "channel_closed"],
    ],
)
def test_exit_report_and_eof_in_either_order_then_close_completes(tail: list[str]) -> None:
    m = _run([*START, *tail])
    assert m.state == "closed" and m.complete


@pytest.mark.parametrize(
    "tail",
    [
        ["stdout", "eof", "channel_closed"],  # RFC 4254 §6.10: exit-status omitted
        ["channel_closed"],
        ["stdout", "exit_status", "connection_lost"],  # exit-status, then the stream breaks
        ["exit_status", "eof", "connection_lost"],  # no CHANNEL_CLOSE
        ["stdout", "cancelled"],
        ["timed_out"],
    ],
)
def test_anything_short_of_exit_eof_and_close_is_not_complete(tail: list[str]) -> None:
    m = _run([*START, *tail])
    assert m.dispatched and not m.complete


def test_close_before_eof_after_exit_is_impossible() -> None:
    # Closing is only proof once EOF was seen; the driver reads to EOF before it looks at close.
    m = _run([*START, "exit_status"])
    with pytest.raises(ProtocolViolation):
        m.fire("channel_closed")


def test_exec_refusal_is_a_complete_rejection() -> None:
    m = _run([*SETUP, "exec", "exec_sent", "exec_failure"])
    assert m.state == "exec_rejected" and m.complete and m.dispatched


def test_milestones_are_post_dispatch() -> None:
    assert dict(SSH_TABLE.milestones) == {
        "exec_sent": "REQUEST_SENT",
        "exec_accepted": "REMOTE_RESPONSE_STARTED",
    }


@settings(max_examples=300)
@given(protocol_walks(SSH_TABLE))
def test_any_event_sequence_never_returns_before_dispatch(events: list[str]) -> None:
    _check_walk(events)


def test_the_walks_checks_hold_on_every_edge() -> None:
    # The walk above follows enabled transitions; this proves its checks hold on every edge of
    # the table (each reached by its shortest path), whatever a run happens to draw.
    paths = protocol_paths(SSH_TABLE)
    taken: set[tuple[str, str, str]] = set()
    for src, ev, _dst in SSH_TABLE.edges():
        taken |= _check_walk([*paths[src], ev])
    assert taken == set(SSH_TABLE.edges())


def _check_walk(events: list[str]) -> set[tuple[str, str, str]]:
    # h2's test shape: feed events; each either fires into a declared state or raises
    # ProtocolViolation and leaves the state untouched; once dispatched, every state is a
    # post-dispatch one.  Returns the edges taken.
    m = ProtocolMachine(SSH_TABLE)
    was_dispatched = False
    taken = set()
    for ev in events:
        before = m.state
        try:
            step = m.fire(ev)
        except ProtocolViolation:
            assert m.state == before
            continue
        taken.add((before, ev, m.state))
        assert step.dest in SSH_TABLE.states
        assert m.dispatched or not was_dispatched
        if was_dispatched:
            assert m.state in SSH_TABLE.post_dispatch
        was_dispatched = m.dispatched
        if m.complete:
            assert m.state in SSH_TABLE.complete_states or m.state in SSH_TABLE.final
    return taken
