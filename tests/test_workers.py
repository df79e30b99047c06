"""The README's test command runs the test files in parallel (pyproject's addopts) with a
bounded number of workers: tests/conftest.py's ``pytest_xdist_auto_num_workers``."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import pytest

from tests.conftest import AUTO_ENV, pytest_xdist_auto_num_workers, usable_cpus, workers_for

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("cpus", "workers"), [(1, 0), (2, 2), (3, 3), (4, 4), (16, 4), (64, 4)])
def test_workers_follow_the_cpus_up_to_four(cpus: int, workers: int) -> None:
    assert workers_for(cpus) == workers


def test_xdists_own_variable_sets_the_number_as_it_says_past_the_cap(
    pytestconfig: pytest.Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(AUTO_ENV, "7")
    assert pytest_xdist_auto_num_workers(pytestconfig) == 7
    monkeypatch.setenv(AUTO_ENV, "0")
    assert pytest_xdist_auto_num_workers(pytestconfig) == 0


@pytest.mark.parametrize("value", ["", "many"])
def test_an_empty_or_unreadable_variable_leaves_the_cpus_to_decide(
    value: str, pytestconfig: pytest.Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(AUTO_ENV, value)
    with pytest.warns(UserWarning, match="not a number") if value else _no_warning():
        assert pytest_xdist_auto_num_workers(pytestconfig) == workers_for(usable_cpus())


def test_the_cpus_counted_are_those_this_process_may_run_on() -> None:
    """Narrowed to one CPU (as ``taskset`` or a cgroup cpuset would), a process counts one --
    and gets no workers -- whatever the machine has (``os.cpu_count()``)."""
    if not hasattr(os, "sched_setaffinity"):
        assert usable_cpus() == (os.cpu_count() or 1)
        return
    script = (
        "import os\n"
        "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
        "from tests.conftest import pytest_xdist_auto_num_workers, usable_cpus\n"
        "print(usable_cpus(), pytest_xdist_auto_num_workers(None), os.cpu_count())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != AUTO_ENV}
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=60, check=True,
    ).stdout.split()  # fmt: skip
    assert out[:2] == ["1", "0"], out


def _no_warning() -> contextlib.AbstractContextManager[object]:
    return warnings.catch_warnings(action="error")


def test_the_test_command_runs_files_in_parallel_each_file_on_one_worker() -> None:
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    addopts = options["ini_options"]["addopts"].split()
    assert addopts[addopts.index("-n") + 1] == "auto"
    assert addopts[addopts.index("--dist") + 1] == "loadfile"


def test_a_hung_test_fails_with_its_stacks_within_the_run() -> None:
    """pytest-timeout's bound is on (pyproject): a test hung in a shielded wait fails its
    worker with every thread's stack, not CI's whole run at CI's own limit."""
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    ini = options["ini_options"]
    assert 0 < ini["timeout"] <= 900 and ini["timeout_method"] == "thread"
    # ... and the run ends there: a restarted worker re-ran the dead one's file and hung xdist.
    assert "--max-worker-restart=0" in ini["addopts"].split()
