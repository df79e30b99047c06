"""The lifecycle diagram of one invocation, as SVG drawn here from the lifecycle table.

Why not Graphviz or Mermaid: ``dot`` is a system program the daemon must not need, and
Mermaid.js is ~3 MB to vendor and runs in the browser (the console's CSP allows one small
script).  The table is small (about 30 states), so a layered layout computed here is enough
(``_layout``: rows by longest path, top to bottom; curves; retries' back edges bent to the
right), about 900 pixels wide -- the width of the page, where a person reads it.  The
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

W, H = 164, 24
"""A state's box."""
DX, DY = 180, 46
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
    """Top to bottom: a state's row is the longest path to it from ``new`` once the cycles'
    back edges (retries) are set aside -- so dispatch, completion, storage and delivery read
    downwards in order; its place in the row follows its predecessors (one barycentre pass)."""
    succ: dict[str, list[str]] = {}
    for src, _ev, dst in edges():
        if src != dst and dst not in succ.setdefault(src, []):
            succ[src].append(dst)
    back: set[tuple[str, str]] = set()
    seen: dict[str, bool] = {}  # state -> still on the depth-first stack

    def visit(u: str) -> None:  # (about 30 states: the recursion is shallow)
        seen[u] = True
        for v in sorted(succ.get(u, ())):
            if seen.get(v):
                back.add((u, v))
            elif v not in seen:
                visit(v)
        seen[u] = False

    visit(INITIAL)
    pred: dict[str, list[str]] = {}
    for u, vs in succ.items():
        for v in vs:
            if (u, v) not in back:
                pred.setdefault(v, []).append(u)
    row: dict[str, int] = {}

    def depth(v: str) -> int:
        if v not in row:
            row[v] = 1 + max((depth(u) for u in pred.get(v, ())), default=-1)
        return row[v]

    for name in STATES:
        depth(name)
    width = max(sum(1 for n in STATES if row[n] == r) for r in set(row.values()))
    col: dict[str, float] = {}
    for r in range(max(row.values()) + 1):
        names = [n for n in STATES if row[n] == r]

        def centre(n: str) -> tuple[float, str]:
            ps = [col[u] for u in pred.get(n, ()) if u in col]
            return (sum(ps) / len(ps) if ps else (width - 1) / 2, n)

        offset = (width - len(names)) / 2
        for i, n in enumerate(sorted(names, key=centre)):
            col[n] = offset + i
    return {n: (PAD + col[n] * DX, PAD + row[n] * DY) for n in STATES}


_POS = _layout()


def _curve(a: tuple[float, float], b: tuple[float, float]) -> str:
    (x1, y1), (x2, y2) = a, b
    if y2 > y1:
        sx, sy, ex, ey = x1 + W / 2, y1 + H, x2 + W / 2, y2
        c = (ey - sy) / 2
        return f"M{sx:.0f},{sy:.0f} C{sx:.0f},{sy + c:.0f} {ex:.0f},{ey - c:.0f} {ex:.0f},{ey:.0f}"
    # Back edge (a retry): out of the right side, into the right side, bent outwards.
    sx, sy, ex, ey = x1 + W, y1 + H / 2, x2 + W, y2 + H / 2
    out = max(sx, ex) + 30
    return f"M{sx:.0f},{sy:.0f} C{out:.0f},{sy:.0f} {out:.0f},{ey:.0f} {ex:.0f},{ey:.0f}"


def lifecycle_svg(path: Sequence[str]) -> str:
    """The SVG markup (to inline in a page) with ``path`` drawn and its last state current."""
    pairs: dict[tuple[str, str], list[str]] = {}
    for src, ev, dst in edges():
        if src != dst:
            pairs.setdefault((src, dst), []).append(ev)
    walked = set(itertools.pairwise(path))
    visited = set(path)
    current = path[-1] if path else None
    width = max(x for x, _ in _POS.values()) + W + PAD + 40
    height = max(y for _, y in _POS.values()) + H + PAD
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="lifecycle" width="{width:.0f}" '
        f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" role="img" '
        'aria-label="lifecycle of this invocation">',
        "<defs>",
        *(
            f'<marker id="{mid}" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="8" '
            'markerHeight="8" markerUnits="userSpaceOnUse" orient="auto">'
            f'<path d="M0,0 L8,4 L0,8 z" class="{cls}"/></marker>'
            for mid, cls in (("arrow", "arrowhead"), ("arrow-on", "arrowhead on"))
        ),
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
