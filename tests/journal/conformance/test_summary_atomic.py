"""A kept view's update is all or nothing (journal/summary.py: "a failed update changes
nothing").  Bringing a ``SessionSummary`` up re-folds the invocations touched since the seq it
folded through; one whose first row is not the kept one (a row altered) has the whole journal
folded again -- and that full fold may meet a row it refuses.  The update must then leave the
summary exactly as it was before the batch: not with the touched invocations before that one
already changed, while the seq it says it folded through stays the old one."""

from __future__ import annotations

import json
from typing import Any

import pytest

from affidavit.journal import JournalError, SessionSummary
from affidavit.views import metrics_key

from ..helpers import happy
from .conftest import Place
from .test_session_summary import _fill
from .test_summary_hard_cases import _alter, _check, _set


def _kept(summary: SessionSummary) -> tuple[Any, ...]:
    """What the summary holds, read without bringing it up: its sessions, its tallies, its
    invocations' outcomes, the seq it folded through."""
    state = summary._state
    return (
        [s.entry() for s in state.sessions.values()],
        dict(state.tallies),
        {iid: (inv.outcome, inv.last_at, inv.tally) for iid, inv in state.invs.items()},
        state.through,
    )


def _refused(place: Place, summary: SessionSummary) -> str:
    with place.reader() as r, pytest.raises(JournalError) as caught:
        r.summarized_sessions(summary)
    return str(caught.value)


def test_an_update_that_meets_an_altered_row_changes_nothing(place: Place) -> None:
    a, b = happy("inv-a", "alice"), happy("inv-b", "bob")
    _fill(place, [a[:1], b[:1], happy("inv-c", "carol")[:1]])  # seqs 1, 2, 3
    summary = SessionSummary(metrics_key)
    full, kept = _check(place, summary)
    assert kept == full
    before = _kept(summary)
    assert before[3] == 3
    _fill(place, [a[1:], b[1:2]])  # inv-a's outcome changes; inv-b gets an event
    was = {
        s: place.rows(f"SELECT at, session_id, attrs FROM events WHERE seq = {s}")[0]
        for s in (2, 3)
    }
    _alter(place, 2, "at")  # inv-b's first time is not the kept one: the whole journal again
    _alter(place, 3, "attrs")  # ... where inv-c's row (not touched) is refused
    first = _refused(place, summary)
    assert "the event row at seq 3 was altered" in first
    assert _kept(summary) == before  # inv-a (re-folded before inv-b) not changed either
    assert _refused(place, summary) == first  # the next read refuses the same row
    assert _kept(summary) == before
    # What a half-applied update would answer: the rows put back and inv-a's new events gone,
    # inv-a is touched no more -- it must be as its one row says, as the full fold has it.
    for seq, row in was.items():
        _set(place, seq, row)
    place.tamper("DELETE FROM events WHERE invocation_id = 'inv-a' AND seq > 3")
    full, kept = _check(place, summary)
    assert kept == full
    alice = next(s for s in json.loads(kept["sessions"]) if s["session"] == "alice")
    assert alice["outcomes"] == before[0][0]["outcomes"]
