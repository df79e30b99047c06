"""The sessions view kept up to date instead of folded again per request (issue 15: the
daemon's ``/v1/sessions`` folded every record of the journal on every request -- 7-11 s on a
1M-event journal).

A ``SessionSummary`` is folded once from the whole journal (``views.fold_each``'s rows), then,
on each request, brought up to the journal's head by re-folding only the invocations with an
event after the last seq it folded (``Tables.touched_after``, then each one's events through
``events_invocation``).  It is derived, never evidence: it answers exactly what
``JournalReader.sessions`` answers from a full fold (``_by_session``), down to the order of
the sessions and of each session's outcome counts, and it reads the journal (never the
writer's memory), so another process's appends are in it.  What it holds per invocation is
small and fixed (``_Inv``): memory O(invocations), never O(events).

What a full fold would refuse, it refuses: every row it reads goes through the same fold
(``rows.fold_events``, ``fold_runs``); a failed update changes nothing (the next request reads
the same rows, and fails the same way).  A journal rewound or replaced under it (the row at
the seq it folded through is gone or another) is folded again from the start.  A row altered
in place *before* that seq, after it was folded, is not read again (only ``verify`` and a full
fold read every row): the summary keeps what that row said when it was folded -- until a
verify that finds a row altered has it ``forget`` (the console's journal page does) -- unless
its invocation has an event after that seq: its rows are then read again, and a session, first
seq or first time other than the kept one (a row altered) folds the whole journal again, so
no answer mixes the row as it was with the row as it is.

So every kept answer says what it is as of (``AsOf``): the last seq folded into it, and of
the last whole verify this summary was told of (``verified``: the console's) when it started
reading and when it completed, how far it reached and its verdict -- it proves the rows through
that seq as they were when it started reading (its snapshot), not as they are when it ended --
a row altered before that seq since it was folded is in the answer as it was folded, until a
whole verify finds it.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import sys
import threading
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Any, NamedTuple

from affidavit.statemachine import ImpossibleEvent, Record, attested, fold_runs

from .rows import AlteredRow, close_rows, fold_events, noting_firsts, unfoldable
from .summary_newest import NewestSessions, newest_page
from .tables import Tables

__all__ = ["AsOf", "Page", "SessionSummary", "attested_counts"]

_BATCH = 500
"""Invocations whose events one statement reads (``Tables.fold_rows_of``)."""


class _Inv:
    """One invocation as the sessions view counts it (``first_at``, the time of its first
    event, never changes: counted into its session's ``first_seen`` once, and kept for the
    metrics ``since`` a time)."""

    __slots__ = (
        "attested",
        "first_at",
        "iid",
        "last_at",
        "outcome",
        "pos",
        "session",
        "tally",
        "target",
    )

    def __init__(
        self,
        iid: str,
        pos: int,
        session: str | None,
        outcome: str,
        first_at: float,
        last_at: float,
        target: str | None = None,
        attested: bool = False,
    ) -> None:
        self.iid = iid  # (the key it is held under: the same string, not a copy)
        self.pos = pos  # the seq of its first event: the view's order
        self.session = session
        self.target = target  # as its ACTION_ACCEPTED names it (``readable_page``)
        self.outcome = outcome
        self.attested = attested  # the outcome rests on an operator's attestation
        self.first_at = first_at
        self.last_at = last_at
        self.tally: Hashable = None  # ``SessionSummary``'s ``tally`` of its record, once counted


class _Session:
    """One session's counts; ``members``: its invocations in order of their first event;
    ``targets``: those on each target, in that order too (an invocation's target never
    changes: a fold that says otherwise folds the whole journal again, ``_update``)."""

    __slots__ = (
        "actions",
        "attested",
        "counts",
        "first_seen",
        "heaped",
        "last_seen",
        "members",
        "minpos",
        "name",
        "order",
        "stamp",
        "targets",
    )

    def __init__(self, name: str | None, first_at: float, last_at: float, order: int) -> None:
        self.name = name
        self.order = order  # its index in the view's order of sessions (``NewestSessions``)
        self.stamp = 0
        self.heaped: float | None = None
        self.actions = 0
        self.counts: dict[str, int] = {}
        self.attested: dict[str, int] = {}  # outcome -> how many of ``counts``' are attested
        self.minpos: dict[str, int] = {}  # outcome -> pos of its first invocation (key order)
        self.first_seen = first_at
        self.last_seen = last_at
        self.members: list[_Inv] = []
        self.targets: dict[str | None, list[_Inv]] = {}

    def add(self, inv: _Inv, first_at: float) -> None:
        inv.session = self.name  # (one string per session, not one per invocation)
        self.members.append(inv)
        self.actions += 1
        self.targets.setdefault(inv.target, []).append(inv)
        self._count(inv)
        if first_at < self.first_seen:
            self.first_seen = first_at
        if inv.last_at > self.last_seen:
            self.last_seen = inv.last_at

    def change(self, inv: _Inv, outcome: str, attested: bool, last_at: float) -> None:
        """``inv`` (a member) folded again: its outcome (``attested`` or not) and last event's
        time now these."""
        stale = False
        if outcome != inv.outcome or attested != inv.attested:
            old = inv.outcome
            self.counts[old] -= 1
            if inv.attested:
                self.attested[old] -= 1
                if self.attested[old] == 0:
                    del self.attested[old]
            if self.counts[old] == 0:
                del self.counts[old], self.minpos[old]
            elif self.minpos[old] == inv.pos:
                stale = True
            inv.outcome, inv.attested = outcome, attested
            self._count(inv)
        if last_at != inv.last_at:
            if last_at > self.last_seen:
                self.last_seen = last_at
            elif inv.last_at == self.last_seen:  # (a clock set back): the maximum may drop
                stale = True
            inv.last_at = last_at
        if stale:
            self._recount()

    def _count(self, inv: _Inv) -> None:
        o = inv.outcome
        self.counts[o] = self.counts.get(o, 0) + 1
        if inv.attested:
            self.attested[o] = self.attested.get(o, 0) + 1
        if inv.pos < self.minpos.get(o, inv.pos + 1):
            self.minpos[o] = inv.pos

    def _recount(self) -> None:
        self.counts, self.minpos, self.attested = {}, {}, {}
        self.last_seen = self.members[0].last_at
        for inv in self.members:
            self._count(inv)
            if inv.last_at > self.last_seen:
                self.last_seen = inv.last_at

    def entry_of(self, ok: dict[str | None, bool]) -> tuple[int, dict[str, Any]] | None:
        """``entry`` of its invocations on a target ``ok`` says yes only (``_by_session`` over
        the view filtered so), and the pos of the first of them (the filtered view's order of
        sessions); None when there are none.  The whole entry when every one is."""
        if all(ok[t] for t in self.targets):
            return self.members[0].pos, self.entry()
        shown = [inv for inv in self.members if ok[inv.target]]
        if not shown:
            return None
        outcomes: dict[str, int] = {}
        attested: dict[str, int] = {}
        for inv in shown:  # (in order of first event: outcomes in order of first appearance)
            outcomes[inv.outcome] = outcomes.get(inv.outcome, 0) + 1
            if inv.attested:
                attested[inv.outcome] = attested.get(inv.outcome, 0) + 1
        return shown[0].pos, {
            "session": self.name,
            "actions": len(shown),
            "outcomes": outcomes,
            "attested": attested_counts(outcomes, attested),
            "first_seen": min(inv.first_at for inv in shown),
            "last_seen": max(inv.last_at for inv in shown),
        }

    def entry(self) -> dict[str, Any]:
        """As ``reader_views._by_session`` builds it (outcomes in order of first appearance)."""
        order = sorted(self.counts, key=self.minpos.__getitem__)
        outcomes = {o: self.counts[o] for o in order}
        return {
            "session": self.name,
            "actions": self.actions,
            "outcomes": outcomes,
            "attested": attested_counts(outcomes, self.attested),
            "first_seen": self.first_seen,
            "last_seen": self.last_seen,
        }


class _State:
    __slots__ = (
        "by_target",
        "hash",
        "invs",
        "keys",
        "newest",
        "sessions",
        "tallies",
        "targets",
        "through",
        "touched",
    )

    def __init__(self) -> None:
        self.through = 0
        self.hash: str | None = None
        self.invs: dict[str, _Inv] = {}
        """Every invocation, in the view's order (``pos``): ``_update`` adds the new ones, in
        order, after every kept one (their first event is past ``through``)."""
        self.targets: dict[str | None, list[_Inv]] = {}
        """The invocations on each target, in the view's order (a caller's page:
        ``readable_page`` merges the readable targets' from the newest back, never scanning
        the invocations it does not show)."""
        self.sessions: dict[str | None, _Session] = {}
        self.tallies: dict[Hashable, int] = {}
        """How many invocations have each tally."""
        self.by_target: dict[str | None, dict[Hashable, int]] = {}
        """``tallies`` of each target's invocations (a caller's metrics: ``tallies``)."""
        self.keys: dict[Hashable, Hashable] = {}
        """Each distinct tally, once: an invocation holds that one, not a copy."""
        self.newest = NewestSessions()
        """The sessions by when they were seen last (a page of the newest: ``session_page``)."""
        self.touched: set[_Session] = set()
        """Sessions added or changed since ``newest`` was last told (``settle``)."""

    def settle(self) -> None:
        """Tell ``newest`` of the sessions added or changed since it was last told."""
        self.newest.moved(self.touched, len(self.sessions))
        self.touched.clear()

    def retally(self, inv: _Inv, new: Hashable) -> None:
        """``inv`` (counted, or new: its ``tally`` None) has the tally ``new`` now."""
        old = inv.tally
        if old is None and new is None:
            return
        mine = self.by_target.setdefault(inv.target, {})
        for tallies in (self.tallies, mine):
            if old is not None:
                tallies[old] -= 1
                if tallies[old] == 0:
                    del tallies[old]
            if new is not None:
                new = self.keys.setdefault(new, new)
                tallies[new] = tallies.get(new, 0) + 1
        inv.tally = new

    def add(self, iid: str, inv: _Inv, first_at: float, tally: Hashable) -> None:
        self.invs[iid] = inv
        self.targets.setdefault(inv.target, []).append(inv)
        self.retally(inv, tally)
        s = self.sessions.get(inv.session)
        if s is None:
            s = _Session(inv.session, first_at, inv.last_at, len(self.sessions))
            self.sessions[inv.session] = s
        s.add(inv, first_at)
        self.touched.add(s)


@dataclasses.dataclass(frozen=True)
class AsOf:
    """What a kept answer is as of: ``through``, the last journal seq folded into it (rows
    before it were read when they were folded, not since); of the last whole verify the summary
    was told of (None: none since it was made), when it started reading
    (``verified_started_at``: what it proves is the rows as they were then, in its snapshot)
    and when it completed (``verified_at``), whether it found the journal intact
    (``verified_ok``) and through which seq (``verified_through``: the rows before the first
    bad one when broken)."""

    through: int
    verified_started_at: float | None
    verified_at: float | None
    verified_through: int | None
    verified_ok: bool | None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Page(NamedTuple):
    """``SessionSummary.readable_page``'s answer: the page's invocations, each as ``(id, the
    seq of its first event, its target)``, in the view's order; how many there are in all;
    the seq the summary was brought to (the rows to fold them through)."""

    shown: tuple[tuple[str, int, str | None], ...]
    total: int
    through: int


class SessionSummary:
    """``JournalReader.sessions``' answer, kept (``JournalReader.summarized_sessions``) --
    and, given ``tally`` (what a view counts of a record: ``views.metrics_key``), how many
    records have each tally (``JournalReader.summarized_tallies``).  One per daemon; the
    threads that read it take turns."""

    def __init__(self, tally: Callable[[Record], Hashable] | None = None) -> None:
        self._lock = threading.Lock()
        self._state = _State()
        self._tally = tally
        self._verified: tuple[float, float, int, bool] | None = None
        """The last whole verify told of (``verified``): when it started and completed,
        through, intact."""

    def sessions(
        self, tables: Tables, now: float, readable: Callable[[str | None], bool] | None = None
    ) -> tuple[list[dict[str, Any]], AsOf]:
        """Brought up to the head, then its entries and what they are as of (taken under the
        lock with them: another thread's answer is its own).  ``readable`` (a caller's
        sessions: the daemon's ``/v1/sessions``): the entries of the view filtered to the
        invocations on a target it accepts (asked once per target) -- a session with none of
        them left out, a session with some counted over those only (O(its invocations)).
        Call inside one read transaction."""
        with self._lock:
            state = self._refresh(tables, now)
            as_of = self._as_of(state)
            return _entries(state, _asked(readable, state.targets)), as_of

    def session_page(
        self,
        tables: Tables,
        now: float,
        limit: int,
        readable: Callable[[str | None], bool] | None = None,
    ) -> tuple[dict[str, Any], AsOf]:
        """``newest_page(sessions(tables, now, readable)[0], limit)`` and what it is as of:
        the ``limit`` sessions seen last, from the kept order (``NewestSessions``: only the
        entries shown are built, O(limit x log sessions)) -- unless ``readable`` refuses a
        target some invocation is on: a session's entry is then of its readable invocations
        only, whose last time the kept order does not hold, and every entry is built and
        sorted (O(sessions)).  Call inside one read transaction."""
        with self._lock:
            state = self._refresh(tables, now)
            as_of = self._as_of(state)
            ok = _asked(readable, state.targets)
            if ok is None:
                page = state.newest.page(limit, len(state.sessions), state.sessions.values)
                return page, as_of
            return newest_page(_entries(state, ok), limit), as_of

    def tallies(
        self,
        tables: Tables,
        now: float,
        since: float | None = None,
        session: str | None = None,
        readable: Callable[[str | None], bool] | None = None,
    ) -> tuple[dict[Hashable, int], AsOf]:
        """Brought up to the head, then how many records have each tally -- of those whose
        first event is at ``since`` or later, if given (``JournalReader.iter_actions``'
        ``since``: O(invocations) in memory, no row read but the changed ones'), of
        ``session``'s records only, if given (``iter_actions``' ``session``: every event of an
        invocation carries its session; O(the session's invocations)), of the records on a
        target ``readable`` accepts only, if given (a caller's metrics: asked once per target;
        without another filter a sum of the kept tallies per target) -- and what they are as
        of, as ``sessions``."""
        with self._lock:
            state = self._refresh(tables, now)
            as_of = self._as_of(state)
            ok = _asked(readable, state.targets)
            if since is None and session is None:
                if ok is None:
                    return dict(state.tallies), as_of
                out: dict[Hashable, int] = {}
                for target, tallies in state.by_target.items():
                    if ok[target]:
                        for key, n in tallies.items():
                            out[key] = out.get(key, 0) + n
                return out, as_of
            if session is None:
                invs: Iterable[_Inv] = state.invs.values()
            else:
                member = state.sessions.get(session)
                invs = () if member is None else member.members
            out = {}
            for inv in invs:
                if ok is not None and not ok[inv.target]:
                    continue
                if (since is None or inv.first_at >= since) and inv.tally is not None:
                    out[inv.tally] = out.get(inv.tally, 0) + 1
            return out, as_of

    @property
    def kept(self) -> bool:
        """Whether a fold is kept (read without the lock: a hint, not a promise -- a session's
        counts are not worth the whole journal's first fold: ``JournalReader`` folds the
        session alone until another view has made one)."""
        return self._state.through != 0

    def tallies_of(self, records: Iterable[Record]) -> dict[Hashable, int]:
        """How many of ``records`` (folded now, not kept) have each tally: no ``AsOf`` -- the
        answer is of every row as it is."""
        tally = self._tally
        if tally is None:
            raise ValueError("this summary keeps no tallies")
        out: dict[Hashable, int] = {}
        for rec in records:
            key = tally(rec)
            if key is not None:
                out[key] = out.get(key, 0) + 1
        return out

    def verified(self, at: float, through: int, ok: bool, *, started: float) -> None:
        """A whole verify that started reading at ``started`` completed at ``at``, through
        seq ``through``: the kept answers say so from now on; one that found a row altered
        (not ``ok``) has the whole journal folded again at the next request (``forget``)."""
        with self._lock:
            self._verified = (started, at, through, ok)
            if not ok:
                self._state = _State()

    def forget(self) -> None:
        """Fold the whole journal again at the next request: a verify found a row altered,
        and a row before the seq folded through is not read again otherwise."""
        with self._lock:
            self._state = _State()

    def _as_of(self, state: _State) -> AsOf:
        """What an answer from ``state`` is as of (called holding the lock)."""
        started, at, through, ok = self._verified or (None, None, None, None)
        return AsOf(state.through, started, at, through, ok)

    def count(self, tables: Tables, now: float) -> int | None:
        """How many invocations the journal has, brought up to the head -- None when nothing
        is kept yet (the first fold is the whole journal's: a caller that needs only the count
        counts in the database instead), or when another thread holds the summary (it may be
        folding the whole journal: a count does not wait for that), or when ``tables``' snapshot
        is behind the head it was brought to (another request, in a newer snapshot, refreshed
        it since this one's began: ``JournalReader.summarized_page`` reads the tallies, then the
        count -- not a journal rewound, and a count is never a whole fold), or when bringing it
        up meets an altered row: a count stands in for counting in the database and answers
        what that count answers (``views.newest`` reads no row of a record it does not show);
        a view that reads that row refuses it there."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if self._state.through == 0 or tables.head()[0] < self._state.through:
                return None
            try:
                return len(self._refresh(tables, now).invs)
            except AlteredRow:  # (nothing answered from it: the next refresh reads the same rows)
                return None
        finally:
            self._lock.release()

    def readable_page(
        self,
        tables: Tables,
        now: float,
        readable: Callable[[str | None], bool],
        limit: int,
        session: str | None = None,
    ) -> Page:
        """Brought up to the head (folded whole first, when nothing is kept yet), then a
        caller's actions page as kept: the last ``limit`` invocations (of ``session``'s, if
        given) on a target ``readable`` accepts, in the view's order, and how many such
        invocations there are -- ``JournalReader.newest_readable`` folds those alone and
        checks them against what is kept here.  ``readable`` is asked once per distinct target
        (the total is a sum over targets; the page merges the readable targets' invocations
        from the newest back until ``limit`` are found: O(limit x log targets), never the
        invocations on a target it refuses).  Call inside one read transaction."""
        if limit < 0:
            raise ValueError("limit must be >= 0")
        with self._lock:
            state = self._refresh(tables, now)
            if session is None:
                by_target = state.targets
            else:
                member = state.sessions.get(session)
                if member is None:
                    return Page((), 0, state.through)
                by_target = member.targets
            ok = _ask(readable, by_target)
            lists = [invs for target, invs in by_target.items() if ok[target]]
            total = sum(map(len, lists))
            newest = heapq.merge(*map(reversed, lists), key=_newest_first)
            shown = [(inv.iid, inv.pos, inv.target) for inv in itertools.islice(newest, limit)]
            shown.reverse()
            return Page(tuple(shown), total, state.through)

    def _refresh(self, tables: Tables, now: float) -> _State:
        head, head_hash = tables.head()
        state = self._state
        if state.through and (head < state.through or tables.hash_at(state.through) != state.hash):
            state = _State()  # rewound or replaced: what was folded is not this journal's
        if state.through == 0:
            state = self._build(tables, head, now)
        elif head > state.through:
            try:
                self._update(state, tables, head, now)
            except _Rebuild:
                state = self._build(tables, head, now)
        state.through, state.hash = head, head_hash
        state.settle()
        self._state = state
        return state

    def _build(self, tables: Tables, head: int, now: float) -> _State:
        state = _State()
        rows = tables.grouped_events(None)
        try:
            for iid, inv, first_at, tally in _folded(_through(rows, head), now, self._tally):
                state.add(iid, inv, first_at, tally)
        finally:
            close_rows(rows)
        return state

    def _update(self, state: _State, tables: Tables, head: int, now: float) -> None:
        """Re-fold the invocations with an event in ``(through, head]``; ``state`` is changed
        only once every one of them folded and none needs the whole journal folded again
        (``_Rebuild``: a fold that may meet an altered row and fail -- ``state``, the kept one,
        must then be as it was, not half brought up while it still says the old seq)."""
        touched = sorted(tables.touched_after(state.through))
        folded: list[tuple[str, _Inv, float, Hashable]] = []
        for i in range(0, len(touched), _BATCH):
            rows = tables.fold_rows_of(touched[i : i + _BATCH], head)
            try:
                folded.extend(_folded(rows, now, self._tally))
            finally:
                close_rows(rows)
        fresh, seen = [], []
        for iid, inv, first_at, tally in folded:  # (decided whole before anything changes:
            known = state.invs.get(iid)  # a rebuild that fails leaves ``state`` as it was)
            if known is None:
                fresh.append((iid, inv, first_at, tally))
            elif (known.session, known.pos, known.first_at, known.target) != (
                inv.session,
                inv.pos,
                first_at,
                inv.target,
            ):
                raise _Rebuild  # not how the broker writes (a row altered): fold it all again
            else:
                seen.append((known, inv, tally))
        for known, inv, tally in seen:
            member = state.sessions[known.session]
            member.change(known, inv.outcome, inv.attested, inv.last_at)
            state.touched.add(member)
            if tally != known.tally:
                state.retally(known, tally)
        fresh.sort(key=lambda f: f[1].pos)
        for iid, inv, first_at, tally in fresh:
            state.add(iid, inv, first_at, tally)


class _Rebuild(Exception):
    pass


def attested_counts(outcomes: dict[str, int], attested: dict[str, int]) -> dict[str, int]:
    """A sessions entry's ``attested``: of each outcome's count in ``outcomes``, how many rest
    on an operator's attestation (``statemachine.attested``), in ``outcomes``' order; none
    attested: ``{}``."""
    if not attested:  # (nearly every session: no dict walked per entry of a page)
        return {}
    return {o: attested[o] for o in outcomes if attested.get(o)}


def _entries(state: _State, ok: dict[str | None, bool] | None) -> list[dict[str, Any]]:
    """The sessions' entries in the view's order; ``ok`` (``_asked``): of the invocations on a
    target it says yes to only, a session with none of them left out."""
    if ok is None:
        return [s.entry() for s in state.sessions.values()]
    shown = [e for s in state.sessions.values() if (e := s.entry_of(ok)) is not None]
    shown.sort(key=lambda e: e[0])  # (the filtered view's order of first appearance)
    return [entry for _, entry in shown]


def _newest_first(inv: _Inv) -> int:
    return -inv.pos


def _asked(
    readable: Callable[[str | None], bool] | None, targets: Iterable[str | None]
) -> dict[str | None, bool] | None:
    """What ``readable`` says of each of ``targets``, asked once each; None when there is no
    ``readable`` or it accepts every one (the whole view's answer then)."""
    if readable is None:
        return None
    ok = _ask(readable, targets)
    return None if all(ok.values()) else ok


def _ask(
    readable: Callable[[str | None], bool], targets: Iterable[str | None]
) -> dict[str | None, bool]:
    """What ``readable`` says of each of ``targets``, asked once each."""
    return {target: bool(readable(target)) for target in targets}


def _through(rows: Iterable[Any], head: int) -> Iterator[Any]:
    """The rows up to ``head`` (a row whose seq is not a number is passed on: the fold says
    it was altered)."""
    for row in rows:
        seq = row[0]
        if type(seq) is not int or seq <= head:
            yield row


def _folded(
    rows: Iterable[Any], now: float, tally: Callable[[Record], Hashable] | None
) -> Iterator[tuple[str, _Inv, float, Hashable]]:
    """Each run of ``rows`` (``FOLD_COLUMNS``, grouped by invocation, by seq within one) as
    the invocation's ``_Inv``, its first event's time and its record's tally -- folded as
    ``views.fold_each`` folds it."""
    first: list[int] = []
    try:
        runs = fold_runs(fold_events(noting_firsts(rows, first)))
        for n, (p, first_at, last_at) in enumerate(runs):
            rec = p.last_record(now)
            # (every event has its time: ``fold_events`` refuses a row without)
            at0 = first_at if first_at is not None else 0.0
            at1 = last_at if last_at is not None else 0.0
            # (a few targets, one string each: not one per invocation held)
            target = None if rec.target is None else sys.intern(rec.target)
            iid = rec.invocation_id
            outcome = rec.outcome.value
            inv = _Inv(iid, first[n], rec.session, outcome, at0, at1, target, attested(rec))
            yield iid, inv, at0, None if tally is None else tally(rec)
    except ImpossibleEvent as exc:  # stored events the broker could not have written
        raise unfoldable(exc) from None
