"""``SessionSummary`` against the cases its random walks (test_session_summary.py) never
reached: rows changed in place before and after the seq it folded through, an invocation
accepted again under another session, another broker (its own signing key) appending to a
shared PostgreSQL journal in between the walk's own appends, and ``since`` exactly at an
event's time.

What the summary promises of a row altered in place (journal/summary.py): one after the seq
it folded through is read as the full fold reads it (the same answer, or the same refusal);
one at or before that seq is not read again -- the summary answers as of its last check,
exactly what it answered then -- until ``forget`` (a verify that found the row altered), after
which it answers as the full fold again."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import event as event_
from hypothesis import strategies as st

from affidavit.console import pages
from affidavit.journal import JournalError, SessionSummary
from affidavit.journal.signing import SigningKey
from affidavit.statemachine import Event, ImpossibleEvent, Projector
from affidavit.statemachine import EventKind as E
from affidavit.views import metrics, metrics_key, metrics_of
from tests.statemachine.lifecycle_helpers import make_event, operation, valid_moves

from ..helpers import happy
from .conftest import Place
from .test_session_summary import SESSIONS, SINCE, _Clock, _fill, _fresh, _ids, _shape

ALTERATIONS = ("at", "at back", "session attr", "session column", "attrs")
"""What a tamper does to one row: its time (on, or back before every other), the session
its ACTION_ACCEPTED names (a record moved to another session), the session column (which
the fold does not read), or its attrs (a row the fold refuses)."""


def _alter(place: Place, seq: int, how: str) -> None:
    if how == "session attr":
        kind, attrs = place.rows(f"SELECT kind, attrs FROM events WHERE seq = {seq}")[0]
        if kind != E.ACTION_ACCEPTED.value:
            how = "at"
        else:
            value = json.loads(attrs)
            value["session"] = "mallory"
            text = json.dumps(value, sort_keys=True, separators=(",", ":")).replace("'", "''")
            place.tamper(f"UPDATE events SET attrs = '{text}' WHERE seq = {seq}")
            return
    change = {
        "at": "at = at + 7.25",
        "at back": "at = 1600000000.0",
        "session column": "session_id = 'mallory'",
        "attrs": "attrs = '[1]'",
    }[how]
    place.tamper(f"UPDATE events SET {change} WHERE seq = {seq}")


PAGES = ("newest", "page")
"""The views whose rows are read afresh each time (only their counts are kept)."""


def _head(place: Place) -> int:
    return int(place.rows("SELECT coalesce(max(seq), 0) FROM events")[0][0])


def _check(
    place: Place, summary: SessionSummary, sinces: list[float] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(full fold, summary): each view ``_both`` compares, and the metrics since each of the
    first event times exactly (and just after it), or ``sinces`` -- every answer as text, or
    the refusal."""

    with place.view_reads() as one:
        if sinces is None:
            times = sorted(float(r[0]) for r in place.rows("SELECT DISTINCT at FROM events"))
            sinces = [*SINCE, *times[:5], *(t + 1e-6 for t in times[:3])]
        full: dict[str, Any] = {"sessions": one(lambda r: r.sessions())}
        kept: dict[str, Any] = {"sessions": one(lambda r: r.summarized_sessions(summary)[0])}
        full["metrics"] = one(lambda r: metrics(r.iter_actions()))
        kept["metrics"] = one(lambda r: metrics_of(r.summarized_tallies(summary)[0]))
        for s in sinces:
            full[f"since {s!r}"] = one(lambda r, s=s: metrics(r.iter_actions(since=s)))
            kept[f"since {s!r}"] = one(
                lambda r, s=s: metrics_of(r.summarized_tallies(summary, s)[0])
            )
        full["newest"] = one(lambda r: _ids(r.newest_actions(2)))
        kept["newest"] = one(lambda r: _ids(r.newest_actions(2, summary=summary)))
        full["page"] = one(lambda r: _shape(pages.actions_page(r, pages.ActionFilters())))
        kept["page"] = one(lambda r: _shape(pages.actions_page(r, pages.ActionFilters(), summary)))
        return full, kept


