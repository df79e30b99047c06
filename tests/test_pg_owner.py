"""A test PostgreSQL server dies with the process that started it (``tests/pgowner.py``).

``pg_ctl start`` detaches the server: a session killed by SIGKILL (a CI timeout) never runs its
teardown.  Its watchdog then stops the server and removes its directory; with the watchdog
killed too, the next cluster's start does.  A live owner's server, a directory without an owner
record (another checkout's code) and a process that is not the directory's postgres are left
alone.  The owners here are child processes running ``Cluster.create``, killed as a test run
would be.  Their clusters live in a directory of the test's own (``parent``): another session's
start -- another xdist worker's -- sweeps only its own parent, so it never reaps the orphan a
test planted before the test's own next start does.  Every wait has a ceiling (``GONE``), never
a timing."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import pgowner
from tests.external import POSTGRES
from tests.postgres import running_cluster

CHECKOUT = Path(__file__).resolve().parent.parent
GONE = 60.0
"""The ceiling on a server's end once its owner is gone."""

HERE = pgowner._here() or ""
"""This process's pid namespace and boot, as an owner record names them."""

OWNER = """
import sys
from pathlib import Path
from tests.postgres import Cluster
cluster = Cluster.create(where=Path(sys.argv[1]))
print(cluster.root, cluster.watchdog.pid, cluster.postmaster(), flush=True)
sys.stdin.buffer.read()  # until the test closes it -- or kills this process
cluster.destroy()
"""


@dataclass
class Owner:
    proc: subprocess.Popen[bytes]
    root: Path
    watchdog: int
    postmaster: int


@pytest.fixture
def postgres() -> str:
    """Skipped with ``postgresql not installed`` without the server (tests/external.py)."""
    return POSTGRES.require()


PARENT = "affidavit-test-pgowner-"
"""The name prefix of the parent directory of this file's clusters."""


@pytest.fixture
def parent() -> Iterator[Path]:
    """Where this test's clusters live: in /dev/shm as every test cluster (tests/postgres.py),
    but a directory no other start sweeps -- nor looks into: its name is not a cluster's
    (``pgowner.PREFIX``), which every other session's start, another xdist worker's included,
    reaps in /dev/shm when its owner is gone.  ``0711``: a server run as another user (as root,
    tests/postgres.py demotes it) reaches its own directory in it."""
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
    assert not PARENT.startswith(pgowner.PREFIX), "other starts would look into it"
    where = Path(tempfile.mkdtemp(prefix=PARENT, dir=base))
    where.chmod(0o711)
    yield where
    for left in where.glob(pgowner.PREFIX + "*"):
        pgowner.reap(left)
    where.rmdir()


