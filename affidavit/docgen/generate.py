"""The generated file set and its upkeep: what ``affidavit diagrams`` writes (``diagrams/``,
``docs/contract.md``, ``docs/envelope.schema.json``), ``check_files`` (what ``--check`` reports:
stale, missing, extra) and ``write_files``.

The tables are the single source of truth (DESIGN, "Two machines, one source of truth each");
every file here is derived from them.  Output is sorted and stable (no timestamps, no set
iteration order), so ``--check`` can compare bytes and CI can fail when a table changed but the
generated files did not (trio's ``gen_exports.py --test`` habit).  Adapters register their
tables when imported; ``load_all()`` imports every adapter package, so a new protocol shows up
here with no edit to this package.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from affidavit.statemachine import registered

from .common import BANNER
from .contract import contract_markdown, schema_json
from .graphs import Graph, lifecycle_graph, protocol_graph
from .render import dot_source, mermaid_source, svg_source

__all__ = [
    "DIAGRAM_DIR",
    "CheckReport",
    "check_files",
    "find_root",
    "generated_files",
    "write_files",
]

DIAGRAM_DIR = "diagrams"


def _graphs() -> list[Graph]:
    from affidavit.adapters import load_all

    load_all()
    return [lifecycle_graph()] + [protocol_graph(t) for t in registered().values()]


def _index(graphs: list[Graph], with_svg: bool) -> str:
    lines = [f"<!-- {BANNER} -->", "", "# Diagrams", ""]
    for g in graphs:
        files = [f"[{g.name}.mmd]({g.name}.mmd)", f"[{g.name}.dot]({g.name}.dot)"]
        if with_svg:
            files.append(f"[{g.name}.svg]({g.name}.svg)")
        lines += [f"## {g.title}", "", " · ".join(files), "", "```mermaid"]
        lines += [ln for ln in mermaid_source(g).splitlines() if not ln.startswith("%%")]
        lines += ["```", ""]
    return "\n".join(lines)


def generated_files(dot: str | None) -> dict[str, str]:
    """Every generated file (path relative to the repository root -> text).  SVGs only when
    ``dot`` (the Graphviz binary) is given."""
    graphs = _graphs()
    files: dict[str, str] = {}
    for g in graphs:
        dot_text = dot_source(g)
        files[f"{DIAGRAM_DIR}/{g.name}.mmd"] = mermaid_source(g)
        files[f"{DIAGRAM_DIR}/{g.name}.dot"] = dot_text
        if dot is not None:
            files[f"{DIAGRAM_DIR}/{g.name}.svg"] = svg_source(dot_text, dot)
    files[f"{DIAGRAM_DIR}/README.md"] = _index(graphs, dot is not None)
    files["docs/contract.md"] = contract_markdown()
    files["docs/envelope.schema.json"] = schema_json()
    return dict(sorted(files.items()))


@dataclass
class CheckReport:
    stale: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.stale or self.missing or self.extra)

    def lines(self) -> list[str]:
        return (
            [f"stale:   {p}" for p in self.stale]
            + [f"missing: {p}" for p in self.missing]
            + [f"extra:   {p}" for p in self.extra]
        )


def _existing(root: Path, with_svg: bool) -> set[str]:
    d = root / DIAGRAM_DIR
    if not d.is_dir():
        return set()
    out = set()
    for p in d.iterdir():
        if p.name.startswith(".") or not p.is_file():
            continue
        if p.suffix == ".svg" and not with_svg:
            continue  # without dot we cannot judge SVGs; CI (with graphviz) does
        out.add(f"{DIAGRAM_DIR}/{p.name}")
    return out


def check_files(root: Path, files: Mapping[str, str], with_svg: bool) -> CheckReport:
    report = CheckReport()
    for rel, text in files.items():
        path = root / rel
        if not path.is_file():
            report.missing.append(rel)
        elif path.read_bytes() != text.encode():
            report.stale.append(rel)
    report.extra = sorted(_existing(root, with_svg) - set(files))
    return report


def write_files(root: Path, files: Mapping[str, str], with_svg: bool) -> CheckReport:
    """Write what changed and delete extra files in diagrams/; report what was done."""
    before = check_files(root, files, with_svg)
    for rel in before.stale + before.missing:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(files[rel].encode())
    for rel in before.extra:
        (root / rel).unlink()
    return before


def find_root(start: Path) -> Path | None:
    """The checkout root: the nearest directory holding pyproject.toml and statemachine/."""
    for d in (start, *start.parents):
        if (d / "pyproject.toml").is_file() and (d / "statemachine").is_dir():
            return d
    return None
