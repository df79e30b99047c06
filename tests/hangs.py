"""Where a hung test's thread stacks go under pytest-xdist.

pytest-timeout (pyproject: ``timeout``, the "thread" method) dumps every thread's stack and
ends the process when a test runs too long.  In an xdist worker its stdout and stderr are
``/dev/null``: the controller says only "worker crashed while running ...", and the one clue
to a hang is gone.  So, in a worker, each test also arms ``faulthandler`` to write every
thread's stack -- a little before pytest-timeout ends the worker -- into a file of that
worker's in a directory the controller made, and the controller prints the files that hold a
dump at the end of the run.  With ``-n 0`` pytest-timeout's own dump reaches the terminal and
nothing here runs."""

from __future__ import annotations

import faulthandler
import shutil
import tempfile
from pathlib import Path
from typing import Any, TextIO

import pytest

DUMP_AHEAD = 5.0
"""Seconds before pytest-timeout's own end of the worker that the stacks are written."""
MARK = "Timeout ("
"""How ``faulthandler``'s later dump begins."""

_dump: dict[str, TextIO] = {}


def configure(config: pytest.Config) -> None:
    """The controller (or ``-n 0``) makes the directory; a worker opens its own file in it."""
    given = getattr(config, "workerinput", None)
    if given is None:
        config.stash[_DIR] = Path(tempfile.mkdtemp(prefix="affidavit-hangs-"))
    elif "hang_dir" in given:
        path = Path(given["hang_dir"]) / f"{given['workerid']}.txt"
        _dump["file"] = path.open("w", encoding="utf-8")


_DIR = pytest.StashKey[Path]()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist, in the controller: tell each worker where its file goes."""
    node.workerinput["hang_dir"] = str(node.config.stash[_DIR])


@pytest.hookimpl(optionalhook=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> None:
    out = _dump.get("file")
    if out is None or not settings.timeout or settings.timeout <= DUMP_AHEAD:
        return
    out.seek(0)
    out.truncate()
    out.write(f"{item.nodeid}\n")
    out.flush()
    faulthandler.dump_traceback_later(settings.timeout - DUMP_AHEAD, exit=False, file=out)


@pytest.hookimpl(optionalhook=True)
def pytest_timeout_cancel_timer(item: pytest.Item) -> None:
    if "file" in _dump:
        faulthandler.cancel_dump_traceback_later()


def dumps(where: Path) -> list[tuple[str, str]]:
    """(worker, text) of each file in ``where`` that holds a dump."""
    found = []
    for path in sorted(where.glob("*.txt")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if MARK in text:
            found.append((path.stem, text))
    return found


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    where = config.stash.get(_DIR, None)
    if where is None:
        return
    for worker, text in dumps(where):
        terminalreporter.section(f"stacks of the test hung on {worker}", sep="+")
        terminalreporter.write(text)
    shutil.rmtree(where, ignore_errors=True)
