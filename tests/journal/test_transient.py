"""``Backend.transient``: which database errors on a live connection are the database declining
a read this once (``ReadFailed``: the same read may succeed later) and which say something about
the rows (a plain ``JournalError``).  A caller that gives up on what it read -- the approvals
dispatcher dropping an approved request as "not readable" -- must do so only for the latter."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import pytest

from affidavit.journal import JournalError, JournalReader, ReadFailed
from affidavit.journal.postgres import PostgresBackend
from affidavit.journal.sqlite import SqliteBackend


def _busy(path: Path) -> sqlite3.OperationalError:
    """A real SQLITE_BUSY: another connection holds the write lock past the busy timeout."""
    holder = sqlite3.connect(path, isolation_level=None)
    other = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        holder.execute("CREATE TABLE IF NOT EXISTS t (x)")
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(sqlite3.OperationalError) as caught:
            other.execute("BEGIN IMMEDIATE")
        return caught.value
    finally:
        holder.close()
        other.close()


def _undecodable(path: Path) -> sqlite3.OperationalError:
    """A text column holding bytes that are not UTF-8: a fact about the row."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("CREATE TABLE u (x TEXT)")
        conn.execute("INSERT INTO u VALUES (CAST(x'ff' AS TEXT))")
        with pytest.raises(sqlite3.OperationalError) as caught:
            conn.execute("SELECT x FROM u").fetchall()
        return caught.value
    finally:
        conn.close()


def test_sqlite_busy_is_transient_and_an_undecodable_row_is_not(tmp_path: Path) -> None:
    backend = SqliteBackend(tmp_path / "j.db")
    assert backend.transient(_busy(tmp_path / "busy.db"))
    assert not backend.transient(_undecodable(tmp_path / "bad.db"))
    assert not backend.transient(sqlite3.DatabaseError("file is not a database"))


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (psycopg.errors.QueryCanceled("canceling statement due to statement timeout"), True),
        (psycopg.errors.LockNotAvailable("could not obtain lock"), True),
        (psycopg.errors.SerializationFailure("could not serialize access"), True),
        (psycopg.errors.TooManyConnections("too many clients already"), True),
        (psycopg.errors.UndefinedTable('relation "events" does not exist'), False),
        (psycopg.errors.InsufficientPrivilege("permission denied for table events"), False),
        (psycopg.errors.CharacterNotInRepertoire("invalid byte sequence"), False),
        (psycopg.OperationalError("no SQLSTATE"), False),
    ],
)
def test_postgres_transient_by_sqlstate(error: psycopg.Error, transient: bool) -> None:
    backend = PostgresBackend("postgresql://broker@db.example/affidavit")
    assert backend.transient(error) is transient


def test_a_declined_read_is_read_failed_and_an_altered_one_is_not(tmp_path: Path) -> None:
    """Through the reader: the same database error class, told apart by what it says."""
    reader = JournalReader.__new__(JournalReader)
    reader.backend = SqliteBackend(tmp_path / "j.db")
    reader.where = str(tmp_path / "j.db")
    declined = reader._error("the events of invocation act_1", _busy(tmp_path / "busy.db"))
    altered = reader._error("the events of invocation act_1", _undecodable(tmp_path / "u.db"))
    assert isinstance(declined, ReadFailed)
    assert isinstance(altered, JournalError) and not isinstance(altered, ReadFailed)
    assert "\\xff" not in str(altered) and "with text" not in str(altered)
