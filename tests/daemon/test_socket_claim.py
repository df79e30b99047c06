"""Who may take the socket path: one daemon at a time, in a directory nobody else can write.

* Two daemons starting on one path (each with its own journal, so the journal's writer lock
  does not order them): the first holds ``<socket>.lock`` before it touches the path, so the
  second is refused -- even while the first has bound its socket and not yet listened, when a
  probe connect is refused exactly as on a stale socket and the second used to remove the
  first's live socket, bind its own and serve, both believing they served.
  Started at the very same time, exactly one serves and the other exits 2 saying why.
* A socket directory writable by others (sticky or not), or owned by another user, is refused
  with a message saying why (whoever can write it could remove the socket and bind their own
  in its place; in a sticky one, take its name or its lock before the daemon starts).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import trio

from affidavit.api.client import Client
from affidavit.daemon import socketfile
from affidavit.daemon.server import ANSWER_WAIT, DaemonError
from affidavit.stopping.bound import stop_bound
from tests.external import require_root
from tests.http.hostile import HostileServer, Peer, Reply, scripts

from .kit import (
    HUNG,
    NOBODY,
    PYTHON,
    WAIT,
    DaemonProc,
    _answers,
    action,
    api_target,
    as_user,
    daemon_env,
    launch,
    run,
    start_daemon,
    stop,
    wait_until,
    write_daemon_config,
)

GRACE = HUNG
"""The draining daemon's ``shutdown_grace``: a ceiling; its call in flight ends on the test's cue
(a new daemon refused), never by the grace running out."""

HELD_LISTEN = """
import socket, sys, time
from pathlib import Path
marker, release, bound = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
real = socket.socket.listen
def listen(self, *args):
    if self.family == socket.AF_UNIX:
        marker.write_text("bound")  # the socket file exists; nobody listens on it yet
        deadline = time.monotonic() + bound
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # until the test lets it listen (a ceiling for a test that hung)
    return real(self, *args)
socket.socket.listen = listen
from affidavit.cli import main
sys.exit(main(sys.argv[4:]))
"""


def daemon_config(tmp: Path, name: str, url: str, sock: Path) -> Path:
    home = tmp / name
    home.mkdir()
    return write_daemon_config(home, api_target(url), socket=sock)


async def test_a_daemon_starting_while_another_is_between_bind_and_listen_is_refused(
    tmp_path: Path, token: str
) -> None:
    sock = tmp_path / "affidavit.sock"
    marker, release = tmp_path / "bound", tmp_path / "listen"
    async with HostileServer.running(scripts.serve(Reply(200))) as srv:
        first_cfg = daemon_config(tmp_path, "a", srv.url, sock)
        second_cfg = daemon_config(tmp_path, "b", srv.url, sock)
        held = [PYTHON, "-c", HELD_LISTEN, str(marker), str(release), str(2 * HUNG)]
        first = launch(
            first_cfg, sock, tmp_path / "a.log", token, [*held, "serve", "--config", str(first_cfg)]
        )
        proc = first.proc
        try:
            await wait_until(
                marker.exists, "the first daemon has bound its socket", HUNG, watch=[first]
            )
            inode = os.lstat(sock).st_ino

            def settled() -> bool:
                """The second gave up, or took the path: its socket is not the first's."""
                if second.poll() is not None:
                    return True
                try:
                    return os.lstat(sock).st_ino != inode
                except FileNotFoundError:
                    return True

            second = subprocess.Popen(
                [PYTHON, "-m", "affidavit", "serve", "--config", str(second_cfg)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=daemon_env(token),
            )
            # The first stays between bind and listen until the second is done: no race on time.
            await wait_until(
                settled, "the second daemon gives up or takes the path", HUNG, watch=[first]
            )
            if second.poll() is None:
                second.kill()
                _, err = second.communicate()
                raise AssertionError(f"the second daemon took the path:\n{err.decode()}")
            _, err = second.communicate()
            assert second.returncode == 2, err
            # Told the truth: the first holds the lock and has not yet listened.
            assert b"is starting on" in err and b"is locked" in err, err
            assert b"Traceback" not in err

            # The first daemon's socket is still the one at the path, and it answers there.
            assert os.lstat(sock).st_ino == inode
            release.write_text("listen")
            await wait_until(
                lambda: _answers(first), "the first daemon answers", HUNG, watch=[first]
            )
            assert os.lstat(sock).st_ino == inode
            proc.send_signal(signal.SIGTERM)
            assert await first.wait() == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=HUNG)
    assert not sock.exists()  # removed by its daemon, before its lock went


