"""``.ci/run`` on a Python that refuses ``pip install`` (PEP 668: Debian's and Ubuntu's system
Python) installs into a virtual environment under the checkout instead; on CI's pyenv Python
(not managed) it installs as before."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "externally_managed.py"


def _detector() -> ModuleType:
    spec = importlib.util.spec_from_file_location("externally_managed", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_marker_binds_outside_a_virtual_environment_only(tmp_path: Path) -> None:
    managed = _detector().externally_managed
    assert not managed("/usr", "/usr", tmp_path)  # no marker: pip installs
    (tmp_path / "EXTERNALLY-MANAGED").write_text("[externally-managed]\n")
    assert managed("/usr", "/usr", tmp_path)  # Debian's python3 itself
    assert not managed("/work/.venv", "/usr", tmp_path)  # a venv made from it


def test_the_python_running_the_tests_is_not_managed() -> None:
    """The script run for real: a virtual environment (or CI's pyenv Python) answers 1."""
    done = subprocess.run([sys.executable, str(SCRIPT)], timeout=30, check=False)
    assert done.returncode == 1


def test_ci_enters_the_venv_before_it_installs_anything() -> None:
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    first_pip = next(
        i for i, ln in enumerate(lines) if "pip install" in ln and not ln.lstrip().startswith("#")
    )
    detect = lines.index("if python3 .ci/externally_managed.py; then")
    enter = next(i for i, ln in enumerate(lines) if 'PATH="$PWD/.venv/bin:$PATH"' in ln)
    assert detect < enter < first_pip
    assert lines[first_pip].lstrip().startswith("python3 -m pip install")  # python3 from PATH
