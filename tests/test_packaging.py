"""A wheel ships every protocol it names (audit 51f, item 2): ``[tool.setuptools] packages`` is
an explicit list (the layer folders' ``package-dir`` mapping), so a protocol package left off it
is missing from a built wheel while its entry point is still declared -- ``affidavit call``
then fails to load it on every installed machine, never in a checkout.  Checked here, loudly,
on the tree: every folder of Python under ``adapters/`` and ``affidavit/protocols/`` is a
listed package, and every ``affidavit.protocols`` entry point names a module of one."""

from __future__ import annotations

import tomllib
from pathlib import Path

from tests.layout import ROOT, declared_packages, package_dirs

PROTOCOL_ROOTS = ("affidavit.adapters", "affidavit.protocols")


def _folder(dirs: dict[str, Path], root: Path, dotted: str) -> Path:
    """Where ``dotted`` would be, by the most specific ``package-dir`` mapping."""
    for pkg, folder in dirs.items():  # (most specific first)
        if dotted == pkg or dotted.startswith(pkg + "."):
            return folder.joinpath(*dotted[len(pkg) :].split(".")[1:])
    return root.joinpath(*dotted.split("."))


def unshipped(root: Path = ROOT) -> list[str]:
    """What a wheel built from ``root`` would leave out, one line each (``[]``: nothing)."""
    listed = set(declared_packages(root))
    dirs = package_dirs(root)
    problems: list[str] = []
    for top in PROTOCOL_ROOTS:
        base = dirs.get(top, root / top.replace(".", "/"))
        for folder in sorted({p.parent for p in base.rglob("*.py")}):
            name = ".".join([top, *folder.relative_to(base).parts])
            if name not in listed:
                problems.append(f"{folder.relative_to(root)}/: {name} is not in packages")
            elif not (folder / "__init__.py").is_file():
                problems.append(f"{folder.relative_to(root)}/: no __init__.py")
    data = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    eps = data["project"].get("entry-points", {}).get("affidavit.protocols", {})
    for kind, value in sorted(eps.items()):
        module = value.partition(":")[0].strip()
        folder = _folder(dirs, root, module)
        # A package is shipped when listed; a plain module, when its package is.
        package = module if module in listed or folder.is_dir() else module.rpartition(".")[0]
        if package not in listed:
            problems.append(f"entry point {kind} = {value}: {package} is not in packages")
    return problems


def test_every_protocol_package_and_entry_point_is_shipped() -> None:
    assert unshipped() == [], "add them to [tool.setuptools] packages in pyproject.toml"


def test_a_protocol_left_off_the_packages_list_is_reported(tmp_path: Path) -> None:
    for folder in ("affidavit/protocols/http", "affidavit/protocols/db", "adapters/db"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "adapters" / "db" / "wire").mkdir()  # Python with no __init__.py
    (tmp_path / "adapters" / "db" / "wire" / "core.py").write_text("")
    (tmp_path / "affidavit" / "__init__.py").write_text("")
    (tmp_path / "pyproject.toml").write_text(
        "[project]\nname = 'x'\n"
        '[project.entry-points."affidavit.protocols"]\n'
        'http = "affidavit.protocols.http:PROTOCOL"\n'
        'db = "affidavit.protocols.db:PROTOCOL"\n'
        "[tool.setuptools]\n"
        'packages = ["affidavit", "affidavit.protocols", "affidavit.protocols.http", '
        '"affidavit.adapters", "affidavit.adapters.db", "affidavit.adapters.db.wire"]\n'
        'package-dir = { "affidavit" = "affidavit", "affidavit.adapters" = "adapters" }\n'
    )
    (tmp_path / "affidavit" / "protocols" / "__init__.py").write_text("")
    (tmp_path / "adapters" / "__init__.py").write_text("")
    assert unshipped(tmp_path) == [
        "adapters/db/wire/: no __init__.py",
        "affidavit/protocols/db/: affidavit.protocols.db is not in packages",
        "entry point db = affidavit.protocols.db:PROTOCOL: affidavit.protocols.db is not in "
        "packages",
    ]
