"""SQLite schema 3: ``invocations`` indexes each invocation's first event, kept by a trigger, so
the actions view streams its rows in order without sorting every row (issue 15).  The view
uses it only when it matches the events exactly; a journal from before schema 3 reads as before
and gains the index when a writer opens it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import trio

from affidavit.journal import Journal, JournalReader
from affidavit.journal.sqlite import _EXTEND_CHAIN_BEFORE, SCHEMA_VERSION, SqliteTables
from affidavit.statemachine import Event

from .helpers import Ticking, append_interleaved, happy, interrupted


def _write(path: Path, runs: list[list[Event]]) -> None:
    """The runs' events interleaved, as concurrent calls write them."""

    async def fill() -> None:
        async with Journal.open(path, clock=Ticking()) as j:
            await append_interleaved(j, runs)

    trio.run(fill)


def _sql(path: Path, *statements: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        return [row for stmt in statements for row in conn.execute(stmt).fetchall()]
    finally:
        conn.close()


def _indexed(r: JournalReader) -> bool:
    tables = r.tables
    assert isinstance(tables, SqliteTables)
    return tables._first_events_indexed()


def test_the_trigger_indexes_each_invocations_first_event(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    _write(db, [happy("a"), interrupted("b"), happy("c")])
    _write(db, [interrupted("a2"), happy("b2")])
    first = _sql(
        db,
        "SELECT invocation_id, min(seq) FROM events GROUP BY invocation_id ORDER BY 2",
    )
    assert _sql(db, "SELECT invocation_id, first_seq FROM invocations ORDER BY 2") == first
    assert [iid for iid, _ in first] == ["a", "b", "c", "a2", "b2"]
    assert _sql(db, "SELECT value FROM meta WHERE name = 'schema'") == [(str(SCHEMA_VERSION),)]
    plan = " ".join(
        str(row[3])
        for row in _sql(db, "EXPLAIN QUERY PLAN " + SqliteTables.SQL["grouped_by_first"])
    )
    assert "TEMP B-TREE" not in plan and "events_invocation" in plan  # streamed, not sorted
    with JournalReader.open(db) as r:
        assert _indexed(r)
        listed = r.list_actions(now=5.0)
        assert list(r.iter_actions(now=5.0)) == listed
        assert [x.invocation_id for x in listed] == ["a", "b", "c", "a2", "b2"]


def test_a_journal_from_before_schema_3_reads_then_gains_the_index(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    _write(db, [happy("a")[:4], interrupted("b"), happy("c")])
    # As schema 2 left it: no index, the chain's trigger of then (which filled none).
    _sql(
        db,
        "DROP TRIGGER events_extend_chain",
        _EXTEND_CHAIN_BEFORE,
        "DROP TABLE invocations",
        "UPDATE meta SET value = '2' WHERE name = 'schema'",
    )
    with JournalReader.open(db) as r:  # read-only: the view sorts, as schema 2 did
        assert not _indexed(r)
        assert [x.invocation_id for x in r.iter_actions()] == ["a", "b", "c"]
    _write(db, [happy("d"), happy("a")[4:]])  # a writer upgrades it, then appends
    assert _sql(db, "SELECT value FROM meta WHERE name = 'schema'") == [(str(SCHEMA_VERSION),)]
    assert _sql(db, "SELECT invocation_id FROM invocations ORDER BY first_seq") == [
        ("a",),
        ("b",),
        ("c",),
        ("d",),
    ]
    with JournalReader.open(db) as r:
        assert r.verify().ok
        assert _indexed(r)
        listed = r.list_actions(now=5.0)
        assert list(r.iter_actions(now=5.0)) == listed
        assert [x.invocation_id for x in listed] == ["a", "b", "c", "d"]


def test_an_index_that_does_not_match_the_events_is_not_used(tmp_path: Path) -> None:
    """The index is not covered by the chain: edited, the view reads the events as before
    (same records, same order), never the index's idea of them."""
    db = tmp_path / "j.db"
    _write(db, [happy("a"), interrupted("b"), happy("c")])
    with JournalReader.open(db) as r:
        want = r.list_actions(now=5.0)
    edits = [
        "DELETE FROM invocations WHERE invocation_id = 'b'",  # an invocation hidden
        "UPDATE invocations SET first_seq = first_seq + 1000 WHERE invocation_id = 'a'",
        "INSERT INTO invocations SELECT max(seq) + 1, 'a' FROM events",  # a second 'a'
        "UPDATE invocations SET invocation_id = 'zz' WHERE invocation_id = 'c'",
        # At a later event of its own invocation (the count kept, each id named once).
        "UPDATE invocations SET first_seq = (SELECT max(seq) FROM events WHERE invocation_id "
        "= 'a') WHERE invocation_id = 'a'",
        # Two invocations' rows swapped: each at a first event, of the other invocation.
        "UPDATE invocations SET invocation_id = CASE invocation_id WHEN 'a' THEN 'b' WHEN 'b' "
        "THEN 'a' ELSE invocation_id END",
        # An invocation named twice and another left out: the count kept.
        "UPDATE invocations SET invocation_id = 'a' WHERE invocation_id = 'c'",
        # The table rebuilt without its key, then the first row twice and 'c' left out: each
        # row at a first event, the count kept -- only the key ruled out a repeat (review).
        (
            "DROP TRIGGER events_extend_chain",  # (it names the table)
            "CREATE TABLE inv2 (first_seq INTEGER, invocation_id TEXT)",
            "INSERT INTO inv2 SELECT first_seq, invocation_id FROM invocations",
            "DROP TABLE invocations",
            "ALTER TABLE inv2 RENAME TO invocations",
            "UPDATE invocations SET first_seq = (SELECT min(first_seq) FROM invocations), "
            "invocation_id = (SELECT invocation_id FROM invocations ORDER BY first_seq LIMIT 1) "
            "WHERE invocation_id = 'c'",
        ),
        # Rebuilt keyed as before but not as the rowid, which admits a NULL key: c's row made
        # (NULL, 'ghost') -- an id with no events, whose min(seq) IS NULL (review).
        (
            "DROP TRIGGER events_extend_chain",  # (it names the table)
            "CREATE TABLE inv2 (first_seq INT PRIMARY KEY, invocation_id TEXT)",
            "INSERT INTO inv2 SELECT first_seq, invocation_id FROM invocations",
            "DROP TABLE invocations",
            "ALTER TABLE inv2 RENAME TO invocations",
            "UPDATE invocations SET first_seq = NULL, invocation_id = 'ghost' "
            "WHERE invocation_id = 'c'",
        ),
    ]
    for n, edit in enumerate(edits):
        copy = tmp_path / f"edited{n}.db"
        copy.write_bytes(db.read_bytes())
        _sql(copy, *((edit,) if isinstance(edit, str) else edit))
        with JournalReader.open(copy) as r:
            assert not _indexed(r), edit
            assert list(r.iter_actions(now=5.0)) == want, edit


def test_spans_cut_the_view_at_invocations_through_one_head(tmp_path: Path) -> None:
    """``action_spans``: the view cut in runs of whole invocations, all read through the head
    seq when they were cut -- what was appended since is in none of them."""
    db = tmp_path / "j.db"
    _write(db, [happy(f"i{n}")[:4] for n in range(6)])
    with JournalReader.open(db) as r:
        whole = r.list_actions(now=5.0)
        assert r.action_spans(2, min_events=10_000) is None  # too small to be worth a process
        spans = r.action_spans(3, min_events=1)
        assert spans is not None and len(spans) == 3
        head = r.head()[0]
        assert spans[0][0] == 0 and spans[-1][1] == head + 1
        assert all(s[2] == head for s in spans)
    _write(db, [happy("i0")[4:], happy("late")])  # after the cut
    with JournalReader.open(db) as r:
        parts = [list(r.iter_actions(now=5.0, span=s)) for s in spans]
        assert [len(p) for p in parts] == [2, 2, 2]
        assert [rec for part in parts for rec in part] == whole
        assert len(r.list_actions()) == 7
        with pytest.raises(ValueError, match="session"):
            next(r.iter_actions(session="sess-1", span=spans[0]))
    _sql(db, "DELETE FROM invocations WHERE invocation_id = 'i3'")
    with JournalReader.open(db) as r:
        assert r.action_spans(2, min_events=1) is None  # an index that does not match: no cut
