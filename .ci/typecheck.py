#!/usr/bin/env python3
"""mypy (strict, per pyproject's [tool.mypy]) over every module of the distribution, each under
its import name and reported at its real path.

``mypy -p affidavit`` cannot be used from a checkout: setuptools' ``package-dir`` maps
``affidavit.statemachine`` onto ``statemachine/`` (no symlinks, one path per module) and mypy does
not read that mapping.  mypy's build API takes (path, module) pairs, so the mapping is applied
here, read from pyproject.toml by ``tests/layout.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mypy import build  # noqa: E402
from mypy.main import process_options  # noqa: E402
from mypy.modulefinder import BuildSource  # noqa: E402

from tests.layout import modules  # noqa: E402


def main() -> int:
    sources = [BuildSource(str(m.path.relative_to(ROOT)), m.name, None) for m in modules(ROOT)]
    _, options = process_options(["--config-file", str(ROOT / "pyproject.toml"), "-c", ""])
    try:
        result = build.build(sources, options)
        errors = result.errors
    except build.CompileError as exc:
        errors = exc.messages
    for line in errors:
        print(line)
    if errors:
        print(f"mypy: {sum(': error:' in e for e in errors)} errors in {len(sources)} modules")
        return 1
    print(f"mypy: no issues in {len(sources)} modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
