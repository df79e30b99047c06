"""The daemon's socket file: who may take its path, and how it is made.

``claim_socket_path`` runs before the journal is opened and returns a lock held for the daemon's
life; ``bind_socket`` makes the socket file exactly 0660 and listens on it; ``unlink_if_ours``
removes it at the end, only if it is still the one this daemon made (docs/deployment.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import math
import os
import pwd
import shlex
import socket
import stat
import time
from collections.abc import Mapping
from pathlib import Path

import trio

from affidavit.journal.exposure import directories_to

__all__ = [
    "BACKLOG",
    "SOCKET_MODE",
    "SUN_PATH_MAX",
    "DaemonError",
    "bind_socket",
    "claim_socket_path",
    "note_state",
    "private_directory",
    "unlink_if_ours",
    "warn_if_no_group_reaches",
]

log = logging.getLogger("affidavit.daemon")

SOCKET_MODE = 0o660
BACKLOG = 128
SUN_PATH_MAX = 107
"""Bytes of a Unix socket's path at most (Linux's ``sun_path`` is 108, with its NUL)."""


class DaemonError(Exception):
    """The daemon cannot start (the message says why and what to do; ``code`` is stable)."""

    def __init__(self, message: str, code: str = "SERVE_FAILED") -> None:
        super().__init__(message)
        self.code = code


def claim_socket_path(path: Path) -> int:
    """Make the socket path this daemon's to serve on, before the journal is opened (start-up
    recovery must not write the journal of a daemon that cannot listen); returns the lock's
    descriptor, held until the daemon has stopped and removed its socket.

    * A path no socket can have, or a directory that is not one, is refused.
    * The directory must be the daemon's user's (or root's) and writable by nobody else, sticky
      or not (``SOCKET_DIRECTORY_UNSAFE``): whoever can write it could remove the socket and
      bind their own in its place -- or, sticky as ``/tmp``, take the socket's name or
      ``<socket>.lock`` before the daemon starts (it could not start; a client could reach
      theirs).  As tmux does with its socket's directory; ssh-agent makes a private one.  The
      refusal suggests one per user (``private_directory``), never one shared name in
      ``/tmp`` that whichever user makes it first owns.
      Every directory above it, as written and as resolved, must be the user's or root's and
      writable by nobody else unless sticky: whoever can write one could rename the socket's
      directory away and put one of their own in its place (in a sticky one they cannot).
    * ``<socket>.lock`` is locked (flock, exclusive, never removed) before the path is touched:
      of two daemons starting on one path, the second is refused here -- it never probes a
      socket the first has bound but not yet listened on (a connect is refused then, exactly
      as on a stale one), so never removes it; and a stopping daemon's socket is removed
      before its lock goes.
    * Then a socket file nobody answers on is stale (its daemon was killed): removed.  One
      that answers belongs to a live daemon (not ours: refused).  Anything else at the path is
      not ours to touch."""
    size = len(os.fsencode(path))
    if size > SUN_PATH_MAX:
        raise DaemonError(
            f"cannot listen on {path}: a Unix socket's path is at most {SUN_PATH_MAX} bytes, "
            f"this one is {size}; choose a shorter [service] socket (or --socket)"
        )
    if not path.parent.is_dir():
        if not os.path.lexists(path.parent):  # e.g. /run/affidavit without systemd, after a boot
            raise DaemonError(
                f"cannot listen on {path}: {path.parent} does not exist; create it, writable by "
                f"the daemon's user only (mkdir -m 0750 {shlex.quote(str(path.parent))})"
            )
        raise DaemonError(f"cannot listen on {path}: {path.parent} is not a directory")
    _check_directory(path)
    lock = _lock(path)
    try:
        _remove_stale(path)
    except BaseException:
        os.close(lock)
        raise
    return lock


def _check_directory(path: Path) -> None:
    """The socket's directory (where it leads) is the daemon's user's or root's and writable
    by nobody else, sticky or not; every directory above it (as written and as resolved) is
    the user's or root's and writable by nobody else unless sticky; so is each link on the
    way: whoever can write a directory above could rename the socket's away and put their own
    in its place, exactly as in the socket's own directory."""
    own = Path(os.path.realpath(path.parent))
    for where, st in directories_to(Path(os.path.abspath(path.parent)), Path(own)):
        if st.st_uid not in (0, os.geteuid()):
            if where == own and _sticky(where.parent):
                raise DaemonError(
                    f"cannot listen on {path}: another user made {where} first (it belongs "
                    f"to {_user(st.st_uid)}, who could replace the socket); in a directory "
                    f"anyone can write, a name is whoever's takes it first -- use one no other "
                    f"user can make: mkdir -m 0750 {private_directory(where.parent)} (or a "
                    f"directory under the daemon's user's home)",
                    "SOCKET_DIRECTORY_UNSAFE",
                )
            raise DaemonError(
                f"cannot listen on {path}: {where} belongs to uid {st.st_uid}, who could "
                f"replace the socket; use a directory of the daemon's user (or root's)",
                "SOCKET_DIRECTORY_UNSAFE",
            )
        if stat.S_ISLNK(st.st_mode) or not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            continue  # a link's mode means nothing; the directory holding it is checked
        mode = stat.S_IMODE(st.st_mode)
        if where == own and st.st_mode & stat.S_ISVTX:
            mine = private_directory(where)
            raise DaemonError(
                f"cannot listen on {path}: {where} is writable by others (mode {mode:04o}, "
                f"sticky), who could take the socket's name or {path.name}.lock first; put "
                f"the socket in a directory of its own, writable by its owner only: "
                f"mkdir -m 0750 {mine} and use {mine / path.name}",
                "SOCKET_DIRECTORY_UNSAFE",
            )
        if not st.st_mode & stat.S_ISVTX:
            raise DaemonError(
                f"cannot listen on {path}: {where} is writable by others (mode {mode:04o}), "
                f"who could replace the socket; make it writable by its owner only (0750)",
                "SOCKET_DIRECTORY_UNSAFE",
            )


def private_directory(
    sticky: Path, uid: int | None = None, env: Mapping[str, str] | None = None
) -> Path:
    """Where the daemon of ``uid`` (default: this process's) should put its socket instead of
    the directory anyone can write, ``sticky``: ``$XDG_RUNTIME_DIR/affidavit`` when that is
    set and safe (the user's own, ``0700``-like, made at login: nobody else can make a name in
    it), else ``<sticky>/affidavit-<uid>`` -- one name per user, not one shared
    ``/tmp/affidavit`` whichever user makes first makes every other's daemon refuse to start.
    (Another user could still make ``affidavit-<uid>`` first, deliberately: the daemon then
    refuses, saying so, as tmux does with ``/tmp/tmux-<uid>``.)"""
    uid = os.geteuid() if uid is None else uid
    runtime = (os.environ if env is None else env).get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime):
        try:
            st = os.lstat(runtime)
        except OSError:
            pass
        else:
            if stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o022:
                return Path(runtime) / "affidavit"
    return sticky / f"affidavit-{uid}"


