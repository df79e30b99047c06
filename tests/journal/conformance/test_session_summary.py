"""``SessionSummary`` (issue 15): the sessions view brought up to date per request from the
events after the last seq it folded -- answering exactly what a full fold
(``JournalReader.sessions``) answers, on every backend, whatever was appended in between:
records whose outcome changes later (polls, reconciliation, recovery, delivery -- any valid
walk of the lifecycle), a clock set back, another writer's appends, a journal replaced."""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from affidavit.console import pages
from affidavit.journal import AsOf, JournalError, SessionSummary
from affidavit.journal.tables import Tables
from affidavit.statemachine import Event, ImpossibleEvent, Projector
from affidavit.statemachine import EventKind as E
from affidavit.views import metrics, metrics_key, metrics_of, newest_sessions
from tests.statemachine.lifecycle_helpers import make_event, operation, valid_moves

from ..helpers import Ticking, happy, interrupted
from .conftest import Place

SESSIONS = ("alice", "bob", None)
SINCE = (1_700_000_003.0, 1_700_000_009.5, 1_800_000_000.0)
"""Times the metrics are asked since (``_Clock`` starts at 1_700_000_000, moves by a few s)."""


class _Clock:
    """A journal clock that mostly moves on and sometimes goes back (``at`` is the writer's
    clock, not the chain's order): ``steps`` in turn, cycled."""

    def __init__(self, steps: list[float]) -> None:
        self.now, self.steps, self.i = 1_700_000_000.0, steps or [1.0], 0

    def __call__(self) -> float:
        self.now += self.steps[self.i % len(self.steps)]
        self.i += 1
        return self.now


def _fresh(place: Place, where: Path) -> Place:
    keys = (where / "journal.key", where / "journal.signing.key")
    if place.cluster is None:
        return Place("sqlite", str(where / "j.db"), *keys)
    return Place("postgresql", place.cluster.database(), *keys, cluster=place.cluster)


def _both(place: Place, summary: SessionSummary) -> tuple[Any, Any]:
    """(full fold, summary) read as the daemon reads them (``Place.view_reads``), JSON text --
    the sessions (whose answer is returned) and the metrics (compared here)."""

    with place.view_reads() as one:
        full_metrics = one(lambda r: metrics(r.iter_actions()))
        assert one(lambda r: metrics_of(r.summarized_tallies(summary)[0])) == full_metrics
        for since in SINCE:  # the metrics since a time: the kept counts of those accepted since
            full_since = one(lambda r, s=since: metrics(r.iter_actions(since=s)))
            kept_since = one(lambda r, s=since: metrics_of(r.summarized_tallies(summary, s)[0]))
            assert kept_since == full_since
        for name, since in (("alice", None), ("bob", SINCE[1]), ("nobody", None)):  # a session's
            full_of = one(lambda r, n=name, s=since: metrics(r.iter_actions(session=n, since=s)))
            kept_of = one(
                lambda r, n=name, s=since: metrics_of(r.summarized_tallies(summary, s, n)[0])
            )
            assert kept_of == full_of, (name, since)
        # The newest page with the kept count (``/v1/actions``, MCP): the same page and total.
        newest = one(lambda r: _ids(r.newest_actions(2)))
        assert one(lambda r: _ids(r.newest_actions(2, summary=summary))) == newest
        # The console's actions page without a filter: its counts kept, its rows the page alone.
        full_page = one(lambda r: _shape(pages.actions_page(r, pages.ActionFilters())))
        assert one(lambda r: _shape(pages.actions_page(r, pages.ActionFilters(), summary))) == (
            full_page
        )
        # A page of the sessions seen last (``/v1/sessions``, the console's journal page): the
        # kept order's page is the full fold's cut (a clock set back moves a session down), and a
        # caller's of the sessions on targets it may read the cut of its kept entries.
        for limit in (0, 1, 2, 5, -1):
            full_cut = one(lambda r, n=limit: newest_sessions(r.sessions(), n))
            assert one(lambda r, n=limit: r.summarized_session_page(summary, n)[0]) == full_cut
            for readable in (_no, _payments):
                mine = one(
                    lambda r, n=limit, ok=readable: newest_sessions(
                        r.summarized_sessions(summary, ok)[0], n
                    )
                )
                page = one(
                    lambda r, n=limit, ok=readable: r.summarized_session_page(summary, n, ok)[0]
                )
                assert page == mine, readable
        return one(lambda r: r.sessions()), one(lambda r: r.summarized_sessions(summary)[0])


