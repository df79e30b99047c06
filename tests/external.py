"""Tests that need a program from outside Python (OpenSSH's ``sshd``, Graphviz's ``dot``,
``tinyproxy``, curl, PostgreSQL's server, chromium and its chromedriver) -- or root, to run a
client as another uid: one rule for all of them.

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
import glob
import importlib
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = [
    "CHROMEDRIVER",
    "CHROMIUM",
    "CURL",
    "DOT",
    "HIDE_ENV",
    "POSTGRES",
    "PROGRAMS",
    "REQUIRE_ENV",
    "SSHD",
    "SSH_KEYGEN",
    "TINYPROXY",
    "Program",
    "ProgramFailed",
    "free_port",
    "listening",
    "require_file",
    "require_module",
    "require_posix_acl",
    "require_root",
]

REQUIRE_ENV = "AFFIDAVIT_REQUIRE_PROGRAMS"
HIDE_ENV = "AFFIDAVIT_HIDE_PROGRAMS"

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


def require_glibc() -> None:
    """Tests of glibc's allocator (``affidavit/heap.py``): skipped elsewhere (musl, macOS) with
    the reason ``glibc's allocator only``, a failure when ``AFFIDAVIT_REQUIRE_PROGRAMS=1`` (CI
    runs on Debian's glibc)."""
    try:
        version = os.confstr("CS_GNU_LIBC_VERSION")
    except (AttributeError, ValueError, OSError):
        version = None
    if not sys.platform.startswith("linux") or not version:
        _skip_or_fail("glibc's allocator only", f"{sys.platform}, no glibc version")


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


def free_port() -> int:
    """A loopback port nobody listens on right now (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def listening(
    argv: Sequence[str], port: int, log: Path, *, start_wait: float = 10.0
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``argv`` (a daemon kept in the foreground) with its output in ``log``; wait, at most
    ``start_wait`` seconds, until it accepts connections on 127.0.0.1:``port``; stop it (by its
    own pid: terminate, then kill) when the block ends.  ``ProgramFailed`` with the log if it
    exits or does not listen in time."""
    out = log.open("wb")
    proc = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + start_wait
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    out.flush()
                    text = log.read_text(errors="replace")
                    raise ProgramFailed(f"{argv[0]} did not listen on {port}: {text}") from None
                time.sleep(0.05)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        out.close()


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

PROGRAMS = (SSHD, SSH_KEYGEN, DOT, TINYPROXY, CURL, POSTGRES, CHROMIUM, CHROMEDRIVER)
"""Every program a test requires: ``.ci/run`` installs each one's package."""