async def test_two_daemons_started_at_once_on_one_path_one_serves_the_other_is_refused(
    tmp_path: Path, token: str
) -> None:
    sock = tmp_path / "affidavit.sock"
    async with HostileServer.running(scripts.serve(Reply(200))) as srv:
        procs: list[DaemonProc] = []
        for name in ("a", "b"):
            cfg = daemon_config(tmp_path, name, srv.url, sock)
            procs.append(launch(cfg, sock, tmp_path / f"{name}.log", token))
        try:
            await wait_until(
                lambda: any(d.proc.poll() is not None for d in procs), "one of them gives up", HUNG
            )
            (loser,) = [d for d in procs if d.proc.poll() is not None]
            (winner,) = [d for d in procs if d is not loser]
            assert loser.proc.returncode == 2, loser.log_text()
            told = loser.log_text()
            assert "a daemon already listens on" in told or "is starting on" in told, told
            assert "Traceback" not in loser.log_text()
            await wait_until(lambda: _answers(winner), "the other serves", HUNG, watch=[winner])
            assert "listening on" in winner.log_text()
            assert "listening on" not in loser.log_text()
            winner.signal(signal.SIGTERM)
            assert await winner.wait() == 0
        finally:
            for d in procs:
                if d.proc.poll() is None:
                    d.proc.kill()
                    d.proc.wait(timeout=HUNG)


def test_two_claims_on_one_path_the_second_is_refused_until_the_first_lets_go(
    tmp_path: Path,
) -> None:
    sock = tmp_path / "s.sock"
    held = socketfile.claim_socket_path(sock)
    try:
        with pytest.raises(DaemonError, match="is locked"):
            socketfile.claim_socket_path(sock)
    finally:
        os.close(held)
    os.close(socketfile.claim_socket_path(sock))  # free again
    lock = tmp_path / "s.sock.lock"
    assert stat.S_IMODE(os.lstat(lock).st_mode) == 0o600


@pytest.mark.parametrize(
    "until",
    [
        "",  # a daemon from before "unbounded": its stop with no bound wrote no time
        " 12x",
        " -5",
        " 1.5",
        " 99999999999999999999",  # past what the platform's time functions take
        " " + "9" * 120,
    ],
    ids=["none", "not-a-number", "negative", "fraction", "overflow", "long"],
)
def test_a_stopping_state_with_no_usable_end_claims_none(tmp_path: Path, until: str) -> None:
    """The holder's state is read back for the refusal's words only: no time, or one no clock
    can show (a torn or hand-edited lock file, an older daemon's unbounded stop), is still
    DAEMON_STOPPING -- never an OverflowError traceback -- and claims no end: not "at the
    latest", which only a bound the old daemon wrote may back."""
    sock = tmp_path / "s.sock"
    held = socketfile.claim_socket_path(sock)
    try:
        line = f"{os.getpid()} stopping{until}\n".encode()
        os.pwrite(held, line, 0)
        os.ftruncate(held, len(line))
        with pytest.raises(DaemonError, match="is shutting down") as caught:
            socketfile.claim_socket_path(sock)
    finally:
        os.close(held)
    assert caught.value.code == "DAEMON_STOPPING"
    assert "when it exits is not known" in str(caught.value)
    assert "at the latest" not in str(caught.value)


def test_a_stopping_daemon_s_end_is_a_utc_instant_and_seconds_from_now(tmp_path: Path) -> None:
    """Not a bare time of day (which day? whose zone?): the date and time in UTC, ISO 8601 with
    ``Z``, and the seconds left -- what a reader elsewhere, or tomorrow, can act on."""
    sock = tmp_path / "s.sock"
    held = socketfile.claim_socket_path(sock)
    until = int(time.time()) + 30
    try:
        line = f"{os.getpid()} stopping {until}\n".encode()
        os.pwrite(held, line, 0)
        os.ftruncate(held, len(line))
        with pytest.raises(DaemonError) as caught:
            socketfile.claim_socket_path(sock)
    finally:
        os.close(held)
    assert caught.value.code == "DAEMON_STOPPING"
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(until))
    found = re.search(rf"exited by {stamp}, in (\d+) s at the latest", str(caught.value))
    assert found, str(caught.value)
    assert 25 <= int(found.group(1)) <= 30