def _no(target: str | None) -> bool:
    """A caller that may read no target's records."""
    return False


def _payments(target: str | None) -> bool:
    """A caller that may read one of the two targets' records (``_walk``: "other" too)."""
    return target == "payments"


def _ids(page: tuple[list[Any], int]) -> tuple[list[str], int]:
    return [r.invocation_id for r in page[0]], page[1]


def _shape(page: dict[str, Any]) -> dict[str, Any]:
    """An actions page without the hints (computed for each read's own clock)."""
    rows = [(r["invocation_id"], r["phase"], r["outcome"], r["code"]) for r in page["rows"]]
    return {"rows": rows, "matrix": page["matrix"], "total": page["total"]}


async def _walk(place: Place, data: st.DataObject, summary: SessionSummary) -> int:
    """Random valid lifecycle walks of a few invocations, interleaved, the summary compared
    with the full fold at random points (and at the end); returns how many were compared."""
    n = data.draw(st.integers(1, 5))
    sessions = [data.draw(st.sampled_from(SESSIONS)) for _ in range(n)]
    steps = data.draw(st.lists(st.sampled_from([1.0, 1.0, 2.5, -3.0, 0.0]), max_size=4))
    projectors: list[Projector | None] = [None] * n
    compared = 0

    def choose(options: Any) -> Any:
        return data.draw(st.sampled_from(list(options)))

    async with place.open(clock=_Clock(steps)) as j:
        for _ in range(data.draw(st.integers(0, 40))):
            k = data.draw(st.integers(0, n - 1))
            p = projectors[k]
            if p is None:
                batch = data.draw(st.sampled_from([None, ["a", "b"]]))  # (items counted)
                attrs: dict[str, Any] = {"operation": operation(budget=3, batch=batch)}
                if data.draw(st.booleans()):  # (a target ``_payments`` refuses)
                    attrs["operation"]["target"] = "other"
                if sessions[k] is not None:
                    attrs["session"] = sessions[k]
                event = Event(E.ACTION_ACCEPTED, f"act-{k}", attrs)
                p = projectors[k] = Projector(f"act-{k}")
            else:
                moves = valid_moves(p)
                if not moves:
                    continue
                kind, dest = choose(moves)
                event = make_event(p, kind, dest, None, choose)
            try:
                stored = await j.append(event)
            except (ImpossibleEvent, JournalError):
                continue  # an event the journal takes only from its own paths: not this walk
            p.apply(stored)
            if data.draw(st.booleans()):
                full, kept = _both(place, summary)
                assert kept == full
                compared += 1
    full, kept = _both(place, summary)
    assert kept == full
    return compared + 1


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_the_summary_answers_as_the_full_fold_after_random_walks(
    place: Place, data: st.DataObject
) -> None:
    with tempfile.TemporaryDirectory() as d:
        p = _fresh(place, Path(d))
        summary = SessionSummary(metrics_key)
        trio.run(_walk, p, data, summary)

        # Another writer (a restarted broker, another broker of a shared journal) appends:
        # read from the journal, the summary has its events too.
        async def more() -> None:
            async with p.open(clock=Ticking(1_800_000_000.0)) as j:
                for ev in interrupted("act-later", "bob"):
                    await j.append(ev)

        trio.run(more)
        full, kept = _both(p, summary)
        assert kept == full


def _fill(place: Place, runs: list[list[Event]]) -> None:
    async def fill() -> None:
        async with place.open(clock=Ticking()) as j:
            for run in runs:
                for ev in run:
                    await j.append(ev)

    trio.run(fill)


