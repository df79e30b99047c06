"""``events_session`` (issue 15): a session's page, its total and its events are read through an
index on ``(session_id, seq, invocation_id)``, in proportion to the session's rows, not the
journal's.  No schema change: an index, which every broker's writes keep and none relies on --
a journal created before it gains it when a writer (PostgreSQL: the tables' owner) opens it,
logged, and answers the same with it as without it."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import pytest
import trio

from affidavit.journal.postgres import PostgresTables
from affidavit.journal.sqlite import SqliteTables

from ..helpers import Ticking, fill_views
from .conftest import Place

NOW = 2e9
SESSIONS = ("alice", "bob", "absent", None)


def _fill(place: Place) -> None:
    async def fill() -> None:
        async with place.open(clock=Ticking()) as j:
            await fill_views(j)

    trio.run(fill)


def _reopen(place: Place) -> None:
    async def reopen() -> None:
        async with place.open(clock=Ticking()):
            pass

    trio.run(reopen)


def _answers(place: Place) -> list[Any]:
    """Every view a session filter or a page total reads, as ``repr``: the bytes to compare."""
    out: list[Any] = []
    with place.reader() as r:
        for session in SESSIONS:
            for limit in (0, 1, 2, 10):
                out.append(repr(r.newest_actions(limit, session=session, now=NOW)))
            out.append(repr(r.list_actions(session=session, now=NOW)))
            out.append(repr(list(r.iter_actions(session=session, now=NOW))))
            out.append(r.tables.invocation_count(session))
        out.append(repr(r.sessions()))
        assert r.verify().ok
    return out


def _has_index(place: Place) -> bool:
    statement = (
        "SELECT name FROM sqlite_master WHERE name = 'events_session'"
        if place.cluster is None
        else "SELECT to_regclass('events_session')::text"
    )
    return [r[0] for r in place.rows(statement)] == ["events_session"]


def _schema(place: Place) -> list[tuple[Any, ...]]:
    return place.rows("SELECT value FROM meta WHERE name = 'schema'")


def test_a_journal_from_before_the_index_gains_it_and_answers_the_same(
    place: Place, caplog: pytest.LogCaptureFixture
) -> None:
    _fill(place)
    assert _has_index(place)
    with_index = _answers(place)
    schema = _schema(place)
    place.tamper("DROP INDEX events_session")  # the journal as a broker from before left it
    assert not _has_index(place)
    assert _answers(place) == with_index  # read without it: the same rows
    with caplog.at_level(logging.INFO, logger="affidavit.journal"):
        _reopen(place)
    assert _has_index(place)
    logged = [r.getMessage() for r in caplog.records if r.name == "affidavit.journal"]
    assert any("building index events_session" in m for m in logged), logged
    assert any("built index events_session in" in m for m in logged), logged
    assert _answers(place) == with_index
    assert _schema(place) == schema  # no schema change: an older broker still opens it


def _sqlite_plan(place: Place, name: str) -> str:
    sql = SqliteTables.SQL[name].replace("LIMIT ?", "LIMIT 10").replace("?", "'alice'")
    return " | ".join(str(r[3]) for r in place.rows("EXPLAIN QUERY PLAN " + sql))


def _pg_plan(place: Place, name: str) -> str:
    sql = PostgresTables.SQL[name].replace("LIMIT %s", "LIMIT 10").replace("%s", "'alice'")
    with psycopg.connect(place.location, autocommit=True) as conn:
        # A table of a few rows is read whole whatever its indexes: ask which index the
        # planner takes when it must take one (without events_session: none on session_id).
        conn.execute("SET enable_seqscan = off")
        return " | ".join(str(r[0]) for r in conn.execute(f"EXPLAIN {sql}").fetchall())


@pytest.mark.parametrize(
    "name", ["newest_session_grouped", "session_invocation_count", "session_events"]
)
def test_the_session_statements_read_through_the_index(place: Place, name: str) -> None:
    _fill(place)
    if place.cluster is None:
        plan = _sqlite_plan(place, name)
        assert "INDEX events_session (session_id=?)" in plan, plan
        if name == "newest_session_grouped":
            # Each walked event's first event of its invocation: through events_invocation,
            # not a scan of the session's range per event walked.
            assert "SEARCH p USING INDEX events_invocation (invocation_id=?)" in plan, plan
    else:
        plan = _pg_plan(place, name)
        assert "events_session" in plan, plan
