"""Tests that need a program from outside Python (OpenSSH's ``sshd``, Graphviz's ``dot``; later
PostgreSQL and chromium): one rule for all of them.

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

import os
import shutil
from dataclasses import dataclass

import pytest

__all__ = ["DOT", "HIDE_ENV", "PROGRAMS", "REQUIRE_ENV", "SSHD", "SSH_KEYGEN", "Program"]

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

    def find(self) -> str | None:
        """The program's path, or None when it is not installed (or hidden)."""
        hidden = {p.strip() for p in os.environ.get(HIDE_ENV, "").split(",")}
        if self.name in hidden:
            return None
        search = os.pathsep.join([os.environ.get("PATH", os.defpath), *self.dirs])
        return shutil.which(self.name, path=search)

    def require(self) -> str:
        """The program's path; otherwise skip the calling test or fixture with the reason
        ``<package> not installed`` — or fail it when ``AFFIDAVIT_REQUIRE_PROGRAMS=1``."""
        path = self.find()
        if path is not None:
            return path
        reason = f"{self.package} not installed"
        if _flag(REQUIRE_ENV):
            pytest.fail(f"{reason} ({self.name} not found; {REQUIRE_ENV}=1 forbids the skip)")
        pytest.skip(reason)


SSHD = Program("sshd", "openssh-server", dirs=SBIN)
SSH_KEYGEN = Program("ssh-keygen", "openssh-client")
DOT = Program("dot", "graphviz")

PROGRAMS = (SSHD, SSH_KEYGEN, DOT)
"""Every program a test requires: ``.ci/run`` installs each one's package."""
