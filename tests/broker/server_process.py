"""A scripted HTTP server in a process of its own, for tests whose own process must stay free of
threads and event loops (it forks, or runs ``affidavit.cli.main`` in-process).

``script`` is Python source run from the repository root: it prints the server's URL on its first
line, serves until its stdin closes, and may print more after that (what it saw).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

__all__ = ["server_process", "stop_and_read"]

REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def server_process(script: str, *args: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """(URL, process).  ``stop_and_read`` the process for what it printed after serving."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=REPO,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        yield url, proc
    finally:
        if not proc.stdin.closed:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        proc.stdout.close()


def stop_and_read(proc: subprocess.Popen[str]) -> str:
    """Close the server's stdin (it stops serving) and return what it printed then."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.close()
    return proc.stdout.read()
