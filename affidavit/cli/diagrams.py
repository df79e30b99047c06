"""``affidavit diagrams [--check]``: regenerate (or check) diagrams/, docs/contract.md and the
envelope schema from the tables (``affidavit.docgen``)."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

from affidavit.cli import UsageError
from affidavit.docgen import (
    DiagramError,
    check_files,
    find_root,
    generated_files,
    write_files,
)

__all__ = ["add_commands"]


def _run(args: argparse.Namespace) -> int:
    root: Path | None = args.root
    if root is None:
        root = find_root(Path.cwd())
        if root is None:
            raise UsageError("run inside the affidavit checkout, or pass --root DIR")
    elif not root.is_dir():
        raise UsageError(f"--root {root}: not a directory")
    dot = shutil.which("dot")
    try:
        files = generated_files(dot)
    except DiagramError as exc:
        raise UsageError(str(exc)) from exc
    with_svg = dot is not None
    if args.check:
        report = check_files(root, files, with_svg)
        if report.ok:
            print(f"diagrams: {len(files)} generated files are current")
            return 0
        print("diagrams: generated files are out of date:")
        for line in report.lines():
            print(f"  {line}")
        print("run `affidavit diagrams` and commit the result")
        return 1
    report = write_files(root, files, with_svg)
    for rel in report.stale:
        print(f"updated {rel}")
    for rel in report.missing:
        print(f"wrote   {rel}")
    for rel in report.extra:
        print(f"removed {rel}")
    if not with_svg:
        print("diagrams: `dot` not found; .svg files were not regenerated (install graphviz)")
    if report.ok:
        print(f"diagrams: {len(files)} generated files already current")
    return 0


def add_commands(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "diagrams",
        help="generate state diagrams and contract docs from the tables",
        description=(
            "Write diagrams/ (Mermaid, dot, and SVG when Graphviz `dot` is on PATH) for the "
            "lifecycle machine and every registered protocol table, plus docs/contract.md and "
            "docs/envelope.schema.json.  With --check, write nothing and exit 1 when any "
            "generated file is stale, missing or extra."
        ),
    )
    p.add_argument("--check", action="store_true", help="fail if generated files are stale")
    p.add_argument(
        "--root", type=Path, default=None, help="checkout root (default: found from cwd)"
    )
    p.set_defaults(handler=_run)
