"""A page of the newest actions is read alone (``JournalReader.newest_actions``), on every
backend: the rows of the records it shows and a count in the database -- not O(journal), as
``Newest(limit).take(iter_actions())`` was (the daemon's ``/v1/actions``, MCP ``list_actions``).

It must be that page exactly: the same records (each folded from all its events), the same
``total`` -- on random journals, with and without a session filter, and with rows someone
altered, whose records still read as altered (a ``JournalError``) whenever they are shown."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from affidavit.journal import JournalError, views
from affidavit.journal.rows import FOLD_COLUMNS, AlteredRow
from affidavit.statemachine import Event
from affidavit.statemachine import EventKind as E
from affidavit.views import Newest

from ..helpers import Ticking, accepted, happy, interrupted, until_dispatch
from .conftest import Place

SESSIONS = ("alice", "bob", None)


def _refused(iid: str, session: str | None) -> list[Event]:
    return [
        accepted(iid, session),
        Event(E.PREFLIGHT_FAILED, iid, {"code": "INVALID_TARGET", "field": "target"}),
    ]


RUNS = (happy, interrupted, until_dispatch, _refused)


def _fresh(place: Place, where: Path) -> Place:
    """A new, empty journal on ``place``'s backend (one per example)."""
    keys = (where / "journal.key", where / "journal.signing.key")
    if place.cluster is None:
        return Place("sqlite", str(where / "j.db"), *keys)
    return Place("postgresql", place.cluster.database(), *keys, cluster=place.cluster)


def _write(place: Place, runs: list[list[Event]], order: list[int]) -> None:
    """The runs' events, interleaved as ``order`` picks the next run to advance."""

    async def fill() -> None:
        async with place.open(clock=Ticking()) as j:
            left = [list(r) for r in runs]
            for pick in order:
                live = [r for r in left if r]
                if not live:
                    break
                await j.append(live[pick % len(live)].pop(0))
            for run in left:
                for ev in run:
                    await j.append(ev)

    trio.run(fill)


def _old(place: Place, limit: int, session: str | None) -> tuple[list[Any], int] | JournalError:
    with place.reader() as r:
        try:
            page = Newest(limit).take(r.iter_actions(session=session, now=5.0))
        except JournalError as exc:
            return exc
        return page.records, page.total


def _new(place: Place, limit: int, session: str | None) -> tuple[list[Any], int] | JournalError:
    with place.reader() as r:
        try:
            return r.newest_actions(limit, session, now=5.0)
        except JournalError as exc:
            return exc


class _Rows:
    """``Tables`` of the given rows alone, for ``views.fold_each``."""

    def __init__(self, rows: list[Any]) -> None:
        self.rows = rows

    def grouped_events(self, session: str | None = None) -> Iterator[Any]:
        return iter(self.rows)


def _reference(place: Place, limit: int, session: str | None) -> tuple[list[Any], int]:
    """The page as the view defines it, from the rows as stored: the invocations in order of
    their first event (of ``session``'s events, if given), the last ``limit`` of them each
    folded alone from those rows (None: its rows do not fold -- altered), and their count."""
    runs: dict[Any, list[Any]] = {}
    for *row, sess in place.rows(f"SELECT {FOLD_COLUMNS}, session_id FROM events ORDER BY seq"):
        if session is None or sess == session:
            runs.setdefault(row[2], []).append(tuple(row))
    shown = list(runs)[max(0, len(runs) - limit) :] if limit else []
    records = []
    for iid in shown:
        try:
            records.append([rec for rec, _, _ in views.fold_each(_Rows(runs[iid]), None, 5.0)])
        except AlteredRow:
            records.append(None)
    return records, len(runs)


ALTERATIONS = st.sampled_from(("alice", "bob", "no session", "iid", "attrs", "kind"))
"""What ``_alter`` does to a row: its session column (a record's rows then in two sessions:
the session's view folds only its own), its invocation id, its attrs or its kind."""


