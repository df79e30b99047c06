"""The generated file set and its upkeep: what ``affidavit diagrams`` writes (``diagrams/``,
``docs/contract.md``, ``docs/envelope.schema.json``), ``check_files`` (what ``--check`` reports:
stale, missing, extra) and ``write_files``.

The tables are the single source of truth (DESIGN, "Two machines, one source of truth each");
every file here is derived from them.  Output is sorted and stable (no timestamps, no set
iteration order), so ``--check`` can compare bytes and CI can fail when a table changed but the
generated files did not (trio's ``gen_exports.py --test`` habit).  Adapters register their
tables when imported; ``load_all()`` imports every adapter package, so a new in-repo protocol
shows up here with no edit to this package (``builtin_tables``).  The committed set is those
alone; a plugin's table is drawn when the caller passes it (``affidavit diagrams
--all-protocols``).

SVG is not in the set.  Its bytes are Graphviz's layout, which changes between Graphviz versions
and installed fonts, so a committed SVG made ``--check`` report "stale" on any machine with
another Graphviz, and machines without Graphviz could not judge it at all (the verdict depended
on what happened to be installed).  Laying a graph out without Graphviz would mean writing a
layout engine.  Mermaid renders natively where people read the repository (diagrams/README.md
embeds every graph), the ``.dot`` files stay committed for Graphviz users, and
``affidavit diagrams --svg DIR`` renders SVGs on demand (``svg_files``).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from affidavit.statemachine import ProtocolTable, registered

from .common import BANNER, DiagramError
from .contract import contract_markdown, schema_json
from .graphs import Graph, lifecycle_graph, operation_graph, protocol_graph
from .render import dot_source, mermaid_source, svg_source

__all__ = [
    "DIAGRAM_DIR",
    "CheckReport",
    "builtin_tables",
    "check_files",
    "find_root",
    "generated_files",
    "svg_files",
    "write_files",
]

DIAGRAM_DIR = "diagrams"


def builtin_tables() -> dict[str, ProtocolTable]:
    """The repository's own protocol tables: every table an ``adapters/<proto>/`` package's
    modules registered when imported (held by one of them: ``HTTP_TABLE = register(...)``), by
    module rather than by name -- a table named otherwise than its folder, or a package's second
    table, is drawn too, and an in-repo protocol with no edit here.  Only those: a plugin
    installed from another distribution, or a table registered in this process, never changes
    what ``--check`` judges against the committed files (``affidavit diagrams --all-protocols
    --root DIR`` draws those, into a directory of their own)."""
    from affidavit.adapters import load_all

    names = load_all()  # (imports them: their tables register)
    tables = registered()
    found: dict[str, ProtocolTable] = {}
    for name in names:
        package = f"{load_all.__module__}.{name}"  # (affidavit.adapters)
        held = _held(package, tables)
        if not held:
            raise DiagramError(
                f"adapters/{name}/ registers no protocol table: none of {package}'s modules holds "
                f"one it registered (expected e.g. {name.upper()}_TABLE = register(...); "
                f"registered: {', '.join(tables) or 'none'}; docs/adding-a-protocol.md)"
            )
        found.update(held)
    return dict(sorted(found.items()))


def _held(package: str, tables: Mapping[str, ProtocolTable]) -> dict[str, ProtocolTable]:
    """The registered tables ``package``'s imported modules hold at module level."""
    held: dict[str, ProtocolTable] = {}
    for modname, module in list(sys.modules.items()):
        if module is None or (modname != package and not modname.startswith(package + ".")):
            continue
        for value in vars(module).values():
            if isinstance(value, ProtocolTable) and tables.get(value.name) is value:
                held[value.name] = value
    return held


def _tables(protocols: Mapping[str, ProtocolTable] | None) -> dict[str, ProtocolTable]:
    if protocols is not None:
        return dict(sorted(protocols.items()))
    return builtin_tables()


def _graphs(protocols: Mapping[str, ProtocolTable]) -> list[Graph]:
    return [lifecycle_graph(), operation_graph()] + [protocol_graph(t) for t in protocols.values()]


def _index(graphs: list[Graph]) -> str:
    lines = [
        f"<!-- {BANNER} -->",
        "",
        "# Diagrams",
        "",
        "Each diagram below is drawn by Mermaid where the repository is read; the `.dot` files "
        "are the same graphs for Graphviz. SVGs are not committed (Graphviz's output differs "
        "between versions): `affidavit diagrams --svg DIR` renders them where Graphviz is "
        "installed.",
        "",
    ]
    for g in graphs:
        files = [f"[{g.name}.mmd]({g.name}.mmd)", f"[{g.name}.dot]({g.name}.dot)"]
        lines += [f"## {g.title}", "", " · ".join(files), "", "```mermaid"]
        lines += [ln for ln in mermaid_source(g).splitlines() if not ln.startswith("%%")]
        lines += ["```", ""]
    return "\n".join(lines)


def generated_files(protocols: Mapping[str, ProtocolTable] | None = None) -> dict[str, str]:
    """Every committed generated file (path relative to the repository root -> text), for the
    lifecycle and ``protocols`` (default: ``builtin_tables()``, the repository's own).  Plain
    text only, identical on every machine: no file depends on an installed tool."""
    tables = _tables(protocols)
    graphs = _graphs(tables)
    files: dict[str, str] = {}
    for g in graphs:
        files[f"{DIAGRAM_DIR}/{g.name}.mmd"] = mermaid_source(g)
        files[f"{DIAGRAM_DIR}/{g.name}.dot"] = dot_source(g)
    files[f"{DIAGRAM_DIR}/README.md"] = _index(graphs)
    files["docs/contract.md"] = contract_markdown(tables)
    files["docs/envelope.schema.json"] = schema_json()
    return dict(sorted(files.items()))


def svg_files(dot: str, protocols: Mapping[str, ProtocolTable] | None = None) -> dict[str, str]:
    """``<graph>.svg`` -> SVG text for every graph, rendered by the Graphviz binary ``dot``:
    on demand (``affidavit diagrams --svg DIR``), never committed nor checked."""
    graphs = _graphs(_tables(protocols))
    return {f"{g.name}.svg": svg_source(dot_source(g), dot) for g in graphs}


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


def _existing(root: Path) -> set[str]:
    """Every file in diagrams/: anything not generated there (an SVG too) is extra."""
    d = root / DIAGRAM_DIR
    if not d.is_dir():
        return set()
    return {
        f"{DIAGRAM_DIR}/{p.name}" for p in d.iterdir() if p.is_file() and not p.name.startswith(".")
    }


def check_files(root: Path, files: Mapping[str, str]) -> CheckReport:
    report = CheckReport()
    for rel, text in files.items():
        path = root / rel
        if not path.is_file():
            report.missing.append(rel)
        elif path.read_bytes() != text.encode():
            report.stale.append(rel)
    report.extra = sorted(_existing(root) - set(files))
    return report


def write_files(root: Path, files: Mapping[str, str]) -> CheckReport:
    """Write what changed and delete extra files in diagrams/; report what was done."""
    before = check_files(root, files)
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
