"""Tests that need a program from outside Python (OpenSSH's ``sshd``, Graphviz's ``dot``,
``tinyproxy``, curl, PostgreSQL's server, chromium and its chromedriver, ``openssl``) -- or
root, to run a client as another uid: one rule for all of them.

``PROGRAM.require()`` returns the program's path when it is installed.  When it is not, the
test is skipped with the reason ``<package> not installed`` — a newcomer's ``python3 -m pytest``
passes and says what it did not run — unless ``AFFIDAVIT_REQUIRE_PROGRAMS=1`` is set: then the
missing program fails the test.  CI (``.ci/run``) installs every program and sets that
variable, so it can never lose the real-peer coverage silently.

Call ``require()`` from a fixture (the ``sshd`` fixture) or a synchronous test: under
pytest-trio a skip raised inside an async test body is reported without its reason.

``AFFIDAVIT_HIDE_PROGRAMS=sshd,dot`` makes ``require()`` treat those programs as missing even
when installed: how a machine without them is tried on one that has them (daemons live in
sbin directories that hiding from PATH alone would not cover).
"""

from __future__ import annotations

import contextlib
import errno
import glob
import importlib
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

__all__ = [
    "CC",
    "CHROMEDRIVER",
    "CHROMIUM",
    "CURL",
    "DOT",
    "HIDE_ENV",
    "IN_USE",
    "OPENSSL",
    "PORT_ATTEMPTS",
    "POSTGRES",
    "PROGRAMS",
    "REQUIRE_ENV",
    "SSHD",
    "SSH_KEYGEN",
    "TINYPROXY",
    "Listening",
    "PortTaken",
    "Program",
    "ProgramFailed",
    "build_shim",
    "free_port",
    "listening",
    "on_free_port",
    "on_free_port_async",
    "port_taken",
    "require_boot_clock",
    "require_file",
    "require_module",
    "require_posix_acl",
    "require_root",
]

REQUIRE_ENV = "AFFIDAVIT_REQUIRE_PROGRAMS"
HIDE_ENV = "AFFIDAVIT_HIDE_PROGRAMS"

T = TypeVar("T")

SBIN = ("/usr/local/sbin", "/usr/sbin", "/sbin")
"""Where daemons are installed; not on an ordinary user's PATH on Debian and Ubuntu."""


def _flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


@dataclass(frozen=True)
class Program:
    name: str
    """the executable"""
    package: str
    """what installs it (the Debian package name), quoted in the skip reason"""
    dirs: tuple[str, ...] = ()
    """searched after PATH"""
    only_dirs: bool = False
    """search ``dirs`` alone: PATH may hold an unrelated program of the same name"""

    def find(self) -> str | None:
        """The program's path, or None when it is not installed (or hidden)."""
        hidden = {p.strip() for p in os.environ.get(HIDE_ENV, "").split(",")}
        if self.name in hidden:
            return None
        path = [] if self.only_dirs else [os.environ.get("PATH", os.defpath)]
        search = os.pathsep.join([*path, *self.dirs])
        return shutil.which(self.name, path=search) if search else None

    def require(self) -> str:
        """The program's path; otherwise skip the calling test or fixture with the reason
        ``<package> not installed`` — or fail it when ``AFFIDAVIT_REQUIRE_PROGRAMS=1``."""
        path = self.find()
        if path is not None:
            return path
        _skip_or_fail(f"{self.package} not installed", f"{self.name} not found")


def _skip_or_fail(reason: str, detail: str) -> None:
    if _flag(REQUIRE_ENV):
        pytest.fail(f"{reason} ({detail}; {REQUIRE_ENV}=1 forbids the skip)")
    pytest.skip(reason)


def require_file(path: str, package: str) -> Path:
    """A file a package installs (the system CA bundle): its path; otherwise skipped with the
    reason ``<package> not installed``, or a failure when ``AFFIDAVIT_REQUIRE_PROGRAMS=1``
    (``.ci/run`` installs the package)."""
    if not Path(path).is_file():
        _skip_or_fail(f"{package} not installed", f"no {path}")
    return Path(path)


def require_root() -> None:
    """Tests that run a client as another uid (the daemon's privilege boundary) need root to
    switch: skipped with the reason ``needs root to switch uid`` elsewhere, a failure when
    ``AFFIDAVIT_REQUIRE_PROGRAMS=1`` (CI runs as root)."""
    if os.geteuid() != 0:
        _skip_or_fail("needs root to switch uid", f"running as uid {os.geteuid()}")