def test_a_lock_path_that_is_a_symlink_is_refused_and_its_target_untouched(
    tmp_path: Path,
) -> None:
    victim = tmp_path / "journal.key"
    victim.write_bytes(b"the daemon's")
    (tmp_path / "s.sock.lock").symlink_to(victim)
    with pytest.raises(DaemonError, match="cannot lock"):
        socketfile.claim_socket_path(tmp_path / "s.sock")
    assert victim.read_bytes() == b"the daemon's"


@pytest.mark.parametrize("mode", [0o770, 0o757, 0o777])
def test_a_socket_directory_others_can_write_is_refused(tmp_path: Path, mode: int) -> None:
    where = tmp_path / "run"
    where.mkdir()
    where.chmod(mode)
    with pytest.raises(DaemonError, match=rf"writable by others \(mode {mode:04o}\)"):
        socketfile.claim_socket_path(where / "s.sock")
    assert list(where.iterdir()) == []  # nothing made there, not even the lock


@pytest.mark.parametrize("mode", [0o770, 0o777])
def test_a_directory_above_the_socket_s_that_others_can_write_is_refused(
    tmp_path: Path, mode: int
) -> None:
    """Whoever can write a directory above could rename ``run`` away and make their own."""
    above = tmp_path / "shared"
    where = above / "run"
    where.mkdir(parents=True, mode=0o750)
    above.chmod(mode)
    with pytest.raises(DaemonError, match=rf"{above} is writable by others \(mode {mode:04o}\)"):
        socketfile.claim_socket_path(where / "s.sock")
    assert list(where.iterdir()) == []  # nothing made there, not even the lock


def test_a_socket_directory_reached_through_a_link_is_checked_where_it_leads(
    tmp_path: Path,
) -> None:
    """The link's own directory is safe; the directory it leads into is not."""
    open_to_all = tmp_path / "shared"
    (open_to_all / "run").mkdir(parents=True, mode=0o750)
    open_to_all.chmod(0o777)
    safe = tmp_path / "safe"
    safe.mkdir(mode=0o750)
    (safe / "run").symlink_to(open_to_all / "run")
    with pytest.raises(DaemonError, match=rf"{open_to_all} is writable by others"):
        socketfile.claim_socket_path(safe / "run" / "s.sock")


def test_a_directory_above_the_socket_s_of_another_user_is_refused(tmp_path: Path) -> None:
    require_root()
    above = tmp_path / "theirs"
    where = above / "run"
    where.mkdir(parents=True, mode=0o755)
    os.chown(above, NOBODY, NOBODY)
    with pytest.raises(DaemonError, match=f"{above} belongs to uid {NOBODY}"):
        socketfile.claim_socket_path(where / "s.sock")


def test_a_sticky_directory_above_the_socket_s_is_accepted(tmp_path: Path) -> None:
    """Sticky (as /tmp): others cannot rename the daemon's directory in it."""
    above = tmp_path / "tmp"
    where = above / "run"
    where.mkdir(parents=True, mode=0o750)
    above.chmod(0o1777)
    os.close(socketfile.claim_socket_path(where / "s.sock"))


@pytest.mark.parametrize("mode", [0o1777, 0o1770])
def test_a_sticky_socket_directory_others_can_write_is_refused(tmp_path: Path, mode: int) -> None:
    """Sticky (as /tmp): others cannot remove what the daemon made there, but they can take
    the socket's name or ``<socket>.lock`` before it starts."""
    where = tmp_path / "run"
    where.mkdir()
    where.chmod(mode)
    with pytest.raises(DaemonError, match=rf"\(mode {mode:04o}, sticky\)") as refused:
        socketfile.claim_socket_path(where / "s.sock")
    assert refused.value.code == "SOCKET_DIRECTORY_UNSAFE"
    mine = socketfile.private_directory(where)
    assert f"mkdir -m 0750 {mine} and use {mine / 's.sock'}" in str(refused.value)
    assert list(where.iterdir()) == []  # nothing made there, not even the lock


