"""The import layout, read from pyproject.toml: which folder holds which import package.

``[tool.setuptools] package-dir`` maps ``affidavit.statemachine`` to ``statemachine/`` (and so on)
so that the layer folders keep their top-level place without symlinks.  Tools that do not read
that mapping (mypy's ``-p``, grimp/import-linter) cannot see those packages from a checkout, so
the type check (``.ci/typecheck.py``) and the import-layer test (``tests/test_layers.py``) take
the module list from here: one source for both.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool


def package_dirs(root: Path = ROOT) -> dict[str, Path]:
    """{import package: folder}, most specific first."""
    data = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    mapping = data["tool"]["setuptools"]["package-dir"]
    dirs = {pkg: (root / folder).resolve() for pkg, folder in mapping.items()}
    return dict(sorted(dirs.items(), key=lambda kv: -kv[0].count(".")))


def declared_packages(root: Path = ROOT) -> list[str]:
    data = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    return list(data["tool"]["setuptools"]["packages"])


def modules(root: Path = ROOT) -> list[Module]:
    """Every module of the distribution, named as it is imported."""
    dirs = package_dirs(root)
    mapped = set(dirs.values())
    out: list[Module] = []
    for pkg, folder in dirs.items():
        for path in sorted(folder.rglob("*.py")):
            # A file belongs to the most specific mapping only (affidavit/ does not own
            # statemachine/, which is its own root).
            if any(
                other != folder and other.is_relative_to(folder) and path.is_relative_to(other)
                for other in mapped
            ):
                continue
            parts = list(path.relative_to(folder).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            out.append(Module(".".join([pkg, *parts]), path, is_package))
    return out


def package_folders(root: Path = ROOT) -> dict[str, Path]:
    """{package name: folder} for every folder with an ``__init__.py``."""
    return {m.name: m.path.parent for m in modules(root) if m.is_package}
