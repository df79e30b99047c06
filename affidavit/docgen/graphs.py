"""The tables as graphs: the lifecycle table (``statemachine/lifecycle.py``) and every
registered protocol table become one neutral ``Graph`` each — nodes grouped and coloured, edges
merged and marked — which ``render`` draws as Mermaid, dot or SVG.

Output is sorted and stable (no set iteration order), so the generated files can be compared
byte for byte.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from affidavit.statemachine import (
    INITIAL,
    STATES,
    TRANSITIONS,
    EventKind,
    Outcome,
    Phase,
    ProtocolTable,
)
from affidavit.statemachine import lifecycle as _lifecycle
from affidavit.statemachine import operation as _operation

from .common import DiagramError

__all__ = [
    "GEdge",
    "Graph",
    "Node",
    "lifecycle_graph",
    "operation_graph",
    "protocol_graph",
    "protocol_slug",
    "split_trigger",
]


@dataclass(frozen=True, slots=True)
class Node:
    id: str
    label: tuple[str, ...]
    group: str
    colour: str
    """an outcome value: not_attempted | unknown | rejected | committed (``render.COLOURS``)"""
    final: bool


@dataclass(frozen=True, slots=True)
class GEdge:
    src: str
    dst: str
    labels: tuple[str, ...]
    style: str
    """plain | dispatch | complete"""


@dataclass(frozen=True, slots=True)
class Graph:
    name: str
    title: str
    groups: tuple[tuple[str, str], ...]
    """(key, label) in display order"""
    nodes: tuple[Node, ...]
    edges: tuple[GEdge, ...]
    notes: tuple[str, ...] = ()
    legend: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    """(colour key, meaning) pairs shown in the legend"""


def _merge_edges(
    triples: Iterable[tuple[str, str, str]],
    style_of: Callable[[str, str, str], str],
    marks: Mapping[str, str],
) -> tuple[GEdge, ...]:
    """One drawn edge per (source, dest, style); its label lists every event, sorted."""
    merged: dict[tuple[str, str, str], list[str]] = {}
    for src, ev, dst in triples:
        merged.setdefault((src, dst, style_of(src, ev, dst)), []).append(ev)
    out = []
    for (src, dst, style), events in sorted(merged.items()):
        labels = sorted(set(events))
        mark = marks.get(style)
        if mark is not None:
            labels.append(mark)
        out.append(GEdge(src, dst, tuple(labels), style))
    return tuple(out)


def _everywhere_self_loops(
    states: Iterable[str], initial: str, triples: list[tuple[str, str, str]]
) -> list[str]:
    """Events that only ever loop on their state and are allowed in every state but the initial
    one: diagnostics.  Drawing 2 loops on 30 states hides the table, so they become a note."""
    states = set(states)
    by_event: dict[str, list[tuple[str, str]]] = {}
    for src, ev, dst in triples:
        by_event.setdefault(ev, []).append((src, dst))
    out = []
    for ev, pairs in by_event.items():
        loops = all(s == d for s, d in pairs)
        where = {s for s, _ in pairs}
        if loops and len(where) >= 2 and where >= states - {initial}:
            out.append(ev)
    return sorted(out)


def lifecycle_graph() -> Graph:
    """The lifecycle table as a graph: states grouped by phase, coloured by outcome; the
    DISPATCH_STARTED edges are the dispatch boundary, and the edges that resolve an unknown
    outcome (complete result or reconciliation) are found from the states' outcomes."""
    outcomes = {name: spec.outcome for name, spec in STATES.items()}
    triples = _lifecycle.edges()
    hidden = _everywhere_self_loops(STATES, INITIAL, triples)
    drawn = [(s, split_trigger(s, e, d), d) for s, e, d in triples if e not in hidden]

    def style(src: str, ev: str, dst: str) -> str:
        a, b = outcomes[src], outcomes[dst]
        if ev == EventKind.DISPATCH_STARTED.value:
            # The first attempt's and every retry's boundary (seed: "The moment of dispatch
            # must be an explicit, durable state transition").
            return "dispatch"
        if a is Outcome.UNKNOWN and b in (Outcome.REJECTED, Outcome.COMMITTED):
            return "complete"
        return "plain"

    nodes = tuple(
        Node(
            id=name,
            label=(name, spec.outcome.value + (", final" if spec.final else "")),
            group=spec.phase.value,
            colour=spec.outcome.value,
            final=spec.final,
        )
        for name, spec in sorted(STATES.items())
    )
    notes = []
    if hidden:
        notes.append(
            "Allowed in every state except "
            + INITIAL
            + " without changing it (not drawn): "
            + ", ".join(hidden)
        )
    notes.append("Double border / rounded: final state (an invocation may rest there)")
    notes.append("Red bold edge: dispatch boundary (DISPATCH_STARTED, durable before any byte)")
    notes.append("Green bold edge: complete result or reconciliation resolves an unknown outcome")
    notes.append("EVENT:outcome = the event's attrs.outcome selects the destination")
    return Graph(
        name="lifecycle",
        title="Affidavit invocation lifecycle (statemachine/lifecycle.py)",
        groups=tuple((p.value, f"phase: {p.value}") for p in Phase),
        nodes=nodes,
        edges=_merge_edges(
            drawn, style, {"dispatch": "[dispatch boundary]", "complete": "[outcome resolved]"}
        ),
        notes=tuple(notes),
        legend=tuple((o.value, f"outcome {o.value}") for o in Outcome),
    )


