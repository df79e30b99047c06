"""Once stopped -- the journal closed -- a broker process only ends, and a SIGTERM or SIGINT
then ends it at once, exit 0 (``affidavit.stopping.signals``, ``exit_after``): true at that
point, and the one way out of a write that blocks for ever.

After the stop the process still writes: "stopped", the interpreter's exit.  A stderr nobody
reads -- a pipe whose reader went away without closing it, a stopped journald -- blocks that
write in the kernel, with no watchdog left (the bound is disarmed once the journal is closed).
Before, the stop's signals were ignored from then on: three SIGTERMs did nothing, only SIGKILL
ended the process.  Here a real ``affidavit serve`` (a ``-c`` script around
``affidavit.cli.main``) gets a full pipe as its stderr just as it logs "stopped"; the second
signal must end it, exit 0, within ``WAIT``."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from .kit import PYTHON, WAIT, api_target, start_daemon, wait_until, write_daemon_config

STALLED = "test hook: stderr is a full pipe from here"

STALL = f'''
import logging, os, sys

def stall():
    """stderr from here on: a pipe nobody reads, full (its read end kept open, never read)."""
    print({STALLED!r}, file=sys.stderr, flush=True)
    global unread
    unread, full = os.pipe()
    os.set_blocking(full, False)
    try:
        while True:
            os.write(full, b"x" * 65536)
    except BlockingIOError:
        pass
    os.set_blocking(full, True)
    os.dup2(full, 2)
'''
"""A ``-c`` script's start: ``stall()`` makes stderr a full pipe nobody reads."""

SERVE = (
    STALL
    + """
class Stopped(logging.Filter):
    def filter(self, record):
        if record.getMessage() == "stopped":
            stall()  # its own line, next, blocks in write(2)
        return True

logging.getLogger("affidavit.daemon").addFilter(Stopped())
from affidavit.cli import main
sys.exit(main(["serve", "--config", sys.argv[1]]))
"""
)


def blocked_writing(pid: int, log: str) -> bool:
    """The process said it stalls and its main thread sleeps in a pipe's write (where the
    kernel shows it: ``wchan``; one that hides it, ``0``, is taken at its word)."""
    if STALLED not in log:
        return False
    try:
        with open(f"/proc/{pid}/wchan", encoding="ascii") as f:
            wchan = f.read()
    except OSError:
        return True
    return "pipe_write" in wchan or wchan == "0"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
async def test_a_stopped_serve_blocked_on_its_stderr_ends_at_a_signal(
    tmp_path: Path, token: str, signum: signal.Signals
) -> None:
    socket = tmp_path / "affidavit.sock"
    config = write_daemon_config(tmp_path, api_target("http://127.0.0.1:9"), socket=socket)
    log = tmp_path / "daemon.log"
    daemon = await start_daemon(config, socket, log, token, [PYTHON, "-c", SERVE, str(config)])
    try:
        daemon.signal(signal.SIGTERM)  # the stop: clean, the journal closed
        await wait_until(
            lambda: blocked_writing(daemon.proc.pid, daemon.log_text()), "stopped, blocked"
        )
        daemon.signal(signum)
        status = await daemon.wait(WAIT)
    finally:
        if daemon.proc.poll() is None:  # still blocked: the test fails, never hangs
            daemon.proc.kill()
            daemon.proc.wait(timeout=WAIT)
    text = daemon.log_text()
    assert status == 0, text
    assert "received SIGTERM" in text and "CRITICAL" not in text
    assert token not in text


AFTER = """
import os, signal, sys, time
from affidavit.stopping.signals import StopSignals

try:
    with StopSignals(lambda signum: None, exit_after=True):
        if sys.argv[1] == "failed":
            raise RuntimeError("the stop failed")
except RuntimeError:
    pass
os.kill(os.getpid(), signal.Signals[sys.argv[2]])
time.sleep(10)
sys.exit(3)  # the signal did nothing
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
@pytest.mark.parametrize(("ending", "status"), [("clean", 0), ("failed", None)])
def test_after_the_stop_a_signal_ends_the_process_0_only_if_it_was_clean(
    ending: str, status: int | None, signum: signal.Signals
) -> None:
    """``exit_after``: a block that ended clean (the journal closed) leaves a handler that
    exits 0 at once; one that raised leaves the signal's default action -- killed by it, no
    status claimed for a stop that failed (before, both were ignored: exit 3 here)."""
    done = subprocess.run(
        [PYTHON, "-c", AFTER, ending, signum.name], capture_output=True, timeout=WAIT, check=False
    )
    assert done.returncode == (-signum if status is None else status), done.stderr
