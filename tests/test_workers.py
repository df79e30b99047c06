"""The README's test command runs the test files in parallel (pyproject's addopts) with a
bounded number of workers: tests/conftest.py's ``pytest_xdist_auto_num_workers``."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from tests.conftest import workers_for

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("cpus", "workers"), [(1, 0), (2, 2), (3, 3), (4, 4), (16, 4), (64, 4)])
def test_workers_follow_the_cpus_up_to_four(cpus: int, workers: int) -> None:
    assert workers_for(cpus) == workers


def test_the_test_command_runs_files_in_parallel_each_file_on_one_worker() -> None:
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    addopts = options["ini_options"]["addopts"].split()
    assert addopts[addopts.index("-n") + 1] == "auto"
    assert addopts[addopts.index("--dist") + 1] == "loadfile"
