"""No test PostgreSQL server (``tests/postgres.py``) outlives the process that started it.

``pg_ctl start`` detaches the server: a test session killed by SIGKILL or a timeout never runs
its fixtures' teardown, and its server would run on, its data in ``/dev/shm``, while every later
session started one more.  Two guards, both keyed to the cluster's directory
(``affidavit-pg-*``):

* ``claim(root)`` records the owner -- this process's pid and its start time, so that a reused
  pid is not taken for it -- in ``root/owner``, and starts a watchdog: this file run as a script
  in its own session (no signal to the test's process group reaches it), reading a pipe the
  owner holds.  The owner's ``release`` writes a byte (its teardown stopped the server); an end
  of file means the owner went without one, however it went: the watchdog stops the server and
  removes ``root``.
* ``reap_stale(parent)``, at each cluster's start: a directory whose recorded owner is gone (its
  watchdog killed too) has its server stopped and is removed.

A directory without an owner record (another checkout's, a session starting right now) or whose
owner lives is left alone; a process is signalled only when it is the postgres serving that very
directory (``postgres -D <root>/data``), never on the pid file's word alone.

Standard library only: the watchdog runs it as a script (``python -I``), importing nothing else.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["PREFIX", "claim", "owner_alive", "postmaster", "reap", "reap_stale", "release"]

PREFIX = "affidavit-pg-"
"""The cluster directories' name prefix (``tempfile.mkdtemp(prefix=PREFIX)``)."""
OWNER = "owner"
STOP_WAIT = 30.0
"""A ceiling on a stale server's exit after SIGQUIT (then SIGKILL), never a timing."""


def _start_time(pid: int) -> int | None:
    """The process's start time (clock ticks after boot, ``/proc/<pid>/stat`` field 22), or
    None when there is no such process or only its zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state is field 3
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _here() -> str | None:
    """This process's pid namespace and boot: where a recorded pid names the same process
    (another container sharing ``/dev/shm``, a reboot: the pid means nothing), or None."""
    try:
        ns = os.stat("/proc/self/ns/pid").st_ino
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    return f"{ns}:{boot}"


def owner_alive(root: Path) -> bool | None:
    """Whether the process ``root/owner`` records still runs; None without a readable record,
    or one made in another pid namespace or boot (its pid cannot be looked up from here)."""
    try:
        pid_s, started_s, where = (root / OWNER).read_text().split()
        pid, started = int(pid_s), int(started_s)
    except (OSError, ValueError):
        return None
    here = _here()
    if here is None or where != here:
        return None
    return _start_time(pid) == started


def postmaster(data: Path) -> int | None:
    """The pid of the postgres serving ``data``: the pid file's, when that process's command
    line is ``postgres ... -D <data>`` (any other process by that pid is not ours)."""
    try:
        pid = int((data / "postmaster.pid").read_text().split("\n", 1)[0])
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    serves = any(a == b"-D" and b == os.fsencode(data) for a, b in itertools.pairwise(argv))
    if not serves or not os.fsdecode(argv[0]).endswith("postgres"):
        return None
    return pid if _start_time(pid) is not None else None


def reap(root: Path) -> None:
    """Stop the server of ``root`` (immediate shutdown: SIGQUIT, SIGKILL past ``STOP_WAIT``) and
    remove the directory.  The process is held by a pidfd from before its command line is
    checked, so a pid reused in between is never signalled; a server that outlives SIGKILL
    keeps its files.  (Only a directory whose owner record was made in this pid namespace and
    boot is reaped by another process: ``owner_alive``.)"""
    data = root / "data"
    try:
        pid = int((data / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        shutil.rmtree(root, ignore_errors=True)  # no pid file: no server
        return
    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        shutil.rmtree(root, ignore_errors=True)  # its server is gone
        return
    except (OSError, AttributeError):
        return  # no pidfd here (an old kernel, a seccomp profile): its files stay
    try:
        if postmaster(data) != pid:
            shutil.rmtree(root, ignore_errors=True)  # that pid is some other process now
            return
        started = _start_time(pid)
        for signum in (signal.SIGQUIT, signal.SIGKILL):
            try:
                signal.pidfd_send_signal(handle, signum)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + STOP_WAIT
            while _start_time(pid) == started and time.monotonic() < deadline:
                time.sleep(0.05)
            if _start_time(pid) != started:
                break
        else:
            return  # it outlived SIGKILL: its files stay with it
    finally:
        os.close(handle)
    shutil.rmtree(root, ignore_errors=True)


def reap_stale(parent: Path) -> list[Path]:
    """Reap every cluster directory in ``parent`` whose recorded owner is gone; those reaped."""
    try:
        found = sorted(parent.glob(PREFIX + "*"))
    except OSError:
        return []
    stale = [root for root in found if owner_alive(root) is False]
    for root in stale:
        reap(root)
    return stale


def claim(root: Path) -> subprocess.Popen[bytes]:
    """Record this process as ``root``'s owner and start its watchdog (``release`` it)."""
    started, here = _start_time(os.getpid()), _here()
    if started is not None and here is not None:  # (no /proc: no record, never swept)
        record = root / f"{OWNER}.new"
        record.write_text(f"{os.getpid()} {started} {here}\n")
        record.rename(root / OWNER)
    return subprocess.Popen(
        [sys.executable, "-I", __file__, str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def release(watchdog: subprocess.Popen[bytes]) -> None:
    """The owner's teardown is done: its watchdog ends without touching anything."""
    assert watchdog.stdin is not None
    try:
        watchdog.stdin.write(b"x")
        watchdog.stdin.close()
        watchdog.wait(timeout=STOP_WAIT)
    except (OSError, subprocess.TimeoutExpired):
        watchdog.kill()
        watchdog.wait()


def _watch(root: Path) -> None:
    if not sys.stdin.buffer.read(1):  # end of file, no word: the owner is gone
        reap(root)


if __name__ == "__main__":
    _watch(Path(sys.argv[1]))
