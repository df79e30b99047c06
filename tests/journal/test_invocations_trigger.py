"""SQLite schema 8: ``events_extend_chain`` also fills ``invocations`` -- one row per invocation,
at its first event, whatever the rows' interleaving within or across ``executemany`` calls --
and a writer opening a schema-7 journal replaces its two insert triggers by this one, with the
same answers after (issue 15)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from affidavit.journal import JournalError, JournalReader, sqlite, sqlite_schema
from affidavit.journal.chain import GENESIS
from affidavit.journal.sqlite import SCHEMA, SCHEMA_VERSION, SqliteTables, _split_sql
from affidavit.journal.sqlite_schema import (
    _EXTEND_CHAIN_7,
    _FIRST_OF_INVOCATION_7,
    EXTEND_CHAIN,
    _stored,
)

from .helpers import happy, interrupted
from .test_first_events import _indexed, _sql, _write

_INSERT = f"INSERT INTO events VALUES ({','.join('?' * 13)})"
_TRUTH = "SELECT min(seq), invocation_id FROM events GROUP BY invocation_id ORDER BY 1"
_INDEX = "SELECT first_seq, invocation_id FROM invocations ORDER BY 1"


class _Chain:
    """An in-memory schema-8 journal's events table, appended to as the writer does: rows
    chained, handed to ``executemany`` in batches."""

    def __init__(self) -> None:
        self.conn = sqlite3.connect(":memory:", isolation_level=None)
        for stmt in _split_sql(SCHEMA):
            self.conn.execute(stmt)
        self.seq, self.prev = 0, GENESIS

    def append(self, batch: list[tuple[str, str]]) -> None:
        """One ``executemany`` of (invocation, kind) rows, in one transaction."""
        rows = []
        for iid, kind in batch:
            self.seq += 1
            h = f"{self.seq:064x}"
            rows.append((self.seq, 1.7e9, iid, None, kind, "broker", None, None, "{}", None, None,
                         self.prev, h))  # fmt: skip
            self.prev = h
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.executemany(_INSERT, rows)
        self.conn.execute("COMMIT")

    def rows(self, sql: str) -> list[tuple[object, ...]]:
        return self.conn.execute(sql).fetchall()


def test_one_executemany_of_interleaved_invocations_indexes_each_first_event() -> None:
    chain = _Chain()
    accepted, validated = "ACTION_ACCEPTED", "PREFLIGHT_VALIDATED"
    chain.append([("a", accepted), ("b", accepted), ("a", validated),
                  ("c", accepted), ("b", validated), ("c", "SETUP_FAILED")])  # fmt: skip
    assert chain.rows(_INDEX) == [(1, "a"), (2, "b"), (4, "c")]
    # Later rows of existing invocations, in later transactions, add nothing -- an
    # ACTION_ACCEPTED among them included (a claim the probe refuses); a new one is indexed.
    chain.append([("b", "CREDENTIAL_AUTHORIZED"), ("d", "ACTION_ACCEPTED")])
    chain.append([("a", "ACTION_ACCEPTED"), ("d", "PREFLIGHT_VALIDATED")])
    assert chain.rows(_INDEX) == [(1, "a"), (2, "b"), (4, "c"), (8, "d")]
    assert chain.rows(_INDEX) == chain.rows(_TRUTH)


def test_a_refused_row_leaves_no_index_row() -> None:
    chain = _Chain()
    chain.append([("a", "ACTION_ACCEPTED")])
    with pytest.raises(sqlite3.IntegrityError, match="extend the hash chain"):
        chain.conn.execute(_INSERT, (3, 1.7e9, "b", None, "ACTION_ACCEPTED", "broker", None, None,
                                     "{}", None, None, chain.prev, "f" * 64))  # fmt: skip
    with pytest.raises(sqlite3.IntegrityError, match="NOT NULL"):  # after the trigger's insert
        chain.conn.execute(_INSERT, (2, 1.7e9, "b", None, "ACTION_ACCEPTED", None, None, None,
                                     "{}", None, None, chain.prev, "f" * 64))  # fmt: skip
    assert chain.rows(_INDEX) == [(1, "a")]


_KINDS = ("PREFLIGHT_VALIDATED", "DISPATCH_STARTED", "REQUEST_SENT", "ACTION_ACCEPTED")


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_index_is_each_invocations_first_event_whatever_the_interleaving(
    data: st.DataObject,
) -> None:
    """Random invocations (each opened by ACTION_ACCEPTED, as the writer's projection requires,
    then any kinds -- a repeated ACTION_ACCEPTED too), interleaved at random and cut into
    ``executemany`` batches at random: ``invocations`` is exactly ``min(seq)`` per invocation."""
    lengths = data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=8), label="lengths")
    runs = [
        [(f"i{n}", "ACTION_ACCEPTED")]
        + [(f"i{n}", data.draw(st.sampled_from(_KINDS))) for _ in range(length - 1)]
        for n, length in enumerate(lengths)
    ]
    order = data.draw(
        st.permutations([n for n, run in enumerate(runs) for _ in run]), label="order"
    )
    rows = [runs[n].pop(0) for n in order]
    chain = _Chain()
    while rows:
        size = data.draw(st.integers(1, len(rows)), label="batch")
        chain.append(rows[:size])
        rows = rows[size:]
    assert chain.rows(_INDEX) == chain.rows(_TRUTH)


def test_a_first_event_of_another_kind_is_not_indexed_and_the_view_sorts(tmp_path: Path) -> None:
    """Only someone writing the file makes one: the table no longer matches the events, so the
    view reads them sorted instead (the rows the index would have streamed)."""
    db = tmp_path / "j.db"
    _write(db, [happy("a"), interrupted("b")])
    with JournalReader.open(db) as r:
        assert _indexed(r)
    conn = sqlite3.connect(db, isolation_level=None)
    seq, prev = conn.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone()
    conn.execute(_INSERT, (seq + 1, 1.8e9, "z", None, "REQUEST_SENT", "transport_observed", None,
                           None, "{}", None, None, prev, "e" * 64))  # fmt: skip
    conn.close()
    assert _sql(db, _INDEX) == _sql(db, _TRUTH)[:-1]
    with JournalReader.open(db) as r:
        assert not _indexed(r)
        tables = r.tables
        assert isinstance(tables, SqliteTables)
        got = list(tables.grouped_events())
        assert got == list(super(SqliteTables, tables).grouped_events())
        assert got[-1][2] == "z"


def _triggers(path: Path) -> dict[str, str]:
    sql = "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'events'"
    return {str(name): str(text) for name, text in _sql(path, sql)}


def _as_schema_7(path: Path) -> None:
    """The file as a schema-7 broker leaves it: its two insert triggers, schema 7 in meta."""
    _sql(
        path,
        "DROP TRIGGER events_extend_chain",
        _EXTEND_CHAIN_7,
        _FIRST_OF_INVOCATION_7,
        "UPDATE meta SET value = '7' WHERE name = 'schema'",
    )


def _if_not_exists(stored: str) -> str:
    return stored.replace("CREATE TRIGGER", "CREATE TRIGGER IF NOT EXISTS", 1) + ";"


_SCHEMA_7 = SCHEMA.replace(
    EXTEND_CHAIN, _if_not_exists(_EXTEND_CHAIN_7) + "\n" + _if_not_exists(_FIRST_OF_INVOCATION_7)
)
"""The DDL of schema 7: this one with its two insert triggers (nothing else changed)."""


def test_a_schema_7_journal_is_upgraded_on_open_with_the_same_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A journal a schema-7 broker made and wrote (its DDL, its triggers filling
    ``invocations``), then opened by this one, answers as one this broker wrote throughout."""
    old, new = tmp_path / "old.db", tmp_path / "new.db"
    before = [happy("a")[:3], interrupted("b"), happy("c")]
    after = [happy("d"), happy("a")[3:]]
    assert _SCHEMA_7 != SCHEMA
    with monkeypatch.context() as m:  # a schema-7 broker
        m.setattr(sqlite_schema, "SCHEMA_VERSION", 7)
        m.setattr(sqlite, "SCHEMA_VERSION", 7)
        m.setattr(sqlite, "SCHEMA", _SCHEMA_7)
        m.setattr(sqlite, "_replace_chain_trigger", lambda conn: None)
        _write(old, before)
    assert _triggers(old)["events_extend_chain"] == _EXTEND_CHAIN_7
    assert _triggers(old)["events_first_of_invocation"] == _FIRST_OF_INVOCATION_7
    assert _sql(old, "SELECT value FROM meta WHERE name = 'schema'") == [("7",)]
    assert _sql(old, _INDEX) == _sql(old, _TRUTH)
    with JournalReader.open(old) as r:  # a read changes nothing
        assert _indexed(r)
    assert "events_first_of_invocation" in _triggers(old)
    _write(old, after)  # a writer upgrades it, then appends
    _write(new, before)
    _write(new, after)
    assert _triggers(old) == _triggers(new)
    assert _triggers(old)["events_extend_chain"] == _stored(EXTEND_CHAIN)
    assert _sql(old, "SELECT value FROM meta WHERE name = 'schema'") == [(str(SCHEMA_VERSION),)]
    rows = "SELECT seq, at, invocation_id, kind, attrs FROM events ORDER BY seq"
    assert _sql(old, rows) == _sql(new, rows)
    assert _sql(old, _INDEX) == _sql(new, _INDEX) == _sql(new, _TRUTH)
    assert [iid for _, iid in _sql(old, _INDEX)] == ["a", "b", "c", "d"]
    answers = []
    for path in (old, new):
        with JournalReader.open(path) as r:
            assert r.verify().ok
            assert _indexed(r)
            listed = r.list_actions(now=5.0)
            assert list(r.iter_actions(now=5.0)) == listed
            answers.append(listed)
    assert answers[0] == answers[1]
    assert [x.invocation_id for x in answers[0]] == ["a", "b", "c", "d"]