def require_posix_acl(path: Path, *entries: tuple[int, int, int]) -> None:
    """Set the access ACL of ``entries`` (``(tag, perm, id)``, ``affidavit.acl``'s tags; id
    ignored but for USER and GROUP) on ``path`` -- as ``setfacl`` does, through the
    ``system.posix_acl_access`` attribute.  Where the file system or the platform takes none
    (no ``os.setxattr``, ENOTSUP) or this user may not set it: skipped with the reason ``needs
    POSIX ACL support``, or a failure when ``AFFIDAVIT_REQUIRE_PROGRAMS=1`` (CI's /tmp takes
    them)."""
    from affidavit.acl import ACCESS, GROUP, USER, VERSION

    raw = struct.pack("<I", VERSION) + b"".join(
        struct.pack("<HHI", tag, perm, who if tag in (USER, GROUP) else 0xFFFFFFFF)
        for tag, perm, who in sorted(entries)  # the kernel takes them in this order only
    )
    setxattr = getattr(os, "setxattr", None)
    if setxattr is None:
        _skip_or_fail("needs POSIX ACL support", "no os.setxattr on this platform")
        return
    try:
        setxattr(path, ACCESS, raw)
    except OSError as exc:
        _skip_or_fail("needs POSIX ACL support", f"setxattr on {path}: {exc.strerror}")


def require_glibc(reason: str = "glibc's allocator only") -> None:
    """Tests of glibc's allocator (``affidavit/heap.py``), or of an ``LD_PRELOAD`` shim
    (``build_shim``): skipped elsewhere (musl, macOS) with ``reason``, a failure when
    ``AFFIDAVIT_REQUIRE_PROGRAMS=1`` (CI runs on Debian's glibc)."""
    try:
        version = os.confstr("CS_GNU_LIBC_VERSION")
    except (AttributeError, ValueError, OSError):
        version = None
    if not sys.platform.startswith("linux") or not version:
        _skip_or_fail(reason, f"{sys.platform}, no glibc version")


def require_boot_clock() -> None:
    """Tests of a key's or lease's age by the boot clock (``journal/boot.py``): a host with no
    ``CLOCK_BOOTTIME`` or no boot id (not Linux) skips them with the reason ``needs
    CLOCK_BOOTTIME and a boot id (Linux)``, a failure when ``AFFIDAVIT_REQUIRE_PROGRAMS=1``
    (CI runs on Linux, which has both)."""
    from affidavit.journal.boot import boot_mark

    if boot_mark() is None:
        _skip_or_fail("needs CLOCK_BOOTTIME and a boot id (Linux)", f"none on {sys.platform}")


BUILD_TIMEOUT = 60.0
"""Seconds a shim's build may take (gcc on a loaded machine builds one in well under one)."""


@contextlib.contextmanager
def tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``mount -o size=``, e.g. ``4m``) mounted at ``where`` (made 0700)
    for the block -- a disk that really fills (ENOSPC) -- unmounted after.  Mounting needs root
    and the capability to mount: elsewhere skipped with the reason ``needs root to mount a
    tmpfs``, a failure when ``AFFIDAVIT_REQUIRE_PROGRAMS=1`` (CI runs as root)."""
    if os.geteuid() != 0:
        _skip_or_fail("needs root to mount a tmpfs", f"running as uid {os.geteuid()}")
    where.mkdir(mode=0o700)
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
        capture_output=True,
        timeout=30,
        check=False,
    )
    if made.returncode != 0:
        _skip_or_fail("needs root to mount a tmpfs", made.stderr.decode(errors="replace").strip())
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], capture_output=True, timeout=30, check=True)


def build_shim(source: Path, out: Path) -> Path:
    """``source`` (C, Linux and glibc: ``dlsym(RTLD_NEXT)``, ``/proc/self/fd``) built with gcc
    into the ``LD_PRELOAD`` shim ``out``.  Skipped -- a failure when
    ``AFFIDAVIT_REQUIRE_PROGRAMS=1`` -- off Linux/glibc (``LD_PRELOAD shims need Linux and
    glibc``), without gcc (``gcc not installed``) or without the C library's headers and
    startup files (``libc6-dev not installed``: gcc then fails to find ``dlfcn.h``, ``crti.o``
    or ``-lc``).  Any other failure of the build, or one past ``BUILD_TIMEOUT``, fails the test
    with gcc's output."""
    require_glibc("LD_PRELOAD shims need Linux and glibc")
    cc = CC.require()
    try:
        done = subprocess.run(
            [cc, "-shared", "-fPIC", "-o", str(out), str(source), "-ldl"],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"building {source.name} took longer than {BUILD_TIMEOUT:g}s")
    if done.returncode != 0:
        said = done.stderr + done.stdout
        if any(words in said for words in _NO_LIBC_DEV):
            _skip_or_fail("libc6-dev not installed", f"gcc: {said.strip().splitlines()[0]}")
        pytest.fail(f"building {source.name} failed (exit {done.returncode}):\n{said}")
    return out


