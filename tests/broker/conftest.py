"""Fixtures for the broker end-to-end tests: a canary-ish bearer token in the environment and a
temporary directory to hold the config and the journal."""

from __future__ import annotations

import secrets

import pytest

from affidavit.engine import snapshot

from .helpers import TOKEN_ENV


@pytest.fixture
def token(monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bearer token the broker injects from ``env:AFFIDAVIT_TEST_TOKEN``."""
    value = "tok-" + secrets.token_urlsafe(24)
    monkeypatch.setenv(TOKEN_ENV, value)
    return value


@pytest.fixture
def settled_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """The config file trusted by its stat at once, as one older than ``SETTLED_NS`` is: a file
    written just now is read again at every dispatch for that long (``engine.snapshot``), in a
    thread -- the wait at the gate lets the writer commit the call's preamble on its own, so a
    test counting a call's transactions in steady state asks for this."""
    monkeypatch.setattr(snapshot, "SETTLED_NS", 0)
