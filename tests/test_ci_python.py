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


def _venv_block() -> str:
    """.ci/run's lines that pick the interpreter: from the detection to the pip install."""
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    start = lines.index("if python3 .ci/externally_managed.py; then")
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("python3 -m pip"))
    return "\n".join(lines[start:end])


def test_on_a_managed_python_ci_makes_the_venv_and_puts_it_first(tmp_path: Path) -> None:
    """The block run for real in a throw-away checkout, with a ``python3`` first on PATH that
    says it is managed (the detection's own logic is tested above) and is otherwise this
    interpreter's base: the venv is made, and ``python3`` is then the venv's."""
    fake = tmp_path / "bin"
    fake.mkdir()
    base = getattr(sys, "_base_executable", sys.executable)
    (fake / "python3").write_text(
        f'#!/bin/sh\n[ "$1" = .ci/externally_managed.py ] && exit 0\nexec {base} "$@"\n'
    )
    (fake / "python3").chmod(0o755)
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    script = f"set -euo pipefail\n{_venv_block()}\ncommand -v python3\necho $VIRTUAL_ENV\n"
    env = {"PATH": f"{fake}:/usr/bin:/bin", "HOME": str(tmp_path)}
    for _ in range(2):  # made, then found and kept
        done = subprocess.run(
            ["bash", "-c", script],
            cwd=checkout,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == [f"{checkout}/.venv/bin/python3", f"{checkout}/.venv"]
