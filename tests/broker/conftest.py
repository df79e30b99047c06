"""Fixtures for the broker end-to-end tests: a canary-ish bearer token in the environment and a
temporary directory to hold the config and the journal."""

from __future__ import annotations

import secrets

import pytest

from .helpers import TOKEN_ENV


@pytest.fixture
def token(monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bearer token the broker injects from ``env:AFFIDAVIT_TEST_TOKEN``."""
    value = "tok-" + secrets.token_urlsafe(24)
    monkeypatch.setenv(TOKEN_ENV, value)
    return value
