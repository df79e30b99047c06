"""``tests/conftest.py``'s ``umask_restored``: ``affidavit serve`` run in the test process (as
the tests of its refusals do) sets the process umask to 077, and the next test -- in this file,
the next one on the same worker -- starts at the suite's 022 all the same.  The two tests run in
this order (pytest keeps a file's order; ``--dist loadfile`` keeps a file on one worker)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from affidavit.cli import main
from tests.conftest import TEST_UMASK


def _umask() -> int:
    old = os.umask(0o077)
    os.umask(old)
    return old


def test_serve_run_in_this_process_leaves_it_umask_077(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _umask() == TEST_UMASK
    try:
        rc = main(["serve", "--config", str(tmp_path / "missing.toml")])
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("affidavit: CONFIG_NOT_FOUND: "), err
    assert _umask() == 0o077


def test_the_next_test_starts_at_the_suites_umask(tmp_path: Path) -> None:
    assert _umask() == TEST_UMASK
    made = tmp_path / "d"
    made.mkdir(mode=0o755)
    assert made.stat().st_mode & 0o777 == 0o755
