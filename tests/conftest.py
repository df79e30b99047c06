"""Fixtures every test directory may use: a real PostgreSQL server (``tests/postgres.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.postgres import Cluster, running_cluster


@pytest.fixture(scope="session")
def pg() -> Iterator[Cluster]:
    """One PostgreSQL server for the session (skipped with ``postgresql not installed`` without
    Debian's server, a failure when ``AFFIDAVIT_REQUIRE_PROGRAMS=1``); each test takes a fresh
    database of it with ``pg.database()``."""
    with running_cluster() as cluster:
        yield cluster


@pytest.fixture
def pg_url(pg: Cluster) -> str:
    """A fresh, empty database's URL (the superuser's canary password in it)."""
    return pg.database()
