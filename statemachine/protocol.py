"""The protocol-machine base: how an adapter declares its own fine-grained table.

The lifecycle machine knows nothing of HTTP or SSH.  Each adapter declares, as data, the steps its
protocol goes through (HTTP: headers_sent, body_sent, informational, response_headers,
framing_complete, closed_early; SSH: exec_requesting, exec_accepted, exit_status_seen, ...) and
marks two kinds of transitions:

* **dispatch** — crossing it means application bytes (or the SSH ``exec`` request) may reach the
  remote.  The driver must ask ``crosses_dispatch()`` *before* it writes and await the engine's
  durable DISPATCH_STARTED barrier first (seed: "Before the first handoff to the transport, append
  dispatch_started").
* **completes** — reaching it proves the remote result is complete and authentic (h11's
  EndOfMessage of a final response; SSH exit-status/signal plus EOF on both streams and close).

From those marks the base derives, for any failure at any moment, the only thing the engine needs:
was the boundary crossed (``dispatched``) and was completeness proven (``complete``).  The
outcome of a failure is decided by the *last proven boundary*, never by which function raised.

``ProtocolTable`` validates itself on construction and the model-checking tests run the same graph
checks over every registered table, so a table that lets a dispatched state lead back to a
pre-dispatch state cannot be registered.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

from .graph import post_boundary_states, reachable

__all__ = [
    "ProtocolMachine",
    "ProtocolTable",
    "ProtocolViolation",
    "Step",
    "register",
    "registered",
    "unregister",
]


MILESTONE_EVENTS = frozenset({"REQUEST_SENT", "REMOTE_RESPONSE_STARTED"})


class ProtocolViolation(Exception):
    """An event the protocol table does not allow in the current state (our misuse or the peer's
    misbehaviour — the driver decides which and converts it, ``raise ... from``)."""

    def __init__(self, table: str, state: str, event: str) -> None:
        self.table, self.state, self.event = table, state, event
        super().__init__(f"{table}: event {event!r} is not allowed in state {state!r}")


@dataclass(frozen=True)
class ProtocolTable:
    """A protocol's fine-grained states and transitions, declared as data."""

    name: str
    initial: str
    states: Mapping[str, str]
    """state name -> one-line description"""
    transitions: Mapping[str, Mapping[str, str]]
    """state -> {event: destination}; a missing key is an impossible event"""
    dispatch: frozenset[tuple[str, str]]
    """(state, event) pairs that cross the dispatch boundary"""
    completes: frozenset[tuple[str, str]]
    """(state, event) pairs whose destination proves a complete, authentic result"""
    final: frozenset[str] = field(default_factory=frozenset)
    """states where the machine may rest (closed, failed, complete)"""
    milestones: Mapping[str, str] = field(default_factory=dict)
    """state -> lifecycle event the engine records on first entering it: ``REQUEST_SENT`` (the
    whole request reached the transport) or ``REMOTE_RESPONSE_STARTED`` (final response headers /
    exec accepted).  Both must be post-dispatch states."""
    doc: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "states", MappingProxyType(dict(self.states)))
        object.__setattr__(self, "milestones", MappingProxyType(dict(self.milestones)))
        object.__setattr__(
            self,
            "transitions",
            MappingProxyType({s: MappingProxyType(dict(t)) for s, t in self.transitions.items()}),
        )
        problems = self.problems()
        if problems:
            raise ValueError(
                f"protocol table {self.name!r} is inconsistent: " + "; ".join(problems)
            )

    # -- derived facts --------------------------------------------------------------------------

    def edges(self) -> list[tuple[str, str, str]]:
        """(source, event, dest) triples, sorted."""
        return sorted(
            (src, ev, dst) for src, row in self.transitions.items() for ev, dst in row.items()
        )

    @cached_property
    def post_dispatch(self) -> frozenset[str]:
        """States only reachable by crossing a dispatch transition.  Cached: the table is
        immutable and every ``ProtocolMachine`` (one per attempt) reads it, and the graph walk
        cost ~0.3 ms a call (tests/benchmarks/http_overhead.py)."""
        return post_boundary_states(self.initial, self.edges(), self.dispatch)

    @cached_property
    def steps(self) -> Mapping[tuple[str, str], Step]:
        """(state, event) -> the ``Step`` firing it makes: every field follows from the table, and
        a ``Step`` is immutable, so each is built once per table instead of once per fired event
        (a frozen dataclass's ``__init__`` per event, several per call: issue 15)."""
        return MappingProxyType(
            {
                (src, ev): Step(
                    src, ev, dst, (src, ev) in self.dispatch, (src, ev) in self.completes
                )
                for src, row in self.transitions.items()
                for ev, dst in row.items()
            }
        )

    @property
    def complete_states(self) -> frozenset[str]:
        return frozenset(self.transitions[s][e] for s, e in self.completes)

    def problems(self) -> list[str]:
        """Every structural rule this table breaks (empty when sound)."""
        out: list[str] = []
        names = set(self.states)
        if self.initial not in names:
            out.append(f"initial state {self.initial!r} is not declared")
        for src, row in self.transitions.items():
            if src not in names:
                out.append(f"transition source {src!r} is not declared")
            for ev, dst in row.items():
                if dst not in names:
                    out.append(f"{src} --{ev}--> {dst!r}: destination not declared")
        for kind, pairs in (("dispatch", self.dispatch), ("completes", self.completes)):
            for src, ev in sorted(pairs):
                if ev not in self.transitions.get(src, {}):
                    out.append(f"{kind} marks {src} --{ev}--> which is not a transition")
        for s in sorted(self.final - names):
            out.append(f"final state {s!r} is not declared")
        for s, kind in sorted(self.milestones.items()):
            if s not in names:
                out.append(f"milestone state {s!r} is not declared")
            if kind not in MILESTONE_EVENTS:
                out.append(f"milestone {s!r} names {kind!r}, not one of {sorted(MILESTONE_EVENTS)}")
        if out:
            return out
        if not self.dispatch:
            out.append("no transition is marked as the dispatch boundary")
        if not self.completes:
            out.append("no transition is marked as proving completeness")
        post = self.post_dispatch
        for src, ev, dst in self.edges():
            if src in post and dst not in post:
                out.append(
                    f"{src} --{ev}--> {dst}: leads from a dispatched state back before dispatch"
                )
        for s in sorted(self.milestones):
            if s not in post:
                out.append(f"milestone state {s!r} is reachable before dispatch")
        for src, ev in sorted(self.completes):
            if src not in post and (src, ev) not in self.dispatch:
                out.append(f"{src} --{ev}--> proves completeness before dispatch")
        seen = reachable(self.initial, self.edges())
        for s in sorted(names - seen):
            out.append(f"state {s!r} is unreachable")
        return out


