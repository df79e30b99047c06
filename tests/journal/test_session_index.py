"""``events_session`` holds only the events of a session (``WHERE session_id IS NOT NULL``): an
event of no session (a CLI, daemon or library call) writes no page of it (issue 15: ~1.9 WAL
frames per commit, ``tests/benchmarks/wal_pages.py``), and every session view reads the same
through it as through the full index a journal made before keeps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from affidavit.journal import Journal, JournalReader
from affidavit.journal.sqlite import SqliteTables
from affidavit.statemachine import EventKind as E

from .helpers import happy, sql

_FULL = "CREATE INDEX events_session ON events (session_id, seq, invocation_id)"
"""The index as journals made before keep it."""


async def _fill(db: Path) -> None:
    """Invocations of two sessions and of none, interleaved."""
    async with Journal.open(db) as j:
        for n in range(6):
            session = (None, "sess-a", "sess-b")[n % 3]
            for event in happy(f"inv-{n}", session):
                await j.append(event, barrier=event.kind is E.DISPATCH_STARTED)


def _views(db: Path) -> list[Any]:
    with JournalReader.open(db) as r:
        seen: list[Any] = [r.sessions()]
        for session in (None, "sess-a", "sess-b", "sess-none"):
            seen.append(list(r.list_actions(session=session, now=1e10)))
            seen.append(list(r.iter_actions(session=session, now=1e10)))
            page, total = r.newest_actions(3, session=session, now=1e10)
            seen.append((list(page), total))
        assert r.verify().ok
    return seen


def _entries(db: Path) -> int:
    """The entries of ``events_session`` (its leaf cells: a one-level index is its root)."""
    rows = sql(db, "SELECT sum(ncell) FROM dbstat WHERE name = 'events_session' AND "
                "pagetype = 'leaf'")  # fmt: skip
    return int(rows[0][0] or 0)


async def test_events_of_no_session_take_no_entry(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    await _fill(db)
    rows = sql(db, "SELECT count(*), count(session_id) FROM events")[0]
    assert rows[0] > rows[1] > 0  # both kinds were written
    assert _entries(db) == rows[1]
    # A session query still goes through the index, as with the full one.
    for name in ("session_events", "session_invocation_count"):
        plan = sql(db, "EXPLAIN QUERY PLAN " + SqliteTables.SQL[name].replace("?", "'sess-a'"))
        assert "INDEX events_session" in " ".join(str(row[3]) for row in plan), plan


async def test_the_views_read_the_same_through_the_full_index(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    await _fill(db)
    partial = _views(db)
    sql(db, "DROP INDEX events_session", _FULL)
    assert _entries(db) == sql(db, "SELECT count(*) FROM events")[0][0]
    assert _views(db) == partial
    # A writer opening a journal with the full index keeps it: its rows and answers are the
    # same, and rebuilding it would read every event at start-up.
    async with Journal.open(db) as j:
        await j.append(happy("inv-late", None)[0])
    assert sql(db, "SELECT sql FROM sqlite_master WHERE name = 'events_session'") == [(_FULL,)]