def _sticky(directory: Path) -> bool:
    """Whether others may make names in ``directory`` but not take ours (``/tmp``)."""
    try:
        st = os.stat(directory)
    except OSError:
        return False
    return bool(st.st_mode & stat.S_ISVTX and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def _lock(path: Path) -> int:
    lock = path.with_name(path.name + ".lock")
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(lock, flags, 0o600)
    except OSError as exc:
        _refuse_foreign(path, lock)
        raise DaemonError(f"cannot lock {lock}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_uid != os.geteuid():
            _refuse_foreign(path, lock)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise DaemonError(f"{lock} is not a file of the daemon's user; refusing to use it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _held(path, lock, fd) from None
        note_state(fd, "starting")
    except BaseException:
        os.close(fd)
        raise
    return fd


def note_state(lock: int, state: str, until: float | None = None) -> None:
    """Write the holder's state into its lock file -- ``<pid> starting|serving|stopping
    <until>|stopping unbounded`` (``until``: epoch seconds by which a stopping daemon will have
    exited at the latest, its stop's bound: ``stopping.bound``; rounded up; None for a stop
    with no bound, its watchdog not started: ``unbounded``) -- so that a daemon refused on the
    path can say what is true.  Only the daemon's user can read it (``0600``); it holds no
    secret.  Best effort: an unwritten state leaves the refusal saying only that the lock is
    held."""
    end = "" if state != "stopping" else " unbounded" if until is None else f" {math.ceil(until)}"
    line = f"{os.getpid()} {state}{end}\n"
    with contextlib.suppress(OSError):
        os.pwrite(lock, line.encode("ascii"), 0)
        os.ftruncate(lock, len(line))


def _held(path: Path, lock: Path, fd: int) -> DaemonError:
    """The refusal for a path whose lock another daemon holds, in the words of its state."""
    try:
        words = os.pread(fd, 128, 0).decode("ascii", "replace").split("\n")[0].split()
    except OSError:
        words = []
    pid = words[0] if words and words[0].isdigit() else "?"
    state = words[1] if len(words) > 1 else ""
    if state == "stopping":
        return _stopping(path, pid, words[2] if len(words) > 2 else "")
    if state == "starting":
        return DaemonError(f"a daemon (pid {pid}) is starting on {path} ({lock} is locked)")
    if state == "serving":
        return DaemonError(f"a daemon already listens on {path} (pid {pid}; {lock} is locked)")
    return DaemonError(f"a daemon already listens on {path} (or is starting to: {lock} is locked)")


def _stopping(path: Path, pid: str, end: str) -> DaemonError:
    """The refusal for a path whose daemon stops, by what its lock file says of its end:
    a time (its stop's bound: "at the latest"), ``unbounded`` (its watchdog could not be
    started), or nothing usable -- no time (a daemon from before ``unbounded`` was written
    wrote none for such a stop), a torn or edited one, one no clock function takes: no end is
    claimed then."""
    when = None
    if end.isdigit():
        # Words only: a time no clock function takes is not shown.
        with contextlib.suppress(OverflowError, OSError, ValueError):
            when = _instant(int(end))
    if when is not None:
        then = f", and will have exited by {when} at the latest (its stop's bound)"
    elif end == "unbounded":
        then = (
            ", then closes its journal; its stop has no bound (its watchdog could not be "
            "started), so it exits only once its journal has answered"
        )
    else:
        then = (
            ", then closes its journal; its lock file names no time by which it will have "
            "exited (its stop may have no bound), so when it exits is not known"
        )
    return DaemonError(
        f"the daemon (pid {pid}) on {path} is shutting down: it no longer accepts calls, lets "
        f"those in flight finish within its shutdown grace{then}; start again once it has exited",
        "DAEMON_STOPPING",
    )


def _instant(until: int) -> str:
    """``until`` as a reader anywhere can place it: the UTC date and time (ISO 8601, ``Z``)
    and how many seconds from now -- never a bare time of day, which names no day and reads
    as local time."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(until))
    return f"{stamp}, in {max(0, math.ceil(until - time.time()))} s"


def _refuse_foreign(path: Path, lock: Path) -> None:
    """A lock file of another user -- a daemon once run as root, then as the service user --
    is never taken over (whoever owns it may be serving on the path now); the message says
    whose it is and how to remove it once no daemon of that user runs."""
    try:
        st = os.lstat(lock)
    except OSError:
        return
    me = os.geteuid()
    if not stat.S_ISREG(st.st_mode) or st.st_uid == me:
        return
    raise DaemonError(
        f"{lock} belongs to {_user(st.st_uid)}, not to the daemon's user ({_user(me)}): a "
        f"daemon run as that user left it.  If none runs on {path} now (nothing answers on "
        f"it), remove the lock by hand as root or its owner -- rm {shlex.quote(str(lock))} -- "
        f"and start again",
        "SOCKET_LOCK_FOREIGN",
    )


def _user(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def _remove_stale(path: Path) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise DaemonError(f"{path} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        os.unlink(path)
        log.info("removed the stale socket %s", path)
        return
    except OSError as exc:
        raise DaemonError(f"cannot check the socket {path}: {exc.strerror or exc}") from None
    finally:
        probe.close()
    raise DaemonError(f"a daemon already listens on {path}")


def bind_socket(path: Path) -> tuple[trio.SocketListener, int]:
    """Create the socket file exactly 0660 and listen on it.  The mode comes from the umask
    around ``bind`` (Linux creates a socket file ``0777 & ~umask``), never from a ``chmod`` of
    the path afterwards: whoever can write the socket's directory could swap the path for a
    symlink between the two calls, and ``chmod`` would follow it to any file the daemon owns.
    What is at the path after ``bind`` is checked without following a link; a path that is no
    longer our socket file of that mode is refused."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        old = os.umask(0o777 & ~SOCKET_MODE)
        try:
            sock.bind(str(path))
        finally:
            os.umask(old)
        st = os.lstat(path)
        if not stat.S_ISSOCK(st.st_mode) or stat.S_IMODE(st.st_mode) != SOCKET_MODE:
            raise DaemonError(
                f"cannot listen on {path}: the path was replaced while the socket was created "
                f"(or its mode is not {SOCKET_MODE:04o}); check who can write {path.parent}"
            )
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        raise DaemonError(f"cannot listen on {path}: {exc.strerror or exc}") from None
    except DaemonError:
        sock.close()
        raise
    return trio.SocketListener(trio.socket.from_stdlib_socket(sock)), st.st_ino


def warn_if_no_group_reaches(path: Path, inode: int, gids: frozenset[int]) -> None:
    """Log a warning when the socket's group is none of the allowed ``gids``: a member of them
    who is not its owner cannot open it (mode 0660: ``EACCES`` at connect, before the daemon
    sees them).  The socket takes the daemon's primary group, or a setgid directory's group."""
    try:
        st = os.lstat(path)
    except OSError:
        return
    if not gids or st.st_ino != inode or st.st_gid in gids:
        return
    log.warning(
        "the socket %s has group %d, none of the allowed gids %s: their members cannot open it "
        "(mode %04o); start the daemon with that group as its primary group (systemd: Group=)",
        path,
        st.st_gid,
        sorted(gids),
        SOCKET_MODE,
    )


def unlink_if_ours(path: Path, inode: int) -> None:
    with contextlib.suppress(OSError):
        if os.lstat(path).st_ino == inode:
            os.unlink(path)
