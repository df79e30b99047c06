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
from typing import Any

from affidavit.console import pages
from affidavit.journal import JournalError, SessionSummary
from affidavit.statemachine import EventKind as E
from affidavit.views import metrics, metrics_key, metrics_of

from ..helpers import happy
from .conftest import Place
from .test_session_summary import SINCE, _fill, _ids, _shape

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

    def one(read: Any) -> Any:
        with place.reader() as r:
            try:
                return json.dumps(read(r))
            except JournalError as exc:
                return ("JournalError", str(exc))

    if sinces is None:
        times = sorted(float(r[0]) for r in place.rows("SELECT DISTINCT at FROM events"))
        sinces = [*SINCE, *times[:5], *(t + 1e-6 for t in times[:3])]
    full: dict[str, Any] = {"sessions": one(lambda r: r.sessions())}
    kept: dict[str, Any] = {"sessions": one(lambda r: r.summarized_sessions(summary))}
    full["metrics"] = one(lambda r: metrics(r.iter_actions()))
    kept["metrics"] = one(lambda r: metrics_of(r.summarized_tallies(summary)))
    for s in sinces:
        full[f"since {s!r}"] = one(lambda r, s=s: metrics(r.iter_actions(since=s)))
        kept[f"since {s!r}"] = one(lambda r, s=s: metrics_of(r.summarized_tallies(summary, s)))
    full["newest"] = one(lambda r: _ids(r.newest_actions(2)))
    kept["newest"] = one(lambda r: _ids(r.newest_actions(2, summary=summary)))
    full["page"] = one(lambda r: _shape(pages.actions_page(r, pages.ActionFilters())))
    kept["page"] = one(lambda r: _shape(pages.actions_page(r, pages.ActionFilters(), summary)))
    return full, kept


def test_an_altered_first_time_read_again_with_a_later_event_folds_all_again(
    place: Place,
) -> None:
    """(Hypothesis' falsifying example.)  The first event's time altered after it was folded,
    then another event of that record: the record is read again, and the summary answered
    its outcome and last time from the rows as they are but its first time (the session's
    ``first_seen``, the metrics since a time) from the row as it was -- neither the journal
    as it was nor as it is.  A first time other than the kept one folds it all again."""
    run = happy("inv-a", "alice")
    _fill(place, [run[:1], happy("inv-b", "bob")[:1]])  # (a journal opens on its last row)
    summary = SessionSummary(metrics_key)
    full, kept = _check(place, summary)
    assert kept == full
    place.tamper("UPDATE events SET at = at + 7.25 WHERE seq = 1")
    _fill(place, [run[1:2]])
    full, kept = _check(place, summary)
    assert kept == full
    assert (
        json.loads(kept["sessions"])[0]["first_seen"]
        == place.rows("SELECT at FROM events WHERE seq = 1")[0][0]
    )