@st.composite
def journals(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(0, 9))
    runs = [
        draw(st.sampled_from(RUNS))(f"act-{i}", draw(st.sampled_from(SESSIONS))) for i in range(n)
    ]
    order = draw(st.lists(st.integers(0, 8), max_size=40))
    events = sum(map(len, runs))
    altered = (
        draw(st.lists(st.tuples(st.integers(1, events), ALTERATIONS), max_size=4)) if events else []
    )
    return {
        "runs": runs,
        "order": order,
        "altered": altered,
        "limit": draw(st.integers(0, n + 1)),
        "session": draw(st.sampled_from(SESSIONS)),
    }


def _alter(place: Place, seq: int, how: str) -> None:
    value = {
        "alice": "session_id = 'alice'",
        "bob": "session_id = 'bob'",
        "no session": "session_id = NULL",
        "iid": "invocation_id = 'act-0'",
        "attrs": "attrs = '[1]'",
        "kind": "kind = 'NOT_A_KIND'",
    }[how]
    place.tamper(f"UPDATE events SET {value} WHERE seq = {seq}")


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(journal=journals())
def test_the_newest_page_is_the_streamed_views_tail_on_random_journals(
    place: Place, journal: dict[str, Any]
) -> None:
    with tempfile.TemporaryDirectory() as d:
        p = _fresh(place, Path(d))
        _write(p, journal["runs"], journal["order"])
        altered: set[str] = set()  # the invocations of the rows an alteration changed
        for seq, how in journal["altered"]:
            before = p.rows(f"SELECT * FROM events WHERE seq = {seq}")
            _alter(p, seq, how)
            after = p.rows(f"SELECT * FROM events WHERE seq = {seq}")
            if after != before:  # not a session set to the one it had
                altered |= {str(row[2]) for row in before + after}
        limit, session = journal["limit"], journal["session"]
        old, new = _old(p, limit, session), _new(p, limit, session)
        folded, total = _reference(p, limit, session)
        if not isinstance(old, JournalError):
            assert new == old  # the same records, folded the same, and the same total
            assert ([[r] for r in old[0]], old[1]) == (folded, total)  # and so the oracle
            return
        # The view reads an altered row (somewhere): the page reads each of its own records'
        # rows as the view does, so it fails exactly when one of them does not fold.
        if None in folded:
            assert isinstance(new, JournalError), "a record with an altered row shown"
        else:
            assert new == ([r for (r,) in folded], total)


def _bulk(place: Place, invocations: int) -> None:
    """``invocations`` of 5-8 events each, in four sessions, four at a time interleaved."""

    async def fill() -> None:
        async with place.open(clock=Ticking()) as j:
            for base in range(0, invocations, 4):  # none: the journal made, empty
                runs = [
                    (happy if i % 3 else interrupted)(f"inv-{i:05d}", f"s{i % 4}")
                    for i in range(base, min(base + 4, invocations))
                ]
                for k in range(max(map(len, runs))):
                    for run in runs:
                        if k < len(run):
                            await j.append(run[k])

    trio.run(fill)