def _set(place: Place, seq: int, row: tuple[Any, ...]) -> None:
    """The row at ``seq``'s (at, session_id, attrs) set to ``row``."""
    at, session, attrs = row
    back = "NULL" if session is None else "'" + session.replace("'", "''") + "'"
    text = "'" + attrs.replace("'", "''") + "'"
    place.tamper(
        f"UPDATE events SET at = {at!r}, session_id = {back}, attrs = {text} WHERE seq = {seq}"
    )


def _alter_and_check(place: Place, summary: SessionSummary, seq: int, how: str) -> None:
    """Alter the row at ``seq``, then compare.  A row after the seq the summary folded
    through, or one of an invocation with an event after it (re-read whole), is read as the
    full fold reads it; any other is not read again: the summary answers as the full fold of
    the journal with that row as it was -- until ``forget``, then as the full fold again.
    The row is put back after (one altered row at a time), and the summary forgets it."""
    through = summary._state.through
    iid = place.rows(f"SELECT invocation_id FROM events WHERE seq = {seq}")[0][0]
    if how == "session attr":  # the session its record names: that record's ACTION_ACCEPTED
        seq = place.rows(f"SELECT min(seq) FROM events WHERE invocation_id = '{iid}'")[0][0]
    select = f"SELECT at, session_id, attrs FROM events WHERE seq = {seq}"
    was_row = place.rows(select)[0]
    touched = {r[0] for r in place.rows(f"SELECT invocation_id FROM events WHERE seq > {through}")}
    _alter(place, seq, how)
    full, kept = _check(place, summary)
    reread = seq > through or iid in touched
    event_(f"altered a row {'read again' if reread else 'not read again'}")
    if reread:
        assert kept == full
    else:
        sinces = [float(k[6:]) for k in full if k.startswith("since ")]
        altered_row = place.rows(select)[0]
        _set(place, seq, was_row)
        was, _ = _check(place, SessionSummary(metrics_key), sinces)  # the journal as folded
        _set(place, seq, altered_row)
        rows_now = {k: (kept.pop(k), full.pop(k)) for k in PAGES}
        assert kept == {k: v for k, v in was.items() if k not in PAGES}
        assert all(a == b for a, b in rows_now.values()), rows_now  # their rows read afresh
        summary.forget()  # a verify found the row altered
        full, kept = _check(place, summary)
        assert kept == full
    _set(place, seq, was_row)
    summary.forget()


async def _walk(place: Place, other: Place | None, data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 4))
    sessions = [data.draw(st.sampled_from(SESSIONS)) for _ in range(n)]
    steps = data.draw(st.lists(st.sampled_from([1.0, 0.0, 2.5, -3.0]), max_size=3))
    projectors: list[Projector | None] = [None] * n
    summary = SessionSummary(metrics_key)

    def choose(options: Any) -> Any:
        return data.draw(st.sampled_from(list(options)))

    async with place.open(clock=_Clock(steps)) as mine:
        writers = [mine]
        if other is not None:  # another broker of the shared journal, with its own key
            opened = other.open(clock=_Clock(steps))
            writers.append(await opened.__aenter__())
        try:
            for _ in range(data.draw(st.integers(1, 25))):
                move = data.draw(st.sampled_from(["step", "step", "step", "reaccept", "alter"]))
                if move == "alter" and _head(place) > 0:
                    seq = data.draw(st.integers(1, _head(place)))
                    _alter_and_check(place, summary, seq, data.draw(st.sampled_from(ALTERATIONS)))
                    continue
                k = data.draw(st.integers(0, n - 1))
                p = projectors[k]
                if p is None or move == "reaccept":
                    session = sessions[k] if p is None else choose(SESSIONS)
                    attrs: dict[str, Any] = {"operation": operation(budget=3)}
                    if session is not None:
                        attrs["session"] = session
                    event = Event(E.ACTION_ACCEPTED, f"act-{k}", attrs)
                    p = Projector(f"act-{k}") if p is None else p
                else:
                    moves = valid_moves(p)
                    if not moves:
                        continue
                    kind, dest = choose(moves)
                    event = make_event(p, kind, dest, None, choose)
                writer = writers[data.draw(st.integers(0, len(writers) - 1))]
                try:
                    stored = await writer.append(event)
                except (ImpossibleEvent, JournalError):
                    continue  # not an event this journal takes here
                projectors[k] = p
                p.apply(stored)
                event_(f"appended {move} by writer {writers.index(writer)}")
                if data.draw(st.booleans()):
                    full, kept = _check(place, summary)
                    assert kept == full
        finally:
            if other is not None:
                await opened.__aexit__(None, None, None)
    full, kept = _check(place, summary)
    assert kept == full


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_the_summary_keeps_its_promise_through_alterations_and_other_writers(
    place: Place, data: st.DataObject
) -> None:
    with tempfile.TemporaryDirectory() as d:
        p = _fresh(place, Path(d))
        other = None
        if p.cluster is not None:
            SigningKey.create(Path(d) / "other.signing.key")
            other = Place(p.kind, p.location, p.key_file, Path(d) / "other.signing.key", p.cluster)
        trio.run(_walk, p, other, data)


