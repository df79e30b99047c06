"""The conformance suite's one fixture: ``place``, a journal location on each backend in turn.

Every test in tests/journal/conformance/ runs once on SQLite and once on PostgreSQL (a fresh
database of the session's server, ``tests/postgres.py``) through the same public API.  What a
test needs beyond the API -- looking at rows as stored, or tampering with them as someone with
write access to the database would -- goes through ``Place``, which knows each backend's way
(SQLite: the file; PostgreSQL: the superuser, with triggers off for the tampering session).
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from affidavit.journal import Journal, JournalError, JournalReader
from tests.postgres import Cluster

BACKENDS = ("sqlite", "postgresql")

_SQLITE_TRIGGERS = (
    "events_no_update",
    "events_no_delete",
    "checkpoints_no_update",
    "checkpoints_no_delete",
)


@dataclass
class Place:
    kind: str
    location: str
    """The SQLite file's path or the database's URL, as ``Journal.open`` takes it."""
    key_file: Path
    signing_key: Path
    cluster: Cluster | None = None

    def open(self, **kwargs: Any) -> Any:
        return Journal.open(
            self.location, key_file=self.key_file, signing_key=self.signing_key, **kwargs
        )

    def reader(self, **kwargs: Any) -> JournalReader:
        kwargs.setdefault("key_file", self.key_file)
        return JournalReader.open(self.location, **kwargs)

    def view_reads(self) -> ViewReads:
        """Reads as the daemon's view readers make them (``affidavit.api.readers``)."""
        return ViewReads(self)

    def env(self) -> dict[str, str]:
        """What tests/journal/child.py needs to open this journal in another process."""
        return {
            **os.environ,
            "CHILD_KEY_FILE": str(self.key_file),
            "CHILD_SIGNING_KEY": str(self.signing_key),
        }

    # -- the rows as stored ---------------------------------------------------------------------

    def rows(self, statement: str) -> list[tuple[Any, ...]]:
        """Run a read as the database's owner."""
        if self.cluster is None:
            conn = sqlite3.connect(self.location)
            try:
                return list(conn.execute(statement))
            finally:
                conn.close()
        return self.cluster.sql(statement, self.location.rsplit("/", 1)[1])

    def tamper(self, *statements: str) -> None:
        """Change stored rows as someone who can write the database directly, past its
        append-only triggers (SQLite: dropped; PostgreSQL: the superuser's session with
        ``session_replication_role = replica``)."""
        if self.cluster is None:
            conn = sqlite3.connect(self.location, isolation_level=None)
            try:
                for trigger in _SQLITE_TRIGGERS:
                    conn.execute(f"DROP TRIGGER IF EXISTS {trigger}")
                for s in statements:
                    conn.execute(s)
            finally:
                conn.close()
            return
        import psycopg

        with psycopg.connect(self.location, autocommit=True) as conn:
            conn.execute("SET session_replication_role = replica")
            for s in statements:
                conn.execute(s)  # type: ignore[arg-type]

    def blob(self, data: bytes) -> str:
        """A bytes literal in this backend's SQL."""
        return f"X'{data.hex()}'" if self.cluster is None else f"'\\x{data.hex()}'::bytea"

    def write(self, statement: str) -> None:
        """Run a write as the owner would, triggers and all (it must be refused)."""
        if self.cluster is None:
            conn = sqlite3.connect(self.location, isolation_level=None)
            try:
                conn.execute(statement)
            finally:
                conn.close()
            return
        self.cluster.sql(statement, self.location.rsplit("/", 1)[1])


@pytest.fixture(params=BACKENDS)
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    keys = (tmp_path / "journal.key", tmp_path / "journal.signing.key")
    if request.param == "sqlite":
        yield Place("sqlite", str(tmp_path / "j.db"), *keys)
        return
    cluster: Cluster = request.getfixturevalue("pg")
    yield Place("postgresql", cluster.database(), *keys, cluster=cluster)


def storage_fault(place: Place) -> BaseException:
    """The backend's own storage fault (not a lost connection), for ``before_commit`` hooks."""
    if place.cluster is None:
        return sqlite3.OperationalError("disk I/O error")
    import psycopg.errors

    return psycopg.errors.DiskFull("could not extend file: No space left on device")


class ViewReads:
    """Views read as the daemon reads them (``affidavit.api.readers.ReaderPool``): one reader
    taken again for each read, reset after a clean one, closed after a refusal and another
    opened for the next.  Each read's answer is its JSON text, or ``("JournalError", message)``.
    (A reader opened for every read -- a PostgreSQL connection each -- made the summary's
    random walks the suite's two slowest tests, 190 s and 140 s of a CI run.)"""

    def __init__(self, place: Place) -> None:
        self.place = place
        self.reader: JournalReader | None = None

    def __call__(self, read: Callable[[JournalReader], Any]) -> Any:
        if self.reader is None:
            self.reader = self.place.reader()
        try:
            answer = json.dumps(read(self.reader))
        except JournalError as exc:
            self.close()
            return ("JournalError", str(exc))
        self.reader.reset()
        return answer

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
            self.reader = None

    def __enter__(self) -> ViewReads:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