class _Counting:
    """``Tables`` counting the event rows a view reads (and how)."""

    def __init__(self, tables: Tables) -> None:
        self.tables = tables
        self.read: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tables, name)

    def _count(self, name: str, rows: Any) -> Iterator[Any]:
        for row in rows:
            self.read[name] = self.read.get(name, 0) + 1
            yield row

    def grouped_events(self, session: str | None = None) -> Iterator[Any]:
        return self._count("grouped_events", self.tables.grouped_events(session))

    def fold_rows_of(self, iids: Any, through: int) -> Iterator[Any]:
        return self._count("fold_rows_of", self.tables.fold_rows_of(iids, through))

    def newest_grouped(self, limit: int, session: str | None = None) -> Iterator[Any]:
        return self._count("newest_grouped", self.tables.newest_grouped(limit, session))

    def newest_page(self, limit: int) -> Iterator[Any]:
        return self._count("newest_page", self.tables.newest_page(limit))


def test_a_request_reads_only_the_invocations_changed_since_the_last(place: Place) -> None:
    _fill(place, [happy(f"inv-{i}", SESSIONS[i % 3]) for i in range(20)])
    summary = SessionSummary(metrics_key)
    with place.reader() as r:
        spy = _Counting(r.tables)
        summary.sessions(spy, 1e9)  # type: ignore[arg-type]
        assert spy.read == {"grouped_events": 20 * 7}  # the first: a full fold
    _fill(place, [interrupted("inv-new", "bob")])
    with place.reader() as r:
        spy = _Counting(r.tables)
        summary.sessions(spy, 1e9)  # type: ignore[arg-type]
        assert spy.read == {"fold_rows_of": 5}  # the new invocation's events, no other row
        spy = _Counting(r.tables)
        summary.sessions(spy, 1e9)  # type: ignore[arg-type]
        assert spy.read == {}  # nothing new: nothing read but the head
    full, kept = _both(place, summary)
    assert kept == full


def test_an_altered_new_row_fails_the_summary_as_the_full_fold_and_keeps_failing(
    place: Place,
) -> None:
    _fill(place, [happy("inv-1", "alice")])
    summary = SessionSummary(metrics_key)
    assert _both(place, summary)[0] == _both(place, summary)[1]
    _fill(place, [interrupted("inv-2", "bob")])
    last = place.rows("SELECT max(seq) FROM events")[0][0]
    place.tamper(f"UPDATE events SET attrs = '[1]' WHERE seq = {last}")
    for _ in range(2):  # not served from what it held before
        full, kept = _both(place, summary)
        assert full[0] == "JournalError" and "altered" in full[1]
        assert kept == full


def test_a_journal_replaced_under_the_summary_is_folded_again(tmp_path: Path) -> None:
    # (SQLite's file restored from a copy: the row at the seq it folded through is another)
    place = Place("sqlite", str(tmp_path / "j.db"), tmp_path / "k", tmp_path / "s")
    _fill(place, [happy("inv-1", "alice"), happy("inv-2", "bob")])
    saved = tmp_path / "saved"
    saved.mkdir()
    for f in Path(place.location).parent.glob("j.db*"):
        shutil.copy(f, saved / f.name)
    summary = SessionSummary(metrics_key)
    _both(place, summary)
    _fill(place, [interrupted("inv-3", "alice")])
    _both(place, summary)
    for f in Path(place.location).parent.glob("j.db*"):  # a backup restored: fewer rows
        f.unlink()
    for f in saved.iterdir():
        shutil.copy(f, Path(place.location).parent / f.name)
    # Written on past the old head before the next read: only the row at the seq the summary
    # folded through tells that this is another journal.
    _fill(place, [happy("inv-4", None), interrupted("inv-5", None)])
    full, kept = _both(place, summary)
    assert kept == full and json.loads(kept)[0]["actions"] == 1  # inv-3 is gone


def test_outcome_counts_keep_the_full_folds_order_as_outcomes_change(place: Place) -> None:
    # alice: inv-a unknown (first), inv-b committed, inv-c unknown; then inv-a is answered
    # (committed): "unknown" now comes after "committed" (its first invocation is inv-c).
    runs = [
        interrupted("inv-a", "alice")[:4],  # dispatched: unknown
        happy("inv-b", "alice"),
        interrupted("inv-c", "alice"),
        happy("inv-a", "alice")[4:],
    ]
    summary = SessionSummary(metrics_key)
    done = []
    for run in runs:
        _fill(place, [run])
        done.append(_both(place, summary))
    assert all(kept == full for full, kept in done)
    first, last = (list(json.loads(done[i][1])[0]["outcomes"]) for i in (2, 3))
    assert (first, last) == (["unknown", "committed"], ["committed", "unknown"])