@pytest.mark.parametrize("how", ["at", "session attr"])
def test_an_altered_first_row_read_again_with_a_later_event_folds_all_again(
    place: Place, how: str
) -> None:
    """(Hypothesis' falsifying example, for "at".)  The first event's time (or the session its
    ACTION_ACCEPTED names) altered after it was folded, then another event of that record: the
    record is read again, and the summary answered its outcome and last time from the rows as
    they are but its first time (the session's ``first_seen``, the metrics since a time) from
    the row as it was -- neither the journal as it was nor as it is.  A first time or session
    other than the kept one folds it all again (the random walk seldom reaches the session's
    case: dropping it from the check passed 25 examples)."""
    run = happy("inv-a", "alice")
    _fill(place, [run[:1], happy("inv-b", "bob")[:1]])  # (a journal opens on its last row)
    summary = SessionSummary(metrics_key)
    full, kept = _check(place, summary)
    assert kept == full
    _alter(place, 1, how)
    _fill(place, [run[1:2]])
    full, kept = _check(place, summary)
    assert kept == full
    first = json.loads(kept["sessions"])[0]
    assert first["first_seen"] == place.rows("SELECT at FROM events WHERE seq = 1")[0][0]
    assert first["session"] == ("mallory" if how == "session attr" else "alice")


def test_a_kept_count_answers_as_the_database_count_past_an_altered_row_it_does_not_show(
    place: Place,
) -> None:
    """(Hypothesis' falsifying example.)  Another event of a record not on the newest page, then
    its first row altered (its attrs: a row the fold refuses): bringing the kept count up reads
    the record again and meets the row.  The page refused there, where the page
    without a kept count (the rows of the records it shows, a count in the database) answered:
    the kept count stands in for the database's and answers as it does.  The views that read
    the row (the sessions, the metrics, the page with its counts) refuse it, as a full fold."""
    run = happy("inv-a", "alice")
    _fill(place, [run[:1], happy("inv-b", "bob")[:1], happy("inv-c", "carol")[:1]])
    summary = SessionSummary(metrics_key)
    full, kept = _check(place, summary)
    assert kept == full
    _fill(place, [run[1:2]])
    _alter(place, 1, "attrs")
    full, kept = _check(place, summary)
    assert kept == full
    assert json.loads(kept["newest"]) == [["inv-b", "inv-c"], 3]
    for view in ("sessions", "metrics", "page"):
        assert kept[view][0] == "JournalError", view
        assert "the event row at seq 1 was altered" in kept[view][1]
    assert summary._state.through == 3  # (the kept fold as it was: a failed update changes nothing)