@pytest.fixture
def owners(parent: Path) -> Iterator[Callable[[], Owner]]:
    """Start owners (child processes holding a cluster in ``parent``); whatever is left is ended
    after."""
    started: list[Owner] = []

    def start() -> Owner:
        proc = subprocess.Popen(
            [sys.executable, "-c", OWNER, str(parent)],
            cwd=CHECKOUT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()  # its line, or the end of its output
        root, watchdog, postmaster = line.split() if line else ("", "0", "0")
        owner = Owner(proc, Path(root), int(watchdog), int(postmaster))
        started.append(owner)
        assert line, f"the owner exited {proc.wait()} before its cluster ran"
        return owner

    yield start
    for owner in started:
        with contextlib.suppress(OSError):
            owner.proc.communicate(timeout=GONE)  # closes its stdin: it destroys its cluster
        if owner.proc.poll() is None:
            owner.proc.kill()
            owner.proc.wait()
        if owner.root.name.startswith(pgowner.PREFIX) and owner.root.exists():
            pgowner.reap(owner.root)


def running(pid: int) -> bool:
    return pgowner._start_time(pid) is not None


def kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def wait_for(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + GONE
    while not done():
        assert time.monotonic() < deadline, f"not within {GONE} s: {what}"
        time.sleep(0.05)


def test_an_owner_killed_has_its_server_stopped_and_removed_by_its_watchdog(
    postgres: str, owners: Callable[[], Owner]
) -> None:
    owner = owners()
    assert running(owner.postmaster) and running(owner.watchdog)
    assert pgowner.owner_alive(owner.root) is True
    owner.proc.kill()  # SIGKILL: no teardown runs
    owner.proc.wait()
    wait_for(lambda: not owner.root.exists(), "the watchdog removes the cluster")
    wait_for(lambda: not running(owner.postmaster), "the server is gone")
    wait_for(lambda: not running(owner.watchdog), "the watchdog is gone")


def test_the_next_start_stops_a_dead_owners_server_and_leaves_a_live_owners_alone(
    postgres: str, owners: Callable[[], Owner], parent: Path
) -> None:
    stale, live = owners(), owners()
    kill(stale.watchdog)  # the whole run killed, its watchdog with it
    wait_for(lambda: not running(stale.watchdog), "the watchdog is killed")
    stale.proc.kill()
    stale.proc.wait()
    assert pgowner.owner_alive(stale.root) is False
    assert running(stale.postmaster) and stale.root.exists()  # the orphan the next start finds
    unclaimed = Path(tempfile.mkdtemp(prefix=pgowner.PREFIX, dir=stale.root.parent))
    try:
        with running_cluster(where=parent) as cluster:  # the next session's start
            assert cluster.root != stale.root and cluster.root.parent == stale.root.parent
            assert not stale.root.exists()
            assert not running(stale.postmaster)
            # A live owner's server runs on, untouched; a directory nobody claimed stays.
            assert live.root.exists() and pgowner.owner_alive(live.root) is True
            assert running(live.postmaster) and running(live.watchdog)
            assert pgowner.postmaster(live.root / "data") == live.postmaster
            assert unclaimed.is_dir()
    finally:
        unclaimed.rmdir()


def test_a_process_the_pid_file_names_that_is_not_the_directorys_postgres_is_left_alone(
    tmp_path: Path,
) -> None:
    """No PostgreSQL needed: a stale directory (its owner exited) whose pid file names a process
    that is not its postgres -- the pid reused -- is removed, and that process lives on."""
    bystander = subprocess.Popen(["sleep", str(GONE)])
    gone = subprocess.Popen(["sleep", str(GONE)])
    try:
        root = tmp_path / f"{pgowner.PREFIX}stale"
        (root / "data").mkdir(parents=True)
        (root / "data" / "postmaster.pid").write_text(f"{bystander.pid}\n{root / 'data'}\n")
        (root / "owner").write_text(f"{gone.pid} {pgowner._start_time(gone.pid)} {HERE}\n")
        assert pgowner.owner_alive(root) is True
        gone.kill()
        gone.wait()
        assert pgowner.owner_alive(root) is False
        assert pgowner.postmaster(root / "data") is None
        assert pgowner.reap_stale(tmp_path) == [root]
        assert not root.exists()
        assert bystander.poll() is None
    finally:
        for proc in (bystander, gone):
            proc.kill()
            proc.wait()


def test_an_owner_record_names_this_process_by_pid_start_time_namespace_and_boot(
    tmp_path: Path,
) -> None:
    root = tmp_path / f"{pgowner.PREFIX}mine"
    root.mkdir()
    assert pgowner.owner_alive(root) is None  # no record: not ours to judge
    started = pgowner._start_time(os.getpid())
    (root / "owner").write_text(f"{os.getpid()} {started} {HERE}\n")
    assert pgowner.owner_alive(root) is True
    (root / "owner").write_text(f"{os.getpid()} 1 {HERE}\n")  # this pid, another process's start
    assert pgowner.owner_alive(root) is False
    # Made in another pid namespace (a container sharing /dev/shm) or before a reboot: its pid
    # names nothing here, so its owner is not judged gone -- a live session's cluster stays.
    ns, boot = HERE.split(":", 1)
    for where in (f"{int(ns) + 1}:{boot}", f"{ns}:another-boot"):
        (root / "owner").write_text(f"{os.getpid() + 10**6} {started} {where}\n")
        assert pgowner.owner_alive(root) is None
    (root / "owner").write_text(f"{os.getpid()} {started}\n")  # the record of an older kit
    assert pgowner.owner_alive(root) is None
    (root / "owner").write_text("garbage\n")
    assert pgowner.owner_alive(root) is None
    assert pgowner.reap_stale(tmp_path) == [] and root.exists()


def test_without_a_pidfd_a_live_pid_files_directory_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An old kernel or a seccomp profile without ``pidfd_open``: the server the pid file names
    cannot be held, so neither it nor its files are touched (only a pid that is gone frees the
    directory)."""
    live = subprocess.Popen(["sleep", str(GONE)])
    try:
        root = tmp_path / f"{pgowner.PREFIX}nopidfd"
        (root / "data").mkdir(parents=True)
        (root / "data" / "postmaster.pid").write_text(f"{live.pid}\n{root / 'data'}\n")

        def no_pidfd(pid: int) -> int:
            raise OSError(errno.ENOSYS, "pidfd_open")

        monkeypatch.setattr(os, "pidfd_open", no_pidfd)
        pgowner.reap(root)
        assert root.exists() and live.poll() is None
        monkeypatch.undo()
        live.kill()
        live.wait()
        pgowner.reap(root)
        assert not root.exists()
    finally:
        live.kill()
        live.wait()
