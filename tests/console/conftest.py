"""Fixtures of the console tests: the canary credential and a headless chromium."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from .kit import Browser, browser


@pytest.fixture
def token() -> str:
    """A canary bearer token, known only to the daemon's environment."""
    return "canary-" + secrets.token_urlsafe(24)


@pytest.fixture
def chrome() -> Iterator[Browser]:
    """A real headless chromium (selenium); "chromium not installed" skips the test (fails it
    under ``AFFIDAVIT_REQUIRE_PROGRAMS=1``)."""
    with browser() as b:
        yield b
