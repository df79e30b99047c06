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

import os
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
    """The process said it stalls and its main thread sleeps in a pipe's write: state ``S``
    (``/proc/<pid>/stat``) and a ``wchan`` naming a pipe (``pipe_write``, ``anon_pipe_write``;
    before Linux 5.6 ``pipe_wait``) -- or ``0`` (a kernel that hides it), taken at its word only
    while the thread sleeps: ``0`` is also what a running or runnable thread shows.  Unreadable
    (gone, hidden): not seen blocked."""
    if STALLED not in log:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            state = f.read().rpartition(")")[2].split()[0]  # (the name may hold spaces, ")")
        with open(f"/proc/{pid}/wchan", encoding="ascii") as f:
            wchan = f.read()
    except (OSError, IndexError):
        return False
    return asleep_in_a_pipe(state, wchan)


def asleep_in_a_pipe(state: str, wchan: str) -> bool:
    """``blocked_writing``'s reading of the main thread's state and ``wchan``."""
    return state == "S" and ("pipe" in wchan or wchan == "0")


@pytest.mark.parametrize(
    ("state", "wchan", "asleep"),
    [
        ("S", "pipe_write", True),
        ("S", "anon_pipe_write", True),  # Linux 6.x
        ("S", "pipe_wait", True),  # before Linux 5.6
        ("S", "0", True),  # a kernel that hides it
        ("R", "0", False),  # running or runnable: 0 too
        ("R", "pipe_write", False),  # woken, not (yet) blocked again
        ("S", "hrtimer_nanosleep", False),
        ("D", "0", False),
    ],
)
def test_asleep_in_a_pipe_reads_the_state_and_wchan(state: str, wchan: str, asleep: bool) -> None:
    assert asleep_in_a_pipe(state, wchan) is asleep


async def test_blocked_writing_is_a_sleep_in_a_pipe_s_write_only(tmp_path: Path) -> None:
    """The wait's predicate: true for a process asleep writing a full pipe; false for one that
    runs (``wchan`` ``0``, state ``R``), one asleep elsewhere (``nanosleep``), one that has not
    said it stalls, one gone."""
    read, write = os.pipe()
    writing = subprocess.Popen(
        [PYTHON, "-c", "import os\nwhile True: os.write(1, b'x' * 65536)"], stdout=write
    )
    running = subprocess.Popen([PYTHON, "-c", "while True: pass"])
    sleeping = subprocess.Popen([PYTHON, "-c", "import time; time.sleep(60)"])
    gone = subprocess.Popen([PYTHON, "-c", "pass"])
    gone.wait(timeout=WAIT)
    try:
        os.close(write)
        await wait_until(lambda: blocked_writing(writing.pid, STALLED), "asleep in write(2)")
        assert not blocked_writing(writing.pid, "")
        await wait_until(lambda: _state(sleeping.pid) == "S", "asleep in nanosleep")
        assert not blocked_writing(sleeping.pid, STALLED)
        await wait_until(lambda: _state(running.pid) == "R", "running")
        assert not blocked_writing(running.pid, STALLED)
        assert not blocked_writing(gone.pid, STALLED)
    finally:
        for proc in (writing, running, sleeping):
            proc.kill()
            proc.wait(timeout=WAIT)
        os.close(read)


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        return f.read().rpartition(")")[2].split()[0]


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
