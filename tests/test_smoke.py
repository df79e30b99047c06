import subprocess
import sys
from pathlib import Path

import trio

from affidavit.statemachine import Outcome, Phase, Retry

ROOT = Path(__file__).resolve().parents[1]


def test_contract_sizes() -> None:
    assert (len(Phase), len(Outcome), len(Retry)) == (5, 4, 6)


async def test_trio_mode_runs() -> None:
    await trio.sleep(0)


def test_cli_runs_diagrams_check_like_ci() -> None:
    # CI runs `affidavit diagrams --check` from the checkout root; this is the same entry point.
    proc = subprocess.run(
        [sys.executable, "-m", "affidavit", "diagrams", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "generated files are current" in proc.stdout
