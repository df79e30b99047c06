"""The lifecycle diagram of one invocation, as SVG drawn here from the lifecycle table.

Why not Graphviz or Mermaid: ``dot`` is a system program the daemon must not need, and
Mermaid.js is ~3 MB to vendor and runs in the browser (the console's CSP allows one small
script).  The table is small (about 30 states), so a layered layout computed here is enough:
each state's column is its distance from ``new`` (breadth first), rows within a column follow
their predecessors' rows (one barycentre pass), edges are curves, back edges bend below.  The
invocation's path -- the states its events folded through, in order (``Projector``) -- is
drawn over it, the current state marked.  Nothing in the picture comes from the remote: names
are the table's, escaped all the same.  Styling is by class from console.css (the CSP forbids
inline style); colours follow the state's outcome.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from html import escape

from affidavit.statemachine import INITIAL, STATES, Event, Projector
from affidavit.statemachine.lifecycle import edges

__all__ = ["lifecycle_svg", "path_of"]

W, H = 168, 24
"""A state's box."""
DX, DY = 196, 32
"""Column and row pitch."""
PAD = 12


def path_of(events: Iterable[Event]) -> list[str]:
    """The states an invocation went through, in order, from ``new`` (repeats folded)."""
    projector = Projector()
    path = [INITIAL]
    for event in events:
        state = projector.apply(event)
        if state != path[-1]:
            path.append(state)
    return path


def _layout() -> dict[str, tuple[float, float]]:
    succ: dict[str, list[str]] = {}
    pred: dict[str, list[str]] = {}
    for src, _ev, dst in edges():
        if src != dst:
            succ.setdefault(src, []).append(dst)
            pred.setdefault(dst, []).append(src)
    depth = {INITIAL: 0}
    todo = [INITIAL]
    while todo:
        nxt = []
        for s in todo:
            for d in succ.get(s, ()):
                if d not in depth:
                    depth[d] = depth[s] + 1
                    nxt.append(d)
        todo = nxt
    for name in STATES:  # (every state is reachable: statemachine.lifecycle.problems)
        depth.setdefault(name, max(depth.values()) + 1)
    row: dict[str, float] = {}
    for layer in range(max(depth.values()) + 1):
        names = sorted(n for n in STATES if depth[n] == layer)

        def centre(n: str) -> tuple[float, str]:
            ps = [row[p] for p in pred.get(n, ()) if p in row]
            return (sum(ps) / len(ps) if ps else 0.0, n)

        for i, n in enumerate(sorted(names, key=centre)):
            row[n] = float(i)
    return {n: (PAD + depth[n] * DX, PAD + row[n] * DY) for n in STATES}


_POS = _layout()


def _curve(a: tuple[float, float], b: tuple[float, float]) -> str:
    (x1, y1), (x2, y2) = a, b
    if x2 > x1:
        sx, sy, ex, ey = x1 + W, y1 + H / 2, x2, y2 + H / 2
        c = (ex - sx) / 2
        return f"M{sx:.0f},{sy:.0f} C{sx + c:.0f},{sy:.0f} {ex - c:.0f},{ey:.0f} {ex:.0f},{ey:.0f}"
    # Back or same-column edge: out of the bottom, into the bottom.
    sx, sy, ex, ey = x1 + W / 2 + 8, y1 + H, x2 + W / 2 - 8, y2 + H
    low = max(sy, ey) + 26
    return f"M{sx:.0f},{sy:.0f} C{sx:.0f},{low:.0f} {ex:.0f},{low:.0f} {ex:.0f},{ey:.0f}"


def lifecycle_svg(path: Sequence[str]) -> str:
    """The SVG markup (to inline in a page) with ``path`` drawn and its last state current."""
    pairs: dict[tuple[str, str], list[str]] = {}
    for src, ev, dst in edges():
        if src != dst:
            pairs.setdefault((src, dst), []).append(ev)
    walked = set(itertools.pairwise(path))
    visited = set(path)
    current = path[-1] if path else None
    width = max(x for x, _ in _POS.values()) + W + PAD
    height = max(y for _, y in _POS.values()) + H + PAD + 30
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="lifecycle" width="{width:.0f}" '
        f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" role="img" '
        'aria-label="lifecycle of this invocation">',
        "<defs>",
        '<marker id="arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7" '
        'markerHeight="7" orient="auto"><path d="M0,0 L8,4 L0,8 z" class="arrowhead"/></marker>',
        '<marker id="arrow-on" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7" '
        'markerHeight="7" orient="auto"><path d="M0,0 L8,4 L0,8 z" class="arrowhead on"/>'
        "</marker>",
        "</defs>",
    ]
    # Off-path edges first, the path on top of them.
    for on in (False, True):
        for (src, dst), evs in sorted(pairs.items()):
            if ((src, dst) in walked) != on:
                continue
            cls = "edge on" if on else "edge"
            marker = "arrow-on" if on else "arrow"
            title = escape(f"{src} → {dst}: {', '.join(sorted(evs))}")
            out.append(
                f'<path class="{cls}" d="{_curve(_POS[src], _POS[dst])}" '
                f'marker-end="url(#{marker})"><title>{title}</title></path>'
            )
    for name, spec in STATES.items():
        x, y = _POS[name]
        classes = ["state", spec.outcome.value]
        if name in visited:
            classes.append("visited")
        if name == current:
            classes.append("current")
        label = escape(name)
        doc = escape(f"{name}: {spec.phase.value} / {spec.outcome.value} -- {spec.doc}")
        out.append(
            f'<g class="{" ".join(classes)}" data-state="{label}"><title>{doc}</title>'
            f'<rect x="{x:.0f}" y="{y:.0f}" width="{W}" height="{H}" rx="5"/>'
            f'<text x="{x + W / 2:.0f}" y="{y + H / 2 + 4:.0f}">{label}</text></g>'
        )
    out.append("</svg>")
    return "\n".join(out)