def test_sessions_first_seen_in_one_update_keep_the_journals_order(place: Place) -> None:
    _fill(place, [happy("inv-0", "old")])
    summary = SessionSummary(metrics_key)
    _both(place, summary)
    # New sessions whose invocations' ids sort against their order in the journal.
    _fill(place, [happy("zz-first", "s-z"), happy("aa-second", "s-a"), happy("mm-third", "s-m")])
    full, kept = _both(place, summary)
    assert kept == full
    assert [s["session"] for s in json.loads(kept)] == ["old", "s-z", "s-a", "s-m"]


def test_a_kept_count_is_not_counted_again_in_the_database(place: Place) -> None:
    """The newest page with a summary that keeps its count reads the page's rows alone
    (``Tables.newest_page``), never a count of every invocation; before the summary's first
    fold it counts in the database (not a whole fold for a count)."""
    _fill(place, [happy(f"inv-{i}", SESSIONS[i % 3]) for i in range(5)])
    summary = SessionSummary(metrics_key)
    with place.reader() as r:
        spy = _Counting(r.tables)
        r.tables = spy  # type: ignore[assignment]
        records, total = r.newest_actions(2, summary=summary)
        assert total == 5 and spy.read == {"newest_grouped": 2 * 7}  # nothing kept: counted
        r.summarized_sessions(summary)
        spy.read.clear()
        records, total = r.newest_actions(2, summary=summary)
        assert total == 5 and spy.read == {"newest_page": 2 * 7}
        assert [x.invocation_id for x in records] == ["inv-3", "inv-4"]
    _fill(place, [interrupted("inv-new", "bob")])
    with place.reader() as r:
        assert r.newest_actions(1, summary=summary)[1] == 6  # brought up to the head
        # Another thread holds the summary (a first fold may take seconds): counted in the
        # database, not waited for.
        held, done = threading.Event(), threading.Event()

        def hold() -> None:
            with summary._lock:
                held.set()
                done.wait(5.0)  # (bounded: a count that waited would go on after 5 s)

        holder = threading.Thread(target=hold)
        holder.start()
        try:
            assert held.wait(5.0)
            spy = _Counting(r.tables)
            r.tables = spy  # type: ignore[assignment]
            assert r.newest_actions(1, summary=summary)[1] == 6
            assert spy.read == {"newest_grouped": 5} and not done.is_set()
        finally:
            done.set()
            holder.join()


def test_a_count_in_an_older_snapshot_does_not_fold_the_journal_again(place: Place) -> None:
    """The console's unfiltered actions page takes the tallies, then the count, in one
    snapshot; between the two another request may bring the summary to a newer head.  The
    count's snapshot is then behind what the summary folded -- not a journal rewound: it is
    counted in the database, never a whole fold (which would hold the summary for as long as
    the first fold took, and set it back to the older head)."""
    _fill(place, [happy(f"inv-{i}", SESSIONS[i % 3]) for i in range(5)])
    summary = SessionSummary(metrics_key)
    with place.reader() as r:
        r.summarized_sessions(summary)  # kept
    real = SessionSummary.tallies
    spies: list[_Counting] = []

    def then_newer(s: SessionSummary, tables: Any, now: float, since: Any = None) -> Any:
        out = real(s, tables, now, since)
        if not spies:  # another request, in a newer snapshot, between the tallies and the count
            spies.append(_Counting(tables))
            _fill(place, [interrupted("inv-new", "bob")])
            with place.reader() as other:
                other.summarized_sessions(summary)
        return out

    SessionSummary.tallies = then_newer  # type: ignore[method-assign]
    try:
        with place.reader() as r:
            spy = _Counting(r.tables)
            r.tables = spy  # type: ignore[assignment]
            tallies, records, total, _ = r.summarized_page(summary, 2)
            assert [x.invocation_id for x in records] == ["inv-3", "inv-4"]
    finally:
        SessionSummary.tallies = real  # type: ignore[method-assign]
    assert spies and sum(tallies.values()) == total == 5  # the page's own snapshot
    assert "grouped_events" not in spy.read, spy.read  # no whole fold for a count
    with place.reader() as r:
        spy = _Counting(r.tables)
        summary.sessions(spy, 1e9)  # type: ignore[arg-type]
        assert spy.read == {}, spy.read  # still at the newer head: nothing to read again
    full, kept = _both(place, summary)
    assert kept == full


