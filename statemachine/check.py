"""The model check of a protocol table, installed with the package so that a plugin's own tests
run the same check as the repository's (``tests/statemachine/test_model_check.py``)::

    from affidavit.statemachine.check import check_table
    from myproto.protocol import PROTOCOL

    def test_my_table_passes_the_model_check() -> None:
        check_table(PROTOCOL.table)

Exhaustive and deterministic: every ``(state, event)`` pair of the table -- each state reached
by a shortest path from the initial one, each event the table names and one it does not -- is
fired through a ``ProtocolMachine``: a declared pair moves to its destination, crossing dispatch
or completing exactly as the table marks it; any other is refused with no change.  Needs no
test framework (no pytest, no hypothesis): a failure is ``ModelCheckError``, an
``AssertionError`` every runner reports.
"""

from __future__ import annotations

from collections import deque

from .protocol import ProtocolMachine, ProtocolTable, ProtocolViolation

__all__ = [
    "ModelCheckError",
    "check_every_pair_is_declared_or_refused",
    "check_table",
    "protocol_paths",
]


class ModelCheckError(AssertionError):
    """A table that fails the model check: the message names the table, state and event."""


def protocol_paths(table: ProtocolTable, start: str | None = None) -> dict[str, list[str]]:
    """A shortest path of events from a protocol table's initial state (or ``start``) to every
    reachable state: how a check brings a ``ProtocolMachine`` to any state through
    ``fire_all``."""
    first_state = table.initial if start is None else start
    paths: dict[str, list[str]] = {first_state: []}
    todo = deque([first_state])
    while todo:
        s = todo.popleft()
        for ev, dst in sorted(table.transitions.get(s, {}).items()):
            if dst not in paths:
                paths[dst] = [*paths[s], ev]
                todo.append(dst)
    return paths


def _expect(ok: bool, table: ProtocolTable, what: str) -> None:
    if not ok:
        raise ModelCheckError(f"{table.name}: {what}")


def check_every_pair_is_declared_or_refused(table: ProtocolTable) -> None:
    """Fire every ``(state, event)`` pair (see the module's docstring)."""
    paths = protocol_paths(table)
    unreachable = sorted(set(table.states) - set(paths))
    _expect(not unreachable, table, f"unreachable states {unreachable}")
    events = sorted({ev for _s, ev, _d in table.edges()} | {"not-an-event"})
    for state, path in sorted(paths.items()):
        for ev in events:
            m = ProtocolMachine(table)
            m.fire_all(path)
            snapshot = (m.state, m.dispatched, m.complete)
            dest = table.transitions.get(state, {}).get(ev)
            pair = f"({state}, {ev})"
            if dest is None:
                try:
                    m.fire(ev)
                except ProtocolViolation:
                    pass
                else:
                    raise ModelCheckError(f"{table.name}: {pair} is not declared but was taken")
                _expect((m.state, m.dispatched, m.complete) == snapshot, table, f"{pair} moved")
                continue
            step = m.fire(ev)
            _expect((step.source, step.event, step.dest) == (state, ev, dest), table, pair)
            _expect(m.state == dest, table, f"{pair} did not reach {dest}")
            crossed = (state, ev) in table.dispatch
            _expect(step.crossed_dispatch == crossed, table, f"{pair}: dispatch mark")
            _expect(step.completed == ((state, ev) in table.completes), table, f"{pair}: completes")
            # dispatched is sticky and exactly "we are past the boundary"
            past = snapshot[1] or step.crossed_dispatch or dest in table.post_dispatch
            _expect(m.dispatched == past, table, f"{pair}: dispatched is {m.dispatched}")


def check_table(table: ProtocolTable) -> None:
    """The table's structural checks (``ProtocolTable.problems``), then every pair."""
    problems = table.problems()
    _expect(not problems, table, "; ".join(problems))
    check_every_pair_is_declared_or_refused(table)
