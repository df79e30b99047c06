"""Fixtures for the daemon tests: the canary credential, known only to the daemon's process."""

from __future__ import annotations

import os
import secrets
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.external import CURL, require_root

from .kit import NOBODY


@pytest.fixture
def token() -> str:
    """A fresh canary bearer token.  Handed to the daemon's environment only; a client's
    environment never holds it (tests/daemon/kit.py)."""
    return "canary-" + secrets.token_urlsafe(24)


@pytest.fixture
def curl() -> str:
    """curl's path (``curl --unix-socket``); skipped by the external-program rule without it."""
    return CURL.require()


@pytest.fixture
def shared_socket_dir() -> Iterator[Path]:
    """A directory whose group is nogroup and setgid: the daemon's socket inside it belongs to
    that group (the socket-group deployment of docs/deployment.md), so a client running as
    nobody may connect -- and may read nothing else of the daemon's."""
    require_root()
    path = Path(tempfile.mkdtemp(prefix="affidavit-sock-"))
    os.chown(path, 0, NOBODY)
    os.chmod(path, 0o2750)
    try:
        yield path
    finally:
        for p in path.iterdir():
            p.unlink()
        path.rmdir()
