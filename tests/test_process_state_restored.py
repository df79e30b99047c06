"""``tests/conftest.py``'s ``process_state_restored``: an embedded ``affidavit mcp`` run in the
test process (as a test of a refusal would) tunes the garbage collector for the rest of the
process, sets the ``mcp`` logger's level and hangs its line-bounding filter on every root handler
-- pytest's capture handlers included -- before it reads its config; and the next test, in this
file the next one on the same worker, starts with the suite's collector and logging all the
same.  The two tests run in this order (pytest keeps a file's order; ``--dist loadfile`` keeps a
file on one worker)."""

from __future__ import annotations

import gc
import logging
from pathlib import Path

import pytest

from affidavit.cli import main
from affidavit.engine.collector import YOUNG_THRESHOLD
from tests.external import require_module

DEFAULT_YOUNG = 700
"""CPython's own young-generation threshold, what the suite runs with."""


def _filtered() -> list[logging.Handler]:
    return [h for h in logging.getLogger().handlers if h.filters]


def _suites_state() -> None:
    assert gc.get_threshold()[0] == DEFAULT_YOUNG and gc.get_freeze_count() == 0
    assert gc.isenabled()
    assert logging.getLogger("mcp").level == logging.NOTSET
    assert logging.getLogger().handlers and _filtered() == []


def test_an_embedded_mcp_run_here_changes_this_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    require_module("mcp", "dev")
    _suites_state()
    try:
        rc = main(["mcp", "--config", str(tmp_path / "missing.toml")])
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "CONFIG_NOT_FOUND" in err, err
    assert gc.get_threshold()[0] == YOUNG_THRESHOLD and gc.get_freeze_count() > 0
    assert logging.getLogger("mcp").level == logging.WARNING
    assert _filtered(), "the root's handlers (pytest's) carry the MCP line filter"


def test_the_next_test_starts_with_the_suites_collector_and_logging() -> None:
    _suites_state()
