"""Drawing a ``Graph``: Mermaid (renders natively where the repository is read), Graphviz dot
source, and SVG through the ``dot`` binary on demand.

Mermaid and dot are plain text written by this module, identical on every machine; SVG is
Graphviz's layout, whose bytes depend on the Graphviz version and fonts installed, so it is
rendered only when asked (``affidavit diagrams --svg DIR``) and never part of the checked set.
"""

from __future__ import annotations

import re
import subprocess
import textwrap
from collections.abc import Mapping

from .common import BANNER, DiagramError
from .graphs import Graph

__all__ = ["COLOURS", "dot_source", "mermaid_source", "svg_source"]

# Outcome colours (fill, stroke).  Protocol tables reuse them: before dispatch = not_attempted,
# after dispatch = unknown, complete = committed.
COLOURS: Mapping[str, tuple[str, str]] = {
    "not_attempted": ("#e8f0fe", "#1a73e8"),
    "unknown": ("#fff4e5", "#e37400"),
    "rejected": ("#fce8e6", "#c5221f"),
    "committed": ("#e6f4ea", "#137333"),
}
_DISPATCH_COLOUR = "#c5221f"
_COMPLETE_COLOUR = "#137333"


# --- Mermaid ----------------------------------------------------------------------------------


def _mm_id(name: str) -> str:
    # Prefix: Mermaid reserves words such as ``end`` as node ids.
    return "s_" + re.sub(r"[^A-Za-z0-9_]", "_", name)


def _mm_text(text: str) -> str:
    return text.replace('"', "#quot;")


def mermaid_source(g: Graph) -> str:
    lines = [f"%% {BANNER}", f"%% {g.title}", "flowchart LR"]
    for key, label in g.groups:
        members = [n for n in g.nodes if n.group == key]
        if not members:
            continue
        lines.append(f'  subgraph grp_{_mm_id(key)}["{_mm_text(label)}"]')
        for n in members:
            text = "<br/>".join(_mm_text(part) for part in n.label)
            shape = f'(["{text}"])' if n.final else f'["{text}"]'
            lines.append(f"    {_mm_id(n.id)}{shape}")
        lines.append("  end")
    styled: dict[str, list[int]] = {"dispatch": [], "complete": []}
    for i, e in enumerate(g.edges):
        arrow = "-->" if e.style == "plain" else "==>"
        text = "<br/>".join(_mm_text(x) for x in e.labels)
        lines.append(f'  {_mm_id(e.src)} {arrow}|"{text}"| {_mm_id(e.dst)}')
        if e.style in styled:
            styled[e.style].append(i)
    if g.notes or g.legend:
        items = [f"{meaning}" for _, meaning in g.legend] + list(g.notes)
        text = "<br/>".join(_mm_text(x) for x in items)
        lines.append(f'  legend["{text}"]')
    for key, (fill, stroke) in sorted(COLOURS.items()):
        lines.append(f"  classDef c_{key} fill:{fill},stroke:{stroke},color:#202124")
    lines.append("  classDef final stroke-width:3px")
    lines.append("  classDef legend fill:#ffffff,stroke:#9aa0a6,color:#202124")
    for key in sorted(COLOURS):
        ids = [_mm_id(n.id) for n in g.nodes if n.colour == key]
        if ids:
            lines.append(f"  class {','.join(ids)} c_{key}")
    finals = [_mm_id(n.id) for n in g.nodes if n.final]
    if finals:
        lines.append(f"  class {','.join(finals)} final")
    if g.notes or g.legend:
        lines.append("  class legend legend")
    for style, colour in (("dispatch", _DISPATCH_COLOUR), ("complete", _COMPLETE_COLOUR)):
        if styled[style]:
            idx = ",".join(str(i) for i in styled[style])
            lines.append(f"  linkStyle {idx} stroke:{colour},stroke-width:3px,color:{colour}")
    return "\n".join(lines) + "\n"


# --- Graphviz dot -----------------------------------------------------------------------------


def _dq(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _wrap(text: str, width: int = 110) -> str:
    return "\n".join(textwrap.wrap(text, width=width)) or text


def dot_source(g: Graph) -> str:
    lines = [
        f"// {BANNER}",
        f"digraph {_dq(g.name)} {{",
        f"  graph [rankdir=LR, fontname=Helvetica, labelloc=t, label={_dq(_wrap(g.title))}];",
        '  node [shape=box, style="rounded,filled", fontname=Helvetica, fontsize=11];',
        "  edge [fontname=Helvetica, fontsize=9];",
    ]
    for key, label in g.groups:
        members = [n for n in g.nodes if n.group == key]
        if not members:
            continue
        lines.append(f"  subgraph {_dq('cluster_' + key)} {{")
        lines.append(f'    label={_dq(label)}; style="rounded,dashed"; color="#9aa0a6";')
        for n in members:
            fill, stroke = COLOURS[n.colour]
            attrs = [
                f"label={_dq(chr(10).join(n.label))}",
                f"fillcolor={_dq(fill)}",
                f"color={_dq(stroke)}",
            ]
            if n.final:
                attrs.append("peripheries=2")
            lines.append(f"    {_dq(n.id)} [{', '.join(attrs)}];")
        lines.append("  }")
    for e in g.edges:
        attrs = [f"label={_dq(chr(10).join(e.labels))}"]
        if e.style == "dispatch":
            attrs += [f"color={_dq(_DISPATCH_COLOUR)}", f"fontcolor={_dq(_DISPATCH_COLOUR)}"]
            attrs.append("penwidth=3")
        elif e.style == "complete":
            attrs += [f"color={_dq(_COMPLETE_COLOUR)}", f"fontcolor={_dq(_COMPLETE_COLOUR)}"]
            attrs.append("penwidth=3")
        lines.append(f"  {_dq(e.src)} -> {_dq(e.dst)} [{', '.join(attrs)}];")
    if g.notes or g.legend:
        items = [meaning for _, meaning in g.legend] + list(g.notes)
        text = "\\l".join(x.replace("\\", "\\\\").replace('"', '\\"') for x in items) + "\\l"
        lines.append(f'  "legend" [shape=note, style=filled, fillcolor="#ffffff", label="{text}"];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def svg_source(dot_text: str, dot: str) -> str:
    """Render with Graphviz; the banner goes in as an XML comment after the declaration."""
    try:
        proc = subprocess.run(
            [dot, "-Tsvg"],
            input=dot_text.encode(),
            capture_output=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DiagramError(f"could not run {dot!r}: {exc}") from exc
    if proc.returncode != 0:
        raise DiagramError(f"dot failed: {proc.stderr.decode(errors='replace').strip()}")
    svg = proc.stdout.decode()
    comment = f"<!-- {BANNER} -->\n"
    head, sep, rest = svg.partition("\n")
    if head.startswith("<?xml") and sep:
        return head + "\n" + comment + rest
    return comment + svg