def test_each_answer_says_what_it_is_as_of(place: Place) -> None:
    """The marker comes with the answer it describes: the seq that answer folded through and
    the last whole verify told of -- not one another answer was given since (which may be of a
    newer head)."""
    _fill(place, [happy("inv-1", "alice")])
    summary = SessionSummary(metrics_key)
    with place.reader() as r:
        _, mine = r.summarized_sessions(summary)
        head = r.head()[0]
    assert mine == AsOf(head, None, None, None, None)
    _fill(place, [interrupted("inv-2", "bob")])
    with place.reader() as r:
        _, theirs = r.summarized_tallies(summary)
        newer = r.head()[0]
    assert newer > head and theirs == AsOf(newer, None, None, None, None)
    assert mine == AsOf(head, None, None, None, None)  # the first answer's, as it was
    summary.verified(1_700_000_100.0, newer, True, started=1_700_000_040.0)
    with place.reader() as r:
        _, as_of = r.summarized_tallies(summary, 0.0)
    assert as_of == AsOf(newer, 1_700_000_040.0, 1_700_000_100.0, newer, True)
    # broken: folded again at the next answer
    summary.verified(1_700_000_200.0, 3, False, started=1_700_000_150.0)
    with place.reader() as r:
        spy = _Counting(r.tables)
        _, as_of = summary.sessions(spy, 1e9)  # type: ignore[arg-type]
    assert "grouped_events" in spy.read, spy.read
    assert as_of == AsOf(newer, 1_700_000_150.0, 1_700_000_200.0, 3, False)


def test_answers_interleaved_in_threads_each_carry_their_own_marker(place: Place) -> None:
    """Two threads take turns on one summary, each after an append of its own: each answer's
    marker is the head of the snapshot it was read in, and its counts are that head's -- also
    when the answer is handed to another thread (a view's worker thread answers the event
    loop).  (With the marker kept per thread -- ``as_of()`` read after the call -- the
    interleaving was right too, but an answer handed to another thread had that thread's
    marker: None, or an older answer's.)"""
    _fill(place, [happy("inv-0", "alice")])
    summary = SessionSummary(metrics_key)
    turn = [threading.Event(), threading.Event()]
    got: list[list[tuple[int, int, AsOf | None]]] = [[], []]

    def worker(me: int) -> None:
        for i in range(3):
            assert turn[me].wait(10.0)  # bounded: the other thread hands the turn over
            turn[me].clear()
            _fill(place, [interrupted(f"inv-{me}-{i}", SESSIONS[me])])
            with place.reader() as r:
                tallies, as_of = r.summarized_tallies(summary)
                got[me].append((r.head()[0], sum(tallies.values()), as_of))
            turn[1 - me].set()

    threads = [threading.Thread(target=worker, args=(n,)) for n in (0, 1)]
    for t in threads:
        t.start()
    turn[0].set()
    for t in threads:
        t.join(30.0)
    assert not any(t.is_alive() for t in threads)
    answers = sorted(got[0] + got[1], key=lambda g: g[0])
    assert len(answers) == 6 and len({g[0] for g in answers}) == 6  # six heads, each newer
    for n, (head, counted, as_of) in enumerate(answers):
        assert as_of == AsOf(head, None, None, None, None), (n, head, as_of)
        assert counted == n + 2  # inv-0 and the n + 1 appended so far
    # An answer handed over: read in a thread of its own, its marker still its own.
    box: list[Any] = []
    helper = threading.Thread(
        target=lambda: box.append(_read(place, lambda r: r.summarized_sessions(summary)))
    )
    helper.start()
    helper.join(10.0)
    [(sessions, as_of)] = box
    assert as_of == AsOf(answers[-1][0], None, None, None, None)
    assert sum(s["actions"] for s in sessions) == 7