def test_the_suggested_socket_directory_is_one_no_other_user_shares(tmp_path: Path) -> None:
    """One shared ``/tmp/affidavit`` is whoever's makes it first: every other user's daemon
    would then refuse to start.  The suggestion is per user: their runtime directory when it is
    theirs and private, else a name with their uid in it."""
    sticky = tmp_path / "tmp"
    runtime = tmp_path / "user"
    runtime.mkdir(mode=0o700)
    me = os.geteuid()
    assert socketfile.private_directory(sticky, me, {}) == sticky / f"affidavit-{me}"
    assert socketfile.private_directory(sticky, NOBODY, {}) == sticky / f"affidavit-{NOBODY}"
    env = {"XDG_RUNTIME_DIR": str(runtime)}
    assert socketfile.private_directory(sticky, me, env) == runtime / "affidavit"
    # Not theirs, writable by others, or relative: the runtime directory is not suggested.
    assert socketfile.private_directory(sticky, NOBODY, env) == sticky / f"affidavit-{NOBODY}"
    runtime.chmod(0o777)
    assert socketfile.private_directory(sticky, me, env) == sticky / f"affidavit-{me}"
    relative = {"XDG_RUNTIME_DIR": "user"}
    assert socketfile.private_directory(sticky, me, relative) == sticky / f"affidavit-{me}"


def test_a_socket_directory_another_user_made_first_in_a_sticky_one_says_so(
    tmp_path: Path,
) -> None:
    """Another user made the directory the daemon was to use, in ``/tmp``-like ``sticky``,
    before it did (a denial, a hijack only for clients that trusted it): the refusal says
    another user made it, whose it is, and a directory no other user can make."""
    require_root()
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    squatted = sticky / "affidavit"
    squatted.mkdir(mode=0o750)
    os.chown(squatted, NOBODY, NOBODY)
    with pytest.raises(DaemonError, match=f"another user made {squatted} first") as refused:
        socketfile.claim_socket_path(squatted / "s.sock")
    assert refused.value.code == "SOCKET_DIRECTORY_UNSAFE"
    message = str(refused.value)
    assert f"it belongs to uid {NOBODY}" in message
    assert f"mkdir -m 0750 {socketfile.private_directory(sticky)}" in message
    assert list(squatted.iterdir()) == []


def test_a_sticky_socket_directory_reached_through_a_link_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    (tmp_path / "run").symlink_to(shared)
    with pytest.raises(DaemonError, match=rf"{shared} is writable by others \(mode 1777"):
        socketfile.claim_socket_path(tmp_path / "run" / "s.sock")


async def test_a_name_squatted_in_a_sticky_directory_is_refused_for_the_directory_first(
    tmp_path: Path, token: str
) -> None:
    """Another user took ``<socket>.lock`` in a sticky directory first: the daemon is told
    the directory is the fault (and what to do), not that a daemon already listens."""
    require_root()
    where = tmp_path / "tmp"
    where.mkdir()
    where.chmod(0o1777)
    squat = where / "affidavit.sock.lock"
    squat.write_bytes(b"")
    os.chown(squat, NOBODY, NOBODY)
    async with HostileServer.running(scripts.serve(Reply(200))) as srv:
        cfg = daemon_config(tmp_path, "a", srv.url, where / "affidavit.sock")
        done = await run(
            [sys.executable, "-m", "affidavit", "serve", "--config", str(cfg)],
            env=daemon_env(token),
        )
    assert done.returncode == 2
    assert b"affidavit: SOCKET_DIRECTORY_UNSAFE: " in done.stderr, done.stderr
    assert b"(mode 1777, sticky)" in done.stderr, done.stderr
    assert b"Traceback" not in done.stderr
    assert not (cfg.parent / "journal.db").exists()  # refused before the journal was opened


def test_a_socket_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    require_root()
    where = tmp_path / "run"
    where.mkdir(mode=0o755)
    os.chown(where, NOBODY, NOBODY)
    with pytest.raises(DaemonError, match=f"belongs to uid {NOBODY}"):
        socketfile.claim_socket_path(where / "s.sock")


async def test_serve_in_a_directory_others_can_write_exits_2_and_says_why(
    tmp_path: Path, token: str
) -> None:
    where = tmp_path / "run"
    where.mkdir()
    where.chmod(0o777)
    async with HostileServer.running(scripts.serve(Reply(200))) as srv:
        cfg = daemon_config(tmp_path, "a", srv.url, where / "affidavit.sock")
        done = await run(
            [sys.executable, "-m", "affidavit", "serve", "--config", str(cfg)],
            env=daemon_env(token),
        )
    assert done.returncode == 2
    assert b"is writable by others (mode 0777)" in done.stderr, done.stderr
    assert b"Traceback" not in done.stderr
    assert not (cfg.parent / "journal.db").exists()  # refused before the journal was opened