@dataclass(frozen=True, slots=True)
class Step:
    """What one fired event did."""

    source: str
    event: str
    dest: str
    crossed_dispatch: bool
    completed: bool


class ProtocolMachine:
    """A running instance of a ``ProtocolTable``; the adapter's sans-IO core drives it.

    It keeps its state and two flags, never the steps it took: the peer decides how many
    there are (every body piece or output chunk is one), so a list of them grew with the
    response -- 1M one-byte chunks held 8.4 MB -- for no reader but tests.  ``fire`` returns
    each ``Step`` to its caller; the attempt's bounded record of them is the protocol
    summary's ``path`` (``affidavit/engine/steps.py``)."""

    __slots__ = ("_complete", "_dispatched", "_post", "_state", "_steps", "table")

    def __init__(self, table: ProtocolTable) -> None:
        self.table = table
        self._state = table.initial
        self._dispatched = False
        self._complete = False
        self._post = table.post_dispatch
        self._steps = table.steps

    @property
    def state(self) -> str:
        return self._state

    @property
    def dispatched(self) -> bool:
        """True once any dispatch transition fired (or is about to: see ``crosses_dispatch``)."""
        return self._dispatched

    @property
    def complete(self) -> bool:
        return self._complete

    def allows(self, event: str) -> bool:
        return event in self.table.transitions.get(self._state, {})

    def crosses_dispatch(self, event: str) -> bool:
        """Ask *before* writing: would firing ``event`` now cross the dispatch boundary?"""
        return (self._state, event) in self.table.dispatch

    def fire(self, event: str) -> Step:
        step = self._steps.get((self._state, event))
        if step is None:
            raise ProtocolViolation(self.table.name, self._state, event)
        dest = step.dest
        self._state = dest
        if step.crossed_dispatch or dest in self._post:
            self._dispatched = True
        if step.completed:
            self._complete = True
        return step

    def fire_all(self, events: Iterable[str]) -> list[Step]:
        return [self.fire(e) for e in events]


_REGISTRY: dict[str, ProtocolTable] = {}


def register(table: ProtocolTable) -> ProtocolTable:
    """Make a table known to diagrams and the model-checking tests.  Idempotent per name."""
    existing = _REGISTRY.get(table.name)
    if existing is not None and existing is not table:
        raise ValueError(f"another protocol table is already registered as {table.name!r}")
    _REGISTRY[table.name] = table
    return table


def unregister(name: str) -> None:
    """Forget a registered table (a protocol removed at run time, or a test's)."""
    _REGISTRY.pop(name, None)


def registered() -> dict[str, ProtocolTable]:
    """All registered protocol tables by name (adapters register on import)."""
    return dict(sorted(_REGISTRY.items()))