# The operation's states drawn in the contract's colours: no job yet, pending (unknown), and
# the two ends a status query can read.
_OPERATION_COLOURS = {
    "none": "not_attempted",
    "pending": "unknown",
    "succeeded": "committed",
    "failed": "rejected",
}


def operation_graph() -> Graph:
    """The operation table (``statemachine/operation.py``) as a graph: a job a complete 202
    accepted, moved only by what a status query read; the edges that end it are marked."""
    triples = [(src, _operation.trigger(src, ev, dst), dst) for src, ev, dst in _operation.edges()]

    def style(src: str, ev: str, dst: str) -> str:
        return "complete" if _operation.STATES[dst].terminal else "plain"

    nodes = tuple(
        Node(
            id=name,
            label=(name, "terminal" if spec.terminal else "open"),
            group="operation",
            colour=_OPERATION_COLOURS[name],
            final=spec.terminal,
        )
        for name, spec in sorted(_operation.STATES.items())
    )
    return Graph(
        name="operation",
        title="Operation of a job accepted by a 202 (statemachine/operation.py)",
        groups=(("operation", "operation"),),
        nodes=nodes,
        edges=_merge_edges(triples, style, {"complete": "[job ended]"}),
        notes=(
            "The events live in the submitting invocation's stream, after its complete 202",
            "Green bold edge: a status query (remote_query) read that the job ended",
            "EVENT:state = the event's attrs.state selects the destination",
        ),
        legend=(
            ("not_attempted", "no job accepted"),
            ("unknown", "job pending"),
            ("committed", "job succeeded"),
            ("rejected", "job failed"),
        ),
    )


def split_trigger(src: str, ev: str, dst: str) -> str:
    """The event as drawn and tabled: ``EVENT:outcome`` where the event's ``attrs.outcome``
    selects the destination."""
    raw = TRANSITIONS[src][EventKind(ev)]
    if raw in _lifecycle.OUTCOME_SPLIT:
        return f"{ev}:{STATES[dst].outcome.value}"
    return ev


def protocol_graph(table: ProtocolTable) -> Graph:
    """A protocol table as a graph: states grouped and coloured by the dispatch boundary, with
    the table's own ``dispatch`` and ``completes`` marks drawn bold."""
    post = table.post_dispatch
    complete = table.complete_states
    triples = table.edges()
    hidden = _everywhere_self_loops(table.states, table.initial, triples)
    drawn = [t for t in triples if t[1] not in hidden]

    def style(src: str, ev: str, dst: str) -> str:
        if (src, ev) in table.dispatch:
            return "dispatch"
        if (src, ev) in table.completes:
            return "complete"
        return "plain"

    def colour(state: str) -> str:
        if state in complete:
            return "committed"
        return "unknown" if state in post else "not_attempted"

    nodes = tuple(
        Node(
            id=name,
            label=(name,),
            group="after" if name in post else "before",
            colour=colour(name),
            final=name in table.final,
        )
        for name in sorted(table.states)
    )
    notes = []
    if hidden:
        notes.append(
            "Allowed in every state except "
            + table.initial
            + " without changing it (not drawn): "
            + ", ".join(hidden)
        )
    notes.append("Double border / rounded: final state")
    notes.append("Red bold edge: dispatch boundary; green bold edge: proves a complete result")
    doc = _first_sentence(table.doc)
    return Graph(
        name=f"protocol-{protocol_slug(table.name)}",
        title=f"Protocol table {table.name!r}" + (f": {doc}" if doc else ""),
        groups=(("before", "before dispatch"), ("after", "after dispatch")),
        nodes=nodes,
        edges=_merge_edges(
            drawn, style, {"dispatch": "[dispatch boundary]", "complete": "[completes]"}
        ),
        notes=tuple(notes),
        legend=(
            ("not_attempted", "before dispatch"),
            ("unknown", "after dispatch"),
            ("committed", "proven complete"),
        ),
    )


def _first_sentence(doc: str, limit: int = 160) -> str:
    """The table doc's first sentence: a title, not the whole module docstring."""
    text = " ".join(doc.strip().split("\n\n", 1)[0].split())
    head, dot, _rest = text.partition(". ")
    text = head + ("." if dot else "")
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def protocol_slug(name: str) -> str:
    """A protocol table's name as used in file names (``diagrams/protocol-<slug>.mmd``)."""
    slug = re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-")
    if not slug:
        raise DiagramError(f"protocol table name {name!r} has no usable file name")
    return slug
