"""``affidavit diagrams [--check]``: regenerate (or check) diagrams/, docs/contract.md and the
envelope schema from the tables (``affidavit.docgen``); ``affidavit diagrams --svg DIR``
renders the diagrams as SVG with Graphviz, on demand and outside the checked set."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

from affidavit.cli import SECRETS_NONE, UsageError, refusal

__all__ = ["add_commands"]


def _root(args: argparse.Namespace) -> Path | None:
    from affidavit.docgen import find_root

    root: Path | None = args.root
    if root is None:
        return find_root(Path.cwd())
    if not root.is_dir():
        raise refusal("not a directory", "INVALID_FIELD", "--root")
    return root


def _is_a_checkout(root: Path) -> bool:
    """``root`` is an affidavit checkout's own root (``--root .`` inside one, or its path):
    plugin files written there are "extra" to every later ``--check``."""
    from affidavit.docgen import find_root

    resolved = root.resolve()
    return find_root(resolved) == resolved


def _tables(args: argparse.Namespace) -> Any:
    """None (the repository's own tables, the committed set) or, with ``--all-protocols``,
    every protocol installed (entry points of any distribution) or registered in this process
    besides them -- a plugin's, drawn into a directory of its author's (``--root``)."""
    if not args.all_protocols:
        return None
    from affidavit.docgen import builtin_tables
    from affidavit.protocols import ProtocolLoadError, registered
    from affidavit.statemachine import registered as tables

    try:
        registered()
    except ProtocolLoadError as exc:
        raise UsageError(str(exc), "DIAGRAM_FAILED") from None
    return {**builtin_tables(), **tables()}


def _run(args: argparse.Namespace) -> int:
    # The docgen (and the tables it reads) only when this command runs: every command's
    # parser imports this module.
    from affidavit.docgen import DiagramError, check_files, generated_files, write_files

    if args.svg is not None:
        return _svg(args, args.svg)
    root = _root(args)
    if args.all_protocols and args.root is None:
        # The checkout's committed set is its own protocols: a plugin drawn into it would be
        # an "extra" file to every other developer's --check.
        raise refusal(
            "--all-protocols draws installed plugins: name their own directory with --root",
            "INVALID_FIELD",
            "--root",
        )
    if args.all_protocols and root is not None and _is_a_checkout(root):
        raise refusal(
            f"{args.root} is an affidavit checkout: --all-protocols draws installed plugins "
            "into their own directory, never the committed set",
            "INVALID_FIELD",
            "--root",
        )
    if root is None:
        raise refusal(
            "the checkout's directory, needed unless you run inside the affidavit checkout",
            "INVALID_FIELD",
            "--root",
        )
    try:
        files = generated_files(_tables(args))
    except DiagramError as exc:
        raise UsageError(str(exc), "DIAGRAM_FAILED") from exc
    if args.check:
        report = check_files(root, files)
        if report.ok:
            print(f"diagrams: {len(files)} generated files are current")
            return 0
        print("diagrams: generated files are out of date:")
        for line in report.lines():
            print(f"  {line}")
        print("run `affidavit diagrams` and commit the result")
        return 1
    report = write_files(root, files)
    for rel in report.stale:
        print(f"updated {rel}")
    for rel in report.missing:
        print(f"wrote   {rel}")
    for rel in report.extra:
        print(f"removed {rel}")
    if report.ok:
        print(f"diagrams: {len(files)} generated files already current")
    return 0


def _svg(args: argparse.Namespace, dest: Path) -> int:
    from affidavit.docgen import DIAGRAM_DIR, DiagramError, svg_files

    root = _root(args)
    if root is not None and dest.resolve() == (root / DIAGRAM_DIR).resolve():
        # An SVG there is an extra file to --check (and `affidavit diagrams` removes it).
        raise refusal(
            f"{dest}: SVGs are not committed; render them elsewhere (e.g. /tmp/svg)",
            "INVALID_FIELD",
            "--svg",
        )
    dot = shutil.which("dot")
    if dot is None:
        raise UsageError(
            "--svg needs Graphviz's `dot` on PATH (install graphviz); the committed .mmd and "
            ".dot files need no tool",
            "DEPENDENCY_MISSING",
        )
    try:
        svgs = svg_files(dot, _tables(args))
    except DiagramError as exc:
        raise UsageError(str(exc), "DIAGRAM_FAILED") from exc
    try:
        dest.mkdir(parents=True, exist_ok=True)
        for name, text in svgs.items():
            (dest / name).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise refusal(f"{dest}: {exc.strerror or exc}", "FILE_UNUSABLE", "--svg") from exc
    for name in svgs:
        print(f"wrote   {dest / name}")
    return 0


def add_commands(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "diagrams",
        help="generate state diagrams and contract docs from the tables",
        description=(
            "Write diagrams/ (Mermaid and Graphviz dot) for the lifecycle machine and each of "
            "the repository's own protocol tables (adapters/<proto>/; --all-protocols: also "
            "installed plugins'), plus docs/contract.md and docs/envelope.schema.json.  "
            "With --check, write nothing and exit 1 when any generated file is stale, missing "
            "or extra.  None of these files depends on an installed tool.  --svg DIR renders "
            "SVGs with Graphviz into DIR instead (not committed: Graphviz's output differs "
            "between versions)."
        ),
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="fail if generated files are stale")
    mode.add_argument(
        "--svg", type=Path, default=None, metavar="DIR", help="render SVGs into DIR (needs dot)"
    )
    p.add_argument(
        "--root", type=Path, default=None, help="checkout root (default: found from cwd)"
    )
    p.add_argument(
        "--all-protocols",
        action="store_true",
        help="also draw every installed protocol (a plugin's entry point) and every one "
        "registered in this process, not only the repository's own; needs --root DIR "
        "(--svg: the same set)",
    )
    p.set_defaults(handler=_run, holds_secrets=SECRETS_NONE)
