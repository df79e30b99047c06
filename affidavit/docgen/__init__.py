"""The contract and diagram generator (``affidavit diagrams [--check]``): ``diagrams/``,
``docs/contract.md`` and ``docs/envelope.schema.json`` derived from the tables.

Read in this order: ``graphs`` (the tables as graphs), ``render`` (Mermaid, dot, SVG),
``contract`` (the contract page and the envelope schema), ``generate`` (the file set, ``--check``
and writing).
"""

from .common import BANNER, DiagramError
from .contract import contract_markdown, member_docs, schema_json, table_cell
from .generate import (
    DIAGRAM_DIR,
    CheckReport,
    builtin_tables,
    check_files,
    find_root,
    generated_files,
    svg_files,
    write_files,
)
from .graphs import (
    GEdge,
    Graph,
    Node,
    lifecycle_graph,
    operation_graph,
    protocol_graph,
    protocol_slug,
)
from .render import COLOURS, dot_source, mermaid_source, svg_source

__all__ = [
    "BANNER",
    "COLOURS",
    "DIAGRAM_DIR",
    "CheckReport",
    "DiagramError",
    "GEdge",
    "Graph",
    "Node",
    "builtin_tables",
    "check_files",
    "contract_markdown",
    "dot_source",
    "find_root",
    "generated_files",
    "lifecycle_graph",
    "member_docs",
    "mermaid_source",
    "operation_graph",
    "protocol_graph",
    "protocol_slug",
    "schema_json",
    "svg_files",
    "svg_source",
    "table_cell",
    "write_files",
]