def test_a_foreign_first_of_invocation_trigger_keeps_the_chain_trigger_as_it_is(
    tmp_path: Path,
) -> None:
    """A trigger someone else defined might insert into ``invocations`` too: beside
    ``EXTEND_CHAIN`` each first event would be inserted twice and the key would refuse the
    append, so neither trigger is touched."""
    db = tmp_path / "j.db"
    _write(db, [happy("a")[:2]])
    _as_schema_7(db)
    other = _FIRST_OF_INVOCATION_7.replace("seq < NEW.seq", "seq <= NEW.seq - 1")
    _sql(db, "DROP TRIGGER events_first_of_invocation", other)
    _write(db, [happy("b")[:2]])
    assert _triggers(db)["events_extend_chain"] == _EXTEND_CHAIN_7
    assert _triggers(db)["events_first_of_invocation"] == other
    assert _sql(db, _INDEX) == _sql(db, _TRUTH)


def test_a_schema_7_broker_refuses_a_schema_8_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It would make its AFTER trigger again beside ``EXTEND_CHAIN`` (``CREATE TRIGGER IF NOT
    EXISTS events_first_of_invocation``): each first event inserted twice, every append
    refused."""
    db = tmp_path / "j.db"
    _write(db, [happy("a")[:2]])
    assert SCHEMA_VERSION >= 8
    monkeypatch.setattr(sqlite_schema, "SCHEMA_VERSION", 7)
    newer = rf"newer affidavit \(schema {SCHEMA_VERSION}; this one knows schema 7"
    with pytest.raises(JournalError, match=newer):
        JournalReader.open(db)
    with pytest.raises(JournalError, match="newer affidavit"):
        _write(db, [happy("b")[:2]])