def _counting(tables: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the rows the tables' cursors hand back to Python (the views read through one)."""
    read = [0]
    cls = type(tables)
    cursor = cls.cursor

    def counted(self: Any, name: str, params: Any = ()) -> Iterator[Any]:
        for row in cursor(self, name, params):
            read[0] += 1
            yield row

    monkeypatch.setattr(cls, "cursor", counted)
    return read


def test_a_page_reads_the_rows_it_shows_not_the_journal(
    place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows read: the old path hands Python every event and folds it; the page, the rows of
    its own records.  Rows touched in the database: the walk back from the head stops at the
    page's oldest first event (PostgreSQL: EXPLAIN ANALYZE's actual rows; SQLite: the plan
    walks ``seq`` backwards under the LIMIT, with no sort of the table)."""
    _bulk(place, 600)
    with place.reader() as r:
        events = int(place.rows("SELECT count(*) FROM events")[0][0])
        shown = {f"inv-{i:05d}" for i in range(595, 600)}
        own = sum(
            int(n)
            for (n,) in place.rows(
                "SELECT count(*) FROM events WHERE invocation_id IN ('"
                + "','".join(sorted(shown))
                + "')"
            )
        )
        read = _counting(r.tables, monkeypatch)
        records, total = r.newest_actions(5, now=5.0)
        assert {x.invocation_id for x in records} == shown and total == 600
        assert read[0] == own and own < events / 50
        # with a session: that session's rows of its newest invocations
        read[0] = 0
        records, total = r.newest_actions(3, "s1", now=5.0)
        assert [x.invocation_id for x in records] == ["inv-00589", "inv-00593", "inv-00597"]
        assert total == 150 and read[0] < events / 50
        sql = r.tables.SQL
        if place.cluster is None:
            conn = r.tables.conn
            plan = [
                str(row[3])
                for row in conn.execute("EXPLAIN QUERY PLAN " + sql["newest_grouped"], (5,))
            ]
            # the page: a walk of events' rowid (``SCAN f``, in ``seq`` order: no sort), each
            # row's first event found in ``events_invocation``; the count, over that index
            assert "SCAN f" in plan and plan.count("USE TEMP B-TREE FOR ORDER BY") == 1
            assert "SCAN events USING COVERING INDEX events_invocation" in plan
            assert not [
                p
                for p in plan
                if p.startswith("SCAN")
                and p
                not in ("SCAN f", "SCAN page", "SCAN events USING COVERING INDEX events_invocation")
            ]
            # rows touched, by the work SQLite does: the statement's VM steps past the count's
            # are fewer than the journal has events (any walk of the table takes several each)
            assert (
                _vm_steps(conn, sql["newest_grouped"], (5,))
                - _vm_steps(conn, sql["invocation_count"], ())
                < events
            )
            return
        db = place.location.rsplit("/", 1)[1]
        statement = sql["newest_grouped"].replace("%s", "5")
        (plan_json,) = place.cluster.sql(f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", db)[0]
        nodes = list(
            _nodes(
                plan_json[0]["Plan"]
                if isinstance(plan_json, list)
                else json.loads(plan_json)[0]["Plan"]
            )
        )
        walk = [n for n in nodes if n.get("Alias") == "f"]
        assert walk and all(n["Node Type"] == "Index Scan" for n in walk)
        assert walk[0]["Scan Direction"] == "Backward"
        # rows the walk read: its page's first events and what it passed over (the interleaved
        # tail of older invocations), none before the page's oldest first event
        touched = walk[0]["Actual Rows"] + walk[0]["Rows Removed by Filter"]
        assert walk[0]["Actual Rows"] == 5 and touched <= 2 * own and touched < events / 50
        # the one pass over the table (or its index) is the count's, which decodes nothing
        scans = [n for n in nodes if "Scan" in n["Node Type"] and n.get("Alias") == "events"]
        count = [n for n in nodes if n.get("Subplan Name", "").startswith("InitPlan 1")]
        assert len(scans) == 1 and count and scans[0] in _nodes(count[0])


def _vm_steps(conn: Any, statement: str, params: Any) -> int:
    """SQLite virtual machine instructions run for ``statement`` (the progress handler)."""
    steps = [0]

    def tick() -> int:
        steps[0] += 1
        return 0

    conn.set_progress_handler(tick, 1)
    try:
        conn.execute(statement, params).fetchall()
    finally:
        conn.set_progress_handler(None, 1)
    return steps[0]


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


@pytest.mark.parametrize("limit", [0, 1, 3])
def test_an_empty_journal_and_a_page_of_none(place: Place, limit: int) -> None:
    _bulk(place, 0)
    with place.reader() as r:
        assert r.newest_actions(limit) == ([], 0)
    _bulk(place, 2)
    with place.reader() as r:
        records, total = r.newest_actions(limit, now=5.0)
        assert (
            total == 2
            and [x.invocation_id for x in records]
            == ["inv-00000", "inv-00001"][2 - min(limit, 2) :]
        )
        assert r.newest_actions(limit, "nobody") == ([], 0)