_NO_LIBC_DEV = (
    ".h: No such file or directory",
    "cannot find crt",
    "cannot find -lc",
    "cannot find -ldl",
)
"""What gcc says when the C library's development files (Debian: ``libc6-dev``) are missing."""


def require_module(name: str, extra: str) -> None:
    """A Python package of one of the project's extras (``mcp``): the same rule as a program --
    skipped with the reason ``<name> not installed``, a failure when
    ``AFFIDAVIT_REQUIRE_PROGRAMS=1`` (``pytest.importorskip`` would skip even in CI)."""
    try:
        importlib.import_module(name)
    except ImportError:
        _skip_or_fail(f"{name} not installed", f"pip install -e '.[{extra}]'")


class ProgramFailed(RuntimeError):
    """A program started by ``listening`` exited or did not listen in time; the message holds
    its log."""


class PortTaken(ProgramFailed):
    """Another process held the port: the program exited (the address in use) or never held
    it itself.  ``listening`` starts it again on another port."""


PORT_ATTEMPTS = 3
"""How many free ports a server is started on before its start fails: a free port is only free
when asked -- another xdist worker may start its own server there before ours binds it."""


def free_port() -> int:
    """A loopback port nobody listens on right now (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


IN_USE = os.strerror(errno.EADDRINUSE)
"""``Address already in use``: how a server -- ours, OpenSSH, PostgreSQL -- says it lost the
race for its port."""


def port_taken(exc: BaseException) -> bool:
    """Whether ``exc`` says another process held the port: ``PortTaken``, or an error whose
    message carries ``IN_USE`` (a daemon of ours that could not bind its console: its log or
    ``DaemonError`` in the message)."""
    return isinstance(exc, PortTaken) or IN_USE in str(exc)


def on_free_port(start: Callable[[int], T], *, attempts: int = PORT_ATTEMPTS) -> tuple[T, int]:
    """``start(port)`` on a ``free_port()``: (what it returns, the port).  When it fails
    because another process holds the port (``port_taken``) it is called again on another,
    ``attempts`` times in all; the last failure is raised."""
    for attempt in range(1, attempts + 1):
        port = free_port()
        try:
            return start(port), port
        except Exception as exc:
            if attempt == attempts or not port_taken(exc):
                raise
    raise ValueError(f"attempts={attempts}: at least one is made")


async def on_free_port_async(
    start: Callable[[int], Awaitable[T]], *, attempts: int = PORT_ATTEMPTS
) -> tuple[T, int]:
    """``on_free_port`` for a start that is awaited (a daemon started under trio)."""
    for attempt in range(1, attempts + 1):
        port = free_port()
        try:
            return await start(port), port
        except Exception as exc:
            if attempt == attempts or not port_taken(exc):
                raise
    raise ValueError(f"attempts={attempts}: at least one is made")


def listeners(port: int) -> set[int] | None:
    """The socket inodes listening on TCP ``port`` (any address, IPv4 or IPv6) in this network
    namespace, from ``/proc/net/tcp{,6}``; None where there is no such table (not Linux)."""
    found: set[int] | None = None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        found = found or set()
        for row in rows:
            # sl local_address rem_address st ... inode: "0100007F:1F90", state 0A is LISTEN
            fields = row.split()
            if (
                len(fields) > 9
                and fields[3] == "0A"
                and int(fields[1].rsplit(":", 1)[1], 16) == port
            ):
                found.add(int(fields[9]))
    return found


def holds(pid: int, inodes: set[int]) -> bool | None:
    """Whether process ``pid`` has one of the sockets ``inodes`` open (``/proc/<pid>/fd``);
    None when its descriptors cannot be read.  A descriptor closed between the listing and its
    ``readlink`` (a program starting up opens and closes many) is one it no longer holds; a
    process that is gone holds nothing."""
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except FileNotFoundError:
        return False
    except OSError:  # not ours to read
        return None
    wanted = {f"socket:[{i}]" for i in inodes}
    for fd in fds:
        try:
            if os.readlink(fd) in wanted:
                return True
        except FileNotFoundError:
            continue
        except OSError:
            return None
    return False


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def _owns(proc: subprocess.Popen[bytes], port: int) -> bool | None:
    """True when ``proc`` itself holds a listening socket on ``port``, False when only other
    processes do, None when nobody listens there (yet).  What /proc cannot tell -- no such
    table (not Linux), descriptors we may not read -- is taken as ours while the port answers:
    the most a portable check can do."""
    inodes = listeners(port)
    if inodes is None:
        return True if _answers(port) else None
    if not inodes:
        return None
    return holds(proc.pid, inodes) is not False


def _start(
    argv: Sequence[str], port: int, log: Path, start_wait: float, stdin: int | None = None
) -> subprocess.Popen[bytes]:
    """``argv`` started with its output in ``log``, once it holds its listening socket on
    ``port``.  ``PortTaken`` when another process listens there and ours exits or does not
    listen in ``start_wait`` seconds; ``ProgramFailed`` otherwise.  Not left running on failure."""
    with log.open("wb") as out:
        proc = subprocess.Popen(list(argv), stdin=stdin, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + start_wait
        while (owns := _owns(proc, port)) is not True:
            exited = proc.poll() is not None
            if exited or time.monotonic() > deadline:
                text = log.read_text(errors="replace")
                why = "exited" if exited else f"did not listen in {start_wait} s"
                if owns is False or IN_USE in text:  # another holds it
                    raise PortTaken(f"{argv[0]} {why}, another process on {port}: {text}")
                raise ProgramFailed(f"{argv[0]} {why}, nothing on {port}: {text}")
            time.sleep(0.05)
        if proc.poll() is not None:  # listened, and is gone already
            raise ProgramFailed(f"{argv[0]} exited: {log.read_text(errors='replace')}")
    except BaseException:
        _stop(proc)
        raise
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """By its own pid: terminate, then kill (its stdin pipe, if any, closed after)."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    if proc.stdin is not None:
        proc.stdin.close()


