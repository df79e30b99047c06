"""A hung test under pytest-xdist leaves its threads' stacks in the run's output
(tests/hangs.py): a pytest run of its own, one worker, a test that waits past its timeout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HUNG = """
import threading

def test_waits_for_nothing():
    threading.Event().wait(60)

def test_quick():
    pass
"""

CONFTEST = """
from tests.hangs import (  # noqa: F401
    configure,
    pytest_configure_node,
    pytest_terminal_summary,
    pytest_timeout_cancel_timer,
    pytest_timeout_set_timer,
)

def pytest_configure(config):
    configure(config)
"""

_ROOT = Path(__file__).resolve().parent.parent


def test_a_hung_tests_stacks_reach_the_output_from_an_xdist_worker(tmp_path: Path) -> None:
    (tmp_path / "test_hung.py").write_text(HUNG)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "pytest.ini").write_text("[pytest]\ntimeout = 7\ntimeout_method = thread\n")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(_ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "1", "--max-worker-restart=0", "-p",
         "no:cacheprovider", "-q", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    out = run.stdout + run.stderr
    assert run.returncode != 0, out
    assert "stacks of the test hung on gw0" in out, out
    assert "test_hung.py::test_waits_for_nothing" in out  # which test
    assert "in test_waits_for_nothing" in out  # where it waited: its own frame
    assert "Thread 0x" in out or "Current thread 0x" in out  # every thread's, faulthandler's


def test_no_hang_prints_no_stacks(tmp_path: Path) -> None:
    (tmp_path / "test_fine.py").write_text("def test_quick():\n    pass\n")
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "pytest.ini").write_text("[pytest]\ntimeout = 7\ntimeout_method = thread\n")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(_ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "1", "-p", "no:cacheprovider", "-q", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "stacks of the test hung" not in run.stdout
