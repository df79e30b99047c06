"""Fixtures for the daemon tests: the canary credential, known only to the daemon's process."""

from __future__ import annotations

import secrets

import pytest

from tests.external import CURL


@pytest.fixture
def token() -> str:
    """A fresh canary bearer token.  Handed to the daemon's environment only; a client's
    environment never holds it (tests/daemon/kit.py)."""
    return "canary-" + secrets.token_urlsafe(24)


@pytest.fixture
def curl() -> str:
    """curl's path (``curl --unix-socket``); skipped by the external-program rule without it."""
    return CURL.require()