@dataclass(frozen=True)
class Listening:
    proc: subprocess.Popen[bytes]
    port: int


@contextlib.contextmanager
def listening(
    argv_at: Callable[[int], Sequence[str]],
    log: Path,
    *,
    start_wait: float = 10.0,
    attempts: int = PORT_ATTEMPTS,
    stdin: int | None = None,
) -> Iterator[Listening]:
    """Run ``argv_at(port)`` (a daemon kept in the foreground, told to listen on
    127.0.0.1:``port``, a ``free_port()``) with its output in ``log``; wait, at most
    ``start_wait`` seconds, until the process itself holds its listening socket there -- a port
    that answers may be another process's, another xdist worker's server that took the port
    first; stop it (by its own pid: terminate, then kill) when the block ends.  Where another
    process holds the port (``PortTaken``), it is started again on another, ``attempts`` times
    in all.  ``ProgramFailed`` with the log if it exits or does not listen in time.  ``stdin``:
    ``subprocess.PIPE`` for a daemon driven by what is written to it (``openssl s_server``)."""
    proc, port = on_free_port(
        lambda port: _start(argv_at(port), port, log, start_wait, stdin), attempts=attempts
    )
    try:
        yield Listening(proc, port)
    finally:
        _stop(proc)


SSHD = Program("sshd", "openssh-server", dirs=SBIN)
SSH_KEYGEN = Program("ssh-keygen", "openssh-client")
DOT = Program("dot", "graphviz")
TINYPROXY = Program("tinyproxy", "tinyproxy", dirs=SBIN)
CURL = Program("curl", "curl")
POSTGRES = Program(
    "postgres",
    "postgresql",
    # Debian's server binaries (initdb, pg_ctl, postgres) live in a versioned directory off
    # PATH, the newest first; another ``initdb`` on PATH may be something else entirely.
    dirs=tuple(sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)),
    only_dirs=True,
)
CHROMIUM = Program("chromium", "chromium")
CHROMEDRIVER = Program("chromedriver", "chromium-driver")
OPENSSL = Program("openssl", "openssl")
CC = Program("gcc", "gcc")
"""With ``libc6-dev``'s headers: builds the LD_PRELOAD shim of tests/journal/failsync.c."""

PROGRAMS = (SSHD, SSH_KEYGEN, DOT, TINYPROXY, CURL, POSTGRES, CHROMIUM, CHROMEDRIVER, OPENSSL, CC)
"""Every program a test requires: ``.ci/run`` installs each one's package."""
