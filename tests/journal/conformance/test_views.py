"""The action and session views on every backend: folds of the durable events, never stored
twice (seed: "separate session and action views")."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import trio

from affidavit.journal import views
from affidavit.statemachine import Outcome, Phase

from ..helpers import Ticking, fill_views, happy, interrupted
from .conftest import Place


def _fill(place: Place) -> None:
    async def fill() -> None:
        async with place.open(clock=Ticking()) as j:
            await fill_views(j)

    trio.run(fill)


def test_list_actions_filters(place: Place) -> None:
    _fill(place)
    with place.reader() as r:
        assert [x.invocation_id for x in r.list_actions()] == ["ok-1", "lost-1", "bad-1", "ok-2"]
        assert [x.invocation_id for x in r.list_actions(session="alice")] == ["ok-1", "lost-1"]
        assert [x.invocation_id for x in r.list_actions(outcome=Outcome.UNKNOWN)] == ["lost-1"]
        assert [x.invocation_id for x in r.list_actions(phase="validation")] == ["bad-1"]
        assert [x.invocation_id for x in r.list_actions(outcome="committed")] == ["ok-1", "ok-2"]
        accepted_at = {x.invocation_id: r.events(x.invocation_id)[0].at for x in r.list_actions()}
        since = accepted_at["lost-1"]
        until = accepted_at["bad-1"]
        assert [x.invocation_id for x in r.list_actions(since=since, until=until)] == [
            "lost-1",
            "bad-1",
        ]
        bad = r.list_actions(phase=Phase.VALIDATION)[0]
        assert (bad.code is not None and bad.code.value, bad.field) == ("INVALID_TARGET", "target")


def test_record_and_sessions(place: Place) -> None:
    _fill(place)
    with place.reader() as r:
        rec = r.record("lost-1")
        assert rec is not None and rec.outcome is Outcome.UNKNOWN and rec.session == "alice"
        assert r.record("nope") is None
        sessions = {s["session"]: s for s in r.sessions()}
    assert set(sessions) == {"alice", "bob", None}
    assert sessions["alice"]["actions"] == 2
    assert sessions["alice"]["outcomes"] == {"committed": 1, "unknown": 1}
    assert sessions["bob"]["outcomes"] == {"not_attempted": 1}
    assert sessions["alice"]["first_seen"] < sessions["alice"]["last_seen"]


def _fill_interleaved(place: Place) -> None:
    """Three invocations whose events interleave (as concurrent calls write them), and one
    more after them."""

    async def fill() -> None:
        async with place.open(clock=Ticking()) as j:
            runs = [happy("a", "alice"), interrupted("b", "bob"), happy("c", "alice")]
            for i in range(max(map(len, runs))):
                for run in runs:
                    if i < len(run):
                        await j.append(run[i])
            await fill_views(j)

    trio.run(fill)


def test_iter_actions_is_list_actions_one_record_at_a_time(place: Place) -> None:
    _fill_interleaved(place)
    with place.reader() as r:
        for filters in (
            {},
            {"session": "alice"},
            {"session": "bob"},
            {"outcome": "unknown"},
            {"phase": Phase.VALIDATION},
            {"session": "nobody"},
        ):
            listed = r.list_actions(now=5.0, **filters)  # type: ignore[arg-type]
            assert list(r.iter_actions(now=5.0, **filters)) == listed  # type: ignore[arg-type]
        ids = [x.invocation_id for x in r.list_actions()]
        assert ids == ["a", "b", "c", "ok-1", "lost-1", "bad-1", "ok-2"]


def test_the_streamed_view_yields_an_invocation_before_reading_the_rest(place: Place) -> None:
    """Issue 15: ``affidavit actions`` over millions of events holds one projection at a time.
    The first record comes out once its own rows are read, not after the whole journal."""
    _fill_interleaved(place)
    with place.reader() as r:
        rows = list(r.tables.grouped_events())
        read = 0

        class Counting:
            def grouped_events(self, session: str | None = None) -> Iterator[Any]:
                nonlocal read
                for row in rows:
                    read += 1
                    yield row

        entries = views.fold_each(Counting(), None, 0.0)  # type: ignore[arg-type]
        rec, first_at, last_at = next(entries)
        assert rec.invocation_id == "a"
        a_rows = sum(1 for row in rows if row[2] == "a")
        assert read == a_rows + 1  # its own rows, and the next invocation's first
        assert len(rows) > read
        assert first_at is not None and last_at is not None and first_at < last_at
        rest = [e[0].invocation_id for e in entries]
        assert rest == ["b", "c", "ok-1", "lost-1", "bad-1", "ok-2"]


def test_a_page_of_the_newest_and_the_metrics_stream_in_bounded_memory(place: Place) -> None:
    """The daemon's ``/v1/actions`` page and ``/v1/metrics`` (and MCP ``list_actions``) read
    ``iter_actions`` -- one projection at a time -- and keep only the newest ``limit`` records
    (``Newest``) or the counts (``metrics`` takes a stream; it took a list and its ``len``)."""
    from affidavit.views import Newest, metrics

    _fill_interleaved(place)
    with place.reader() as r:
        listed = r.list_actions(now=5.0)
        page = Newest(3).take(r.iter_actions(now=5.0))
        assert page.records == listed[-3:]
        assert (page.total, page.truncated) == (7, True)
        whole = Newest(7).take(r.iter_actions(now=5.0))
        assert (whole.records, whole.truncated) == (listed, False)
        empty = Newest(0).take(r.iter_actions(now=5.0))
        assert (empty.records, empty.total, empty.truncated) == ([], 7, True)
        assert metrics(r.iter_actions(now=5.0)) == metrics(listed)
        assert metrics(r.iter_actions(now=5.0))["invocations"] == 7


def test_the_sessions_view_streams_and_a_page_keeps_those_seen_last(
    place: Place, monkeypatch: Any
) -> None:
    """A caller names its sessions, so ``sessions()`` grew with the journal: it folded every
    record into one list (``views.fold``).  It streams now (``views.fold_each``: memory
    O(sessions)), with the same entries; ``newest_sessions`` keeps the ``limit`` seen last,
    in the reader's order."""
    from affidavit.views import newest_sessions

    _fill_interleaved(place)
    with place.reader() as r:
        folded = views.fold(r.tables, None, 5.0)

        def whole(*args: Any) -> Any:
            raise AssertionError("the sessions view folded the journal into a list")

        monkeypatch.setattr(views, "fold", whole)
        found = r.sessions()
    by_session: dict[Any, list[Any]] = {}
    for rec, first_at, last_at in folded:
        by_session.setdefault(rec.session, []).append((rec.outcome.value, first_at, last_at))
    assert [s["session"] for s in found] == list(by_session) == ["alice", "bob", None]
    for s in found:
        entries = by_session[s["session"]]
        assert s["actions"] == len(entries)
        assert s["first_seen"] == min(e[1] for e in entries)
        assert s["last_seen"] == max(e[2] for e in entries)
        assert sum(s["outcomes"].values()) == len(entries)
    # "ok-2" (no session) came last, then alice's "ok-1"... by last_seen, not by first.
    by_last = sorted(found, key=lambda s: s["last_seen"])
    page = newest_sessions(found, 2)
    assert page["sessions"] == [s for s in found if s in by_last[-2:]]
    assert (page["limit"], page["total"], page["truncated"]) == (2, 3, True)
    assert newest_sessions(found, 3) == {
        "sessions": found,
        "limit": 3,
        "total": 3,
        "truncated": False,
    }
    assert newest_sessions(found, 0)["sessions"] == []


def test_a_key_holding_nul_names_nothing_on_every_backend(place: Place) -> None:
    """A caller's id or session with a NUL (``/v1/invocations/%00``, ``?session=%00``) names no
    record -- on PostgreSQL too, whose text holds no NUL and whose driver refuses to send one:
    that refusal read as a journal that cannot be read (500 JOURNAL_UNREADABLE, an ERROR in
    the log) for a request that was merely wrong."""
    _fill(place)
    with place.reader() as r:
        for key in ("\x00", "ok-1\x00", "\x00ok-1"):
            assert r.record(key) is None
            assert r.events(key) == []
            assert r.list_actions(session=key) == []
            assert list(r.iter_actions(session=key)) == []
            assert r.newest_actions(10, session=key) == ([], 0)
            assert r.newest_actions(0, session=key) == ([], 0)
        assert [x.invocation_id for x in r.list_actions(session="alice")] == ["ok-1", "lost-1"]