def _read(place: Place, view: Any) -> Any:
    with place.reader() as r:
        return view(r)


def test_a_sessions_metrics_are_its_kept_counts_once_a_fold_is_kept(place: Place) -> None:
    """``/v1/metrics?session=`` folded the session's events per request (2.6-3.2 s for a
    session of 21k invocations): once the journal is kept, a session's counts are its kept
    invocations' -- no event row read but the appended ones'; before, the session alone is
    folded (not the whole journal for it), and the answer says it was folded now."""
    _fill(place, [happy(f"inv-{i}", SESSIONS[i % 3]) for i in range(12)])
    summary = SessionSummary(metrics_key)
    with place.reader() as r:
        spy = _Counting(r.tables)
        r.tables = spy  # type: ignore[assignment]
        tallies, as_of = r.summarized_tallies(summary, None, "bob")
        cold = metrics_of(tallies)
        assert spy.read == {"grouped_events": 4 * 7}, spy.read  # bob's 4 invocations only
        assert as_of is None and not summary.kept  # (folded now)
        r.summarized_sessions(summary)  # kept now (another view folded the journal)
        spy.read.clear()
        tallies, as_of = r.summarized_tallies(summary, None, "bob")
        kept = metrics_of(tallies)
        assert spy.read == {}, spy.read  # nothing read again
        assert as_of == AsOf(r.head()[0], None, None, None, None)
        assert kept == cold == metrics(r.iter_actions(session="bob"))
    _fill(place, [interrupted("inv-new", "bob")])
    with place.reader() as r:
        spy = _Counting(r.tables)
        r.tables = spy  # type: ignore[assignment]
        kept = metrics_of(r.summarized_tallies(summary, None, "bob")[0])
        assert spy.read == {"fold_rows_of": 5}, spy.read  # the appended invocation alone
        assert kept["invocations"] == 5
    full, kept_all = _both(place, summary)
    assert kept_all == full


def test_a_callers_page_leaves_out_the_newest_session_it_may_not_read(place: Place) -> None:
    """A caller reading one of two targets: the session seen last is on the other, so its page
    is cut from its readable sessions alone -- the same as the full fold's of its records."""
    hidden = happy("inv-h", "hidden")
    op = {**hidden[0].attrs["operation"], "target": "other"}  # type: ignore[dict-item]
    hidden[0] = Event(E.ACTION_ACCEPTED, "inv-h", {**hidden[0].attrs, "operation": op})
    _fill(place, [happy("inv-a", "alice"), happy("inv-b", "bob"), hidden])
    summary = SessionSummary(metrics_key)
    with place.reader() as r:
        for limit, shown in ((1, ["bob"]), (2, ["alice", "bob"])):
            page = r.summarized_session_page(summary, limit, _payments)[0]
            assert [s["session"] for s in page["sessions"]] == shown, page
            assert (page["total"], page["truncated"]) == (2, limit < 2), page
            full = [
                s for s in r.sessions() if s["session"] != "hidden"
            ]  # (each session here is on one target)
            assert page == newest_sessions(full, limit)
            assert r.summarized_session_page(summary, limit)[0]["sessions"][-1]["session"] == (
                "hidden"
            )


def test_a_page_of_the_newest_sessions_builds_only_the_entries_it_shows(
    place: Place, monkeypatch: Any
) -> None:
    from affidavit.journal import summary as kept

    _fill(place, [happy(f"inv-{i}", f"s-{i}") for i in range(12)])
    summary = SessionSummary(metrics_key)
    real, built = kept._Session.entry, [0]

    def entry(self: Any) -> dict[str, Any]:
        built[0] += 1
        return real(self)

    with place.reader() as r:
        full = r.summarized_sessions(summary)[0]  # (folded once, every entry built)
        monkeypatch.setattr(kept._Session, "entry", entry)
        for limit in (1, 5):
            built[0] = 0
            page = r.summarized_session_page(summary, limit)[0]
            assert built[0] == limit
            assert page == newest_sessions(full, limit)
