"""The import-layer contract (DESIGN, "Layers"), checked on every import statement in the tree.

    statemachine/   imports nothing of ours
    adapters/       statemachine only; a protocol's package never imports another protocol's
    journal/        statemachine, and the leaves strictjson, acl, privatefile and text; adapters and
                    journal never import each other
    affidavit/      the service: may import all three, and its own sub-packages only downwards

import-linter (grimp) would be the usual tool, but it only builds graphs of top-level packages
found on disk under their import names, and ``affidavit.statemachine`` lives in ``statemachine/``
(setuptools ``package-dir``).  So this test walks the same module list the type check uses
(``tests/layout.py``).  Imports inside functions and under ``TYPE_CHECKING`` count: a lazy import
is still a dependency.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

from tests.layout import ROOT, Module, modules

# Each group may import the groups listed for it (and itself).  A group is the import name up to
# the part that names a layer or a service sub-package; ``adapters.<proto>`` groups per protocol.
# A new sub-package must be given its place here: an unknown group fails the test.
SERVICE_BASE = {
    "affidavit.statemachine",
    "affidavit.journal",
    "affidavit.adapters",
    "affidavit.adapters.<proto>",
    "affidavit.text",
    "affidavit.strictjson",
    "affidavit.session",
    "affidavit.coredump",
    "affidavit.heap",
    "affidavit.acl",
    "affidavit.privatefile",
    "affidavit.spells",
    "affidavit.bounds",
}
ALLOWED: Mapping[str, frozenset[str]] = {
    "affidavit.statemachine": frozenset(),
    # How text a caller or a remote chose is shown (one rule for the CLI, console and views):
    # a leaf, importing nothing of ours, that every interface may use.
    "affidavit.text": frozenset(),
    # JSON read strictly (no field named twice, no NaN): a leaf the MCP proxy loads too.
    "affidavit.strictjson": frozenset(),
    # What a session name may be: one rule for the action parser and the MCP tools, a leaf
    # the MCP proxy loads too.
    "affidavit.session": frozenset(),
    # Core dumps off for the process that calls it (serve, mcp; an embedder's choice): a leaf
    # that the MCP proxy loads too, so not under ``affidavit.secrets``.
    "affidavit.coredump": frozenset(),
    # glibc's allocator thresholds for the process that calls it (serve, mcp run embedded): a
    # leaf, as ``coredump`` is.
    "affidavit.heap": frozenset(),
    # Runs of refusals logged as one line each (the daemon's admission, the console's): a leaf,
    # so the console needs nothing of the daemon that serves it.
    "affidavit.spells": frozenset(),
    # Who else a file's POSIX ACL lets in: a leaf the journal's exposure checks and the
    # secret-file reads (``affidavit.privatefile``) both judge by.
    "affidavit.acl": frozenset(),
    # The longest a call may take (a target's timeout, an approval's ttl): one number for the
    # schema that bounds it and the thin clients that wait for it -- a leaf.
    "affidavit.bounds": frozenset(),
    # A broker process's stop (signals off the loop, its bound): the daemon's and the embedded
    # MCP server's, neither importing the other.
    "affidavit.stopping": frozenset({"affidavit.text"}),
    # A small file read without blocking, bounded -- and, for a secret, only if no one else
    # can reach it: one rule for the credentials, the vault's unlock key and the journal's key
    # files, which the journal reads itself.
    "affidavit.privatefile": frozenset({"affidavit.acl"}),
    # (text: a PostgreSQL lock holder's role name, another role's choice, shown escaped.)
    "affidavit.journal": frozenset(
        {
            "affidavit.statemachine",
            "affidavit.strictjson",
            "affidavit.acl",
            "affidavit.privatefile",
            "affidavit.text",
        }
    ),
    "affidavit.adapters": frozenset({"affidavit.statemachine"}),  # adapters/__init__, base
    "affidavit.adapters.<proto>": frozenset({"affidavit.statemachine", "affidavit.adapters"}),
    # The service, bottom to top.
    # The lazy ``affidavit.Broker`` and ``affidavit.sdk`` (``import affidavit`` is enough).
    "affidavit": frozenset({"affidavit.api", "affidavit.sdk"}),
    "affidavit.__main__": frozenset({"affidavit.cli"}),
    "affidavit.secrets": frozenset(
        {"affidavit.statemachine", "affidavit.acl", "affidavit.privatefile"}
    ),
    "affidavit.views": frozenset({"affidavit.statemachine", "affidavit.journal", "affidavit.text"}),
    # The schema language knows no protocol; protocols declare their target schemas with it,
    # and config finds a target's protocol in the registry — so schema < protocols < config.
    # A file a target trusts is hashed for its account as the HTTP driver reads it
    # (``affidavit.adapters.filestat.read_regular``: bounded, never waiting on a FIFO).
    "affidavit.schema": frozenset(
        {"affidavit.secrets", "affidavit.strictjson", "affidavit.adapters", "affidavit.bounds"}
    ),
    # The registry and the common action parsing: they find protocols through entry points,
    # never by importing one (a protocol is added without editing them).
    "affidavit.protocols": frozenset(
        {
            "affidavit.schema",
            "affidavit.statemachine",
            "affidavit.adapters",
            "affidavit.strictjson",
            "affidavit.session",
        }
    ),
    "affidavit.protocols.<proto>": frozenset(
        {
            "affidavit",  # __version__ in the User-Agent
            "affidavit.schema",
            "affidavit.secrets",
            "affidavit.protocols",
            *SERVICE_BASE,
        }
    ),
    # The configuration file is read bounded, never waiting on a FIFO (``privatefile``'s
    # ``read_small_file``): the dispatch gate reads it again while the broker runs.
    "affidavit.config": frozenset(
        {
            "affidavit.schema",
            "affidavit.protocols",
            "affidavit.secrets",
            "affidavit.statemachine",
            "affidavit.privatefile",
            "affidavit.bounds",  # [journal] reconnect's maximum (MAX_RECONNECT)
        }
    ),
    "affidavit.engine": frozenset(
        {"affidavit.config", "affidavit.protocols", "affidavit.secrets", *SERVICE_BASE}
    ),
    # Operator actions: the rules every interface calls (CLI, daemon, Broker, console).  The
    # protocol registry (never a protocol) says where an action holds the contents an approval
    # shows (``operator_contents``), as it tells reconcile a target's query.
    "affidavit.approvals": frozenset({"affidavit.engine", "affidavit.protocols", *SERVICE_BASE}),
    "affidavit.reconcile": frozenset(
        {"affidavit.approvals", "affidavit.engine", "affidavit.protocols", *SERVICE_BASE}
    ),
    "affidavit.api": frozenset(
        {
            "affidavit.approvals",
            "affidavit.reconcile",
            "affidavit.engine",
            "affidavit.config",
            "affidavit.protocols",
            "affidavit.secrets",
            "affidavit.views",
            *SERVICE_BASE,
        }
    ),
    "affidavit.sdk": frozenset({"affidavit.api"}),
    # The operator console: pages over the journal's views, decisions through the Broker; the
    # engine and reconcile only for how a journal that could not answer is told (read_failure,
    # reconcile.service.failure), as every interface tells it; config (below the engine) only
    # for the one rule its address is judged by, as the config judged it (``is_loopback``).
    "affidavit.console": frozenset(
        {
            "affidavit",  # __version__ in the page footer
            "affidavit.api",
            "affidavit.approvals",
            "affidavit.config",
            "affidavit.engine",
            "affidavit.reconcile",
            "affidavit.views",
            *SERVICE_BASE,
        }
    ),
    # The daemon sits with the interfaces: the API (Broker) and views below it, never the CLI.
    "affidavit.daemon": frozenset(
        {
            "affidavit",  # __version__ in GET /v1/health
            "affidavit.api",
            "affidavit.approvals",
            "affidavit.reconcile",
            "affidavit.engine",
            "affidavit.config",
            "affidavit.console",
            "affidavit.views",
            "affidavit.stopping",
            *SERVICE_BASE,
        }
    ),
    # The MCP server is an interface beside the daemon: the API (Broker, or the daemon's Client)
    # and the views; the engine, journal, approvals and reconcile only for their stop handle and
    # error types (OperatorError from the reconcile query, and how a journal that could not
    # answer it is told), and the config (read first, for the stop's bound), only embedded (a
    # proxy to the daemon imports none of them: tests/mcp/test_modes.py).
    "affidavit.mcp": frozenset(
        {
            "affidavit",  # __version__ in the server's info
            "affidavit.api",
            "affidavit.approvals",
            "affidavit.engine",
            "affidavit.reconcile",
            "affidavit.views",
            "affidavit.journal",
            "affidavit.session",
            "affidavit.stopping",  # embedded: its signals and its stop's bound
            # embedded: the config read before the signals are taken, so that a stop during
            # the start-up's recovery is bounded by its terms (grace, a journal's reconnect)
            "affidavit.config",
            "affidavit.text",  # the one escaping rule for the text rendering's lines
        }
    ),
    "affidavit.docgen": frozenset({"affidavit.statemachine", "affidavit.adapters"}),
    "affidavit.cli": frozenset(
        {
            "affidavit",
            "affidavit.api",
            "affidavit.approvals",
            "affidavit.reconcile",
            "affidavit.engine",
            "affidavit.config",
            "affidavit.protocols",
            "affidavit.secrets",
            "affidavit.views",
            "affidavit.docgen",
            "affidavit.daemon",
            "affidavit.console",
            "affidavit.mcp",
            *SERVICE_BASE,
        }
    ),
}


# Per-protocol packages: every sub-package or module of these is one protocol's, except the
# shared modules listed (adapters' base, the stat rule for re-read files and the threads that
# stat and read them; the protocol registry, common action parsing, the reconcile tables'
# settle window).
PER_PROTOCOL = {
    "adapters": {"base", "filestat", "filethread"},
    "protocols": {"spec", "registry", "actions", "catalog", "placeholders", "settle"},
}


def group(name: str) -> str:
    parts = name.split(".")
    if parts[0] != "affidavit" or len(parts) == 1:
        return name
    shared = PER_PROTOCOL.get(parts[1])
    if shared is not None:
        if len(parts) == 2 or parts[2] in shared:
            return f"affidavit.{parts[1]}"
        return f"affidavit.{parts[1]}.<proto>"
    return ".".join(parts[:2])


def _same_protocol(a: str, b: str) -> bool:
    return a.split(".")[:3] == b.split(".")[:3]


def imported_names(module: Module) -> Iterable[tuple[int, str]]:
    tree = ast.parse(module.path.read_text(encoding="utf-8"), str(module.path))
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
                # ``from . import x`` may name a submodule: count it as one.
                for alias in node.names:
                    yield node.lineno, stem if node.module else f"{stem}.{alias.name}"
            elif node.module:
                yield node.lineno, node.module


def violations(mods: Iterable[Module]) -> list[str]:
    found = []
    for mod in mods:
        mine = group(mod.name)
        allowed = ALLOWED.get(mine)
        if allowed is None:
            found.append(f"{mod.path}: {mod.name} belongs to no declared layer ({mine})")
            continue
        for lineno, name in imported_names(mod):
            if name.split(".")[0] != "affidavit":
                continue
            theirs = group(name)
            if theirs == mine:
                if mine.endswith(".<proto>") and not _same_protocol(mod.name, name):
                    found.append(f"{mod.path}:{lineno}: {mod.name} imports another protocol {name}")
                continue
            if theirs not in allowed:
                found.append(f"{mod.path}:{lineno}: {mod.name} ({mine}) may not import {name}")
    return found


def test_the_tree_keeps_its_import_layers() -> None:
    assert violations(modules()) == []


def test_every_module_is_found_under_its_import_name() -> None:
    names = {m.name for m in modules()}
    assert {"affidavit.statemachine.lifecycle", "affidavit.journal", "affidavit.cli"} <= names
    assert not any(".statemachine." in n and not n.startswith("affidavit.") for n in names)


def _tree(tmp_path: Path, files: Mapping[str, str]) -> list[Module]:
    """A fake distribution: {import name: source}."""
    out = []
    for name, source in files.items():
        path = tmp_path / (name.replace(".", "/") + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source, encoding="utf-8")
        out.append(Module(name, path, is_package=False))
    return out


@pytest.mark.parametrize(
    ("importer", "source", "why"),
    [
        ("affidavit.statemachine.x", "from affidavit.journal import Journal\n", "may not import"),
        ("affidavit.journal.x", "import affidavit.adapters.http\n", "may not import"),
        ("affidavit.adapters.http.x", "from affidavit.journal import Journal\n", "may not"),
        ("affidavit.adapters.http.x", "from affidavit.adapters.ssh import k\n", "another protocol"),
        ("affidavit.statemachine.x", "def f():\n    from affidavit.engine import E\n", "may not"),
        (
            "affidavit.statemachine.x",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import affidavit.config\n",
            "may not import",
        ),
        ("affidavit.engine.x", "from affidavit.cli import main\n", "may not import"),
        ("affidavit.protocols.http.x", "from affidavit.protocols.ssh import S\n", "another"),
        ("affidavit.protocols.registry", "import affidavit.protocols.http\n", "may not import"),
        ("affidavit.schema.x", "from affidavit.protocols import get\n", "may not import"),
        ("affidavit.schema.x", "from affidavit.config import Config\n", "may not import"),
        ("affidavit.newpart.x", "import os\n", "no declared layer"),
    ],
)
def test_a_wrong_import_is_reported(tmp_path: Path, importer: str, source: str, why: str) -> None:
    found = violations(_tree(tmp_path, {importer: source}))
    assert len(found) == 1 and why in found[0], found


def test_relative_imports_resolve_to_their_layer(tmp_path: Path) -> None:
    mods = _tree(tmp_path, {"affidavit.journal.x": "from ..engine import core\n"})
    assert violations(mods) == [
        f"{mods[0].path}:1: affidavit.journal.x (affidavit.journal) may not import affidavit.engine"
    ]
    ok = _tree(tmp_path, {"affidavit.journal.y": "from .chain import row_hash\n"})
    assert violations(ok) == []


def test_pyproject_lists_every_package_and_no_symlinks_are_tracked() -> None:
    from tests.layout import declared_packages, package_folders

    assert sorted(declared_packages()) == sorted(package_folders())
    links = [p for p in ROOT.rglob("*") if p.is_symlink() and ".git" not in p.parts]
    assert [p for p in links if ".venv" not in p.parts] == []
