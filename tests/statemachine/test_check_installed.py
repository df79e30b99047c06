"""``affidavit.statemachine.check`` is the model check a plugin's own tests run (audit 51f,
item 5): shipped in the package, importable with no ``tests/`` tree and no test framework, and
it fails a broken table."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from affidavit.statemachine import ProtocolMachine, check
from affidavit.statemachine.check import ModelCheckError, check_table

from .example_protocol import EXAMPLE

ROOT = Path(__file__).resolve().parents[2]


def test_a_plugins_test_runs_it_from_outside_the_checkout(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from affidavit.statemachine.check import check_table\n"
        "from affidavit.protocols import get\n"
        "check_table(get('http').table)\n"
        "loaded = sorted(m for m in ('tests', 'pytest', 'hypothesis') if m in sys.modules)\n"
        "print('checked', loaded)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH") or str(ROOT)}
    p = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,  # (no tests/ here: only what the package installs)
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "checked []"


class _Lenient(ProtocolMachine):
    """A machine that ignores an event its table does not declare instead of refusing it."""

    def fire(self, event: str) -> Any:
        if event not in self.table.transitions.get(self.state, {}):
            return None
        return super().fire(event)


def test_it_passes_a_sound_table_and_fails_a_machine_that_takes_an_undeclared_pair(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    check_table(EXAMPLE)
    monkeypatch.setattr(check, "ProtocolMachine", _Lenient)
    with pytest.raises(ModelCheckError, match=r"^example: \(.*\) is not declared but was taken$"):
        check_table(EXAMPLE)


def test_the_toy_table_passes_the_model_check() -> None:
    # As a plugin's own test calls it (docs/adding-a-protocol.md, section 8).
    from tests.toy_protocol import PROTOCOL

    check_table(PROTOCOL.table)