def test_a_lock_left_by_another_user_says_whose_and_how_to_remove_it(tmp_path: Path) -> None:
    """A root run left ``<socket>.lock``; the daemon, as root now, still does not take over
    another user's lock: the message says whose it is, where, and the command."""
    require_root()
    lock = tmp_path / "s.sock.lock"
    lock.write_bytes(b"")
    os.chown(lock, NOBODY, NOBODY)
    with pytest.raises(DaemonError) as refused:
        socketfile.claim_socket_path(tmp_path / "s.sock")
    assert refused.value.code == "SOCKET_LOCK_FOREIGN"
    message = str(refused.value)
    assert f"{lock} belongs to uid {NOBODY} (nobody), not to the daemon's user (uid 0 " in message
    assert f"rm {lock} -- and start again" in message
    assert lock.exists()  # never removed for them


FOREIGN_LOCK = """
import sys
from pathlib import Path
from affidavit.daemon import socketfile
try:
    socketfile.claim_socket_path(Path(sys.argv[1]))
except socketfile.DaemonError as exc:
    print(exc.code)
    print(exc)
"""


async def test_a_lock_root_left_refuses_the_service_user_saying_what_to_do() -> None:
    """The usual order: root ran the daemon once, then the service user cannot open root's
    ``0600`` lock at all (EACCES) -- told whose lock it is and the command, not "Permission
    denied"."""
    require_root()
    where = Path(tempfile.mkdtemp(prefix="affidavit-lock-"))
    try:
        os.chown(where, NOBODY, NOBODY)
        where.chmod(0o750)
        lock = where / "s.sock.lock"
        lock.write_bytes(b"")
        lock.chmod(0o600)
        done = await run(as_user(NOBODY, "-c", FOREIGN_LOCK, str(where / "s.sock")))
        assert done.returncode == 0, done
        code, message = done.stdout.decode().strip().split("\n")
        assert code == "SOCKET_LOCK_FOREIGN", done
        assert f"{lock} belongs to uid 0 (root), not to the daemon's user (uid {NOBODY}" in message
        assert f"rm {lock} -- and start again" in message
    finally:
        shutil.rmtree(where)


async def test_a_daemon_started_while_another_drains_is_told_it_is_shutting_down(
    tmp_path: Path, token: str
) -> None:
    """The old daemon has removed its socket and lets a call in flight finish: a new one on
    the same path is refused with the truth (it is stopping; start again after its grace),
    not "a daemon already listens"; once the old one has exited, the new one starts."""
    sock = tmp_path / "affidavit.sock"
    held, answer = trio.Event(), trio.Event()

    async def slow(peer: Peer) -> None:
        if await peer.read_request() is not None:
            held.set()
            await answer.wait()  # in flight until the new daemon has been refused
            await peer.respond(Reply(200))

    async with HostileServer.running(slow) as srv:
        home = tmp_path / "old"
        home.mkdir()
        # The call in flight must outlast the new daemon's start: not ended by its own timeout.
        targets = api_target(srv.url, timeout={"connect": 2, "total": HUNG})
        old_cfg = write_daemon_config(home, targets, socket=sock, service={"shutdown_grace": GRACE})
        old = await start_daemon(old_cfg, sock, tmp_path / "old.log", token)
        try:
            async with Client.open(sock) as client, trio.open_nursery() as nursery:
                nursery.start_soon(client.call, action())
                with trio.fail_after(WAIT):
                    await held.wait()
                signalled = time.time()
                old.signal(signal.SIGTERM)
                await wait_until(lambda: not sock.exists(), "the old daemon's socket is gone")
                # "stopping" until the latest it exits: its stop's bound, from the signal.
                words = (tmp_path / "affidavit.sock.lock").read_text().split()
                bound = stop_bound(GRACE, ANSWER_WAIT, None)
                assert words[1] == "stopping"
                assert signalled + bound <= int(words[2]) <= time.time() + bound + 1, words
                new_cfg = daemon_config(tmp_path, "new", srv.url, sock)
                serve = [sys.executable, "-m", "affidavit", "serve", "--config", str(new_cfg)]
                refused = await run(serve, env=daemon_env(token))
                assert old.proc.poll() is None  # still draining when it was refused
                answer.set()
                nursery.cancel_scope.cancel()
            assert await old.wait() == 0
            new = await start_daemon(new_cfg, sock, tmp_path / "new.log", token)
            stop(new)
        finally:
            stop(old)
    assert refused.returncode == 2
    line = refused.stderr.decode()
    assert f"affidavit: DAEMON_STOPPING: the daemon (pid {old.proc.pid}) on {sock} is " in line
    assert "shutting down" in line and "start again once it has exited" in line, line
    assert "already listens" not in line
    assert "Traceback" not in line
