"""The action and session views as a reader answers them: folds over the events table
(``views.py``), filtered (``_select``), streamed in bounded memory (``iter_actions``), paged
(``newest_actions``), cut into spans several processes fold (``action_spans``), or brought up to
date from a ``SessionSummary``.  ``JournalReader`` (``reader.py``) is built on it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Generator, Hashable, Iterable, Iterator
from typing import Any

from affidavit.statemachine import Outcome, Phase, Record
from affidavit.statemachine import attested as is_attested

from . import views
from .errors import JournalUnavailable
from .reader_base import ReaderBase
from .rows import AlteredRow
from .summary import AsOf, Page, SessionSummary, attested_counts
from .tables import Tables

__all__ = ["ViewingReader"]


class ViewingReader(ReaderBase):
    """The action and session views."""

    def list_actions(
        self,
        session: str | None = None,
        outcome: Outcome | str | None = None,
        phase: Phase | str | None = None,
        since: float | None = None,
        until: float | None = None,
        now: float | None = None,
    ) -> list[Record]:
        """Projected records, oldest first.  ``since``/``until`` bound the time the action was
        accepted (a wall-clock label, inclusive).  ``now``: when every record's retry hint is
        computed (as ``record``: by default the reader's clock, read once for the whole view)."""
        at = self._now(now, "the actions view")
        folded = self._read(lambda t: views.fold(t, session, at), "the actions view")
        return [self.current(r, at) for r in _select(folded, outcome, phase, since, until)]

    def iter_actions(
        self,
        session: str | None = None,
        outcome: Outcome | str | None = None,
        phase: Phase | str | None = None,
        since: float | None = None,
        until: float | None = None,
        now: float | None = None,
        span: tuple[int, int, int] | None = None,
    ) -> Iterator[Record]:
        """``list_actions``' records one at a time, same order, in bounded memory: the database
        groups the rows by invocation and one projection is held at a time (``affidavit
        actions`` streams its output from this).  A database error while iterating is a
        ``JournalError`` (``JournalUnavailable`` when the connection was lost: a stream is not
        begun again).  ``span``: ``(first, before, through)`` from ``action_spans``, only
        those invocations' records (``session`` must be None).  ``now``: as ``list_actions``
        (one clock reading for the whole stream, taken when it starts)."""
        if span is not None and session is not None:
            raise ValueError("a span of the actions view takes no session filter")
        stream = self._iter_actions(session, outcome, phase, since, until, now, span)
        self._streams.add(stream)
        return stream

    def _iter_actions(
        self,
        session: str | None,
        outcome: Outcome | str | None,
        phase: Phase | str | None,
        since: float | None,
        until: float | None,
        now: float | None,
        span: tuple[int, int, int] | None,
    ) -> Generator[Record, None, None]:
        at = self._now(now, "the actions view")
        folded = views.fold_each(self.tables, session, at, span)
        try:
            unfiltered = outcome is None and phase is None and since is None and until is None
            if unfiltered and self.send_windows is None:
                # Every record as folded (``current`` is the record itself without send
                # windows): two calls fewer a record (issue 15, ``actions --json``).
                for record, _, _ in folded:
                    yield record
                return
            current = self.current
            for record in _select(folded, outcome, phase, since, until):
                yield current(record, at)
        except AlteredRow as exc:
            raise self._altered("the actions view", exc) from None
        except self.backend.errors as exc:
            error = self._error("the actions view", exc)
            if self.backend.lost(exc):  # the database gone mid-stream: away, not altered
                raise JournalUnavailable(str(error)) from None
            raise error from None

    def newest_actions(
        self,
        limit: int,
        session: str | None = None,
        now: float | None = None,
        summary: SessionSummary | None = None,
    ) -> tuple[list[Record], int]:
        """The last ``limit`` of ``iter_actions(session=session)``'s records, in its order, and
        how many it yields in all -- reading the rows of the records shown, not the journal
        (``views.newest``); ``now`` as ``list_actions``.  The actions page of the daemon,
        MCP and the console (``affidavit.views.actions_page``).  ``summary`` (no session):
        the count from it when it keeps one (``SessionSummary.count``), in the same snapshot,
        instead of counting every invocation in the database."""
        if limit < 0:
            raise ValueError("limit must be >= 0")
        at = self._now(now, "the actions view")
        if summary is None or session is not None:
            records, total = self._read(
                lambda t: views.newest(t, limit, session, at), "the actions view"
            )
        else:

            def run(t: Tables) -> tuple[list[Record], int]:
                with self.snapshot():
                    return views.newest(t, limit, None, at, summary.count(t, at))

            records, total = self._read(run, "the actions view")
        return [self.current(r, at) for r in records], total

    def newest_readable(
        self,
        limit: int,
        summary: SessionSummary,
        readable: Callable[[str | None], bool],
        now: float | None = None,
        session: str | None = None,
    ) -> tuple[list[Record], int] | None:
        """A caller's page: the last ``limit`` of ``iter_actions(session=session)``'s records
        on a target ``readable`` accepts, in its order, and how many there are -- found in
        ``summary`` brought to the head (``SessionSummary.readable_page``: a count per target,
        the page scanned back from the newest), then only those records folded from their
        rows (``views.fold_listed``), in the same snapshot.  The summary is derived, never
        evidence: a record whose fold is not what it kept (its first seq, target or session:
        a row altered since it was folded), or whose target ``readable`` refuses, is never
        answered from it -- the summary is forgotten (folded again at the next request) and
        the answer is None, as it is for a session's page while nothing is kept (a session is
        not worth the whole journal's first fold) and when the kept fold meets an altered row
        (it may be another session's): that page is the filtered stream
        (``views.actions_page``).  ``now`` as ``list_actions``."""
        if limit < 0:
            raise ValueError("limit must be >= 0")
        if session is not None and not summary.kept:
            return None
        at = self._now(now, "the actions view")

        def run(t: Tables) -> tuple[Page, dict[str, tuple[Record, int]]]:
            with self.snapshot():
                page = summary.readable_page(t, at, readable, limit, session)
                iids = [iid for iid, _, _ in page.shown]
                return page, views.fold_listed(t, iids, page.through, at)

        try:
            page, folded = self._read(run, "the actions view")
        except AlteredRow:
            if session is None:
                raise
            return None
        ok: dict[str | None, bool] = {}
        records = []
        for iid, pos, target in page.shown:
            rec, first = folded.get(iid, (None, None))
            if (
                rec is None
                or first != pos
                or rec.target != target
                or (session is not None and rec.session != session)
            ):
                summary.forget()  # (a row altered under it: fold it all again)
                return None
            if target not in ok:
                ok[target] = bool(readable(target))
            if not ok[target]:
                return None
            records.append(self.current(rec, at))
        return records, page.total

    def action_spans(self, parts: int, min_events: int) -> list[tuple[int, int, int]] | None:
        """``iter_actions`` (without a session filter) cut into ``parts`` spans of about as
        many invocations, each ``(first, before, through)``: their records, concatenated in
        this order, are ``iter_actions``' up to the journal's head now (``through``), so
        several processes may fold one each.  None for a journal of fewer than ``min_events``
        events, or one the backend cannot cut (only SQLite with a checked index can)."""
        cut = self._read(lambda t: t.action_spans(parts, min_events), "the actions view")
        if cut is None:
            return None
        cuts, through = cut
        return [(a, b, through) for a, b in itertools.pairwise(cuts)]

    def sessions(self) -> list[dict[str, Any]]:
        """One entry per session, in order of first appearance: its action count, counts by
        outcome, first and last seen.  Streamed (``views.fold_each``: one projection held at a
        time), so memory is O(sessions), never O(records) -- a caller names its sessions, a
        page of the newest is ``affidavit.views.newest_sessions``."""
        # Counts outcomes only: the hint is never shown, the time it is computed for is moot.
        at = self._clock()
        return self._read(lambda t: _by_session(views.fold_each(t, None, at)), "the sessions view")

    def summarized_sessions(
        self, summary: SessionSummary, readable: Callable[[str | None], bool] | None = None
    ) -> tuple[list[dict[str, Any]], AsOf]:
        """``sessions()``, from ``summary`` brought up to this journal's head (reading only
        the invocations with an event since it last read): the same entries, and what they
        are as of.  ``readable`` (a caller's: the daemon's ``/v1/sessions``): of the records on
        a target it accepts only, as ``sessions()`` of the view filtered so would be."""
        at = self._clock()

        def run(t: Tables) -> tuple[list[dict[str, Any]], AsOf]:
            with self.snapshot():
                return summary.sessions(t, at, readable)

        return self._read(run, "the sessions view")

    def summarized_session_page(
        self,
        summary: SessionSummary,
        limit: int,
        readable: Callable[[str | None], bool] | None = None,
    ) -> tuple[dict[str, Any], AsOf]:
        """A page of ``summarized_sessions`` -- the ``limit`` sessions seen last, in the view's
        order, ``{"sessions", "limit", "total", "truncated"}`` as ``summary_newest.newest_page``
        cuts it -- from the order ``summary`` keeps (``SessionSummary.session_page``: the
        entries shown are built, not every session's), and what it is as of."""
        at = self._clock()

        def run(t: Tables) -> tuple[dict[str, Any], AsOf]:
            with self.snapshot():
                return summary.session_page(t, at, limit, readable)

        return self._read(run, "the sessions view")

    def summarized_tallies(
        self,
        summary: SessionSummary,
        since: float | None = None,
        session: str | None = None,
        readable: Callable[[str | None], bool] | None = None,
    ) -> tuple[dict[Hashable, int], AsOf | None]:
        """How many records have each of ``summary``'s tallies, brought up to this journal's
        head as ``summarized_sessions``: ``views.metrics_of`` makes the metrics of the whole
        view from it (``views.metrics_key``: the same as ``metrics(iter_actions())``, or
        ``metrics(iter_actions(session=session, since=since))`` given either).  A session's
        are folded now (what they are as of: None) while nothing is kept, and when the kept
        fold meets an altered row (it may be another session's).  ``readable`` (a caller's:
        the daemon's ``/v1/metrics``): of the records on a target it accepts only."""
        at = self._clock()

        def folded_now() -> dict[Hashable, int]:
            records = self.iter_actions(session=session, since=since, now=at)
            if readable is not None:
                records = (r for r in records if readable(r.target))
            return summary.tallies_of(records)

        if session is not None and not summary.kept:  # (not the whole journal for a session)
            return folded_now(), None

        def run(t: Tables) -> tuple[dict[Hashable, int], AsOf]:
            with self.snapshot():
                return summary.tallies(t, at, since, session, readable)

        try:
            return self._read(run, "the actions view")  # (as ``iter_actions`` names it)
        except AlteredRow:
            if session is None:
                raise
            # The row the kept fold met altered may be another session's: this session's
            # records folded now, as ``iter_actions`` folds them (which fails if it is theirs).
            return folded_now(), None

    def summarized_page(
        self, summary: SessionSummary, limit: int
    ) -> tuple[dict[Hashable, int], list[Record], int, AsOf]:
        """``summarized_tallies`` and ``newest_actions(limit)`` read in one snapshot, so the
        counts and the page are of one journal head (the console's unfiltered actions page),
        and what the counts are as of."""
        if limit < 0:
            raise ValueError("limit must be >= 0")
        at = self._now(None, "the actions view")

        def run(t: Tables) -> tuple[dict[Hashable, int], list[Record], int, AsOf]:
            with self.snapshot():
                tallies, as_of = summary.tallies(t, at)
                records, total = views.newest(t, limit, None, at, summary.count(t, at))
                return tallies, [self.current(r, at) for r in records], total, as_of

        return self._read(run, "the actions view")


def _select(
    folded: Iterable[tuple[Record, float | None, float | None]],
    outcome: Outcome | str | None,
    phase: Phase | str | None,
    since: float | None,
    until: float | None,
) -> Iterator[Record]:
    """The actions view's filters over folded (record, first_at, last_at) entries."""
    want_outcome = Outcome(outcome) if outcome is not None else None
    want_phase = Phase(phase) if phase is not None else None
    for rec, first_at, _ in folded:
        if want_outcome is not None and rec.outcome is not want_outcome:
            continue
        if want_phase is not None and rec.phase is not want_phase:
            continue
        if since is not None and (first_at is None or first_at < since):
            continue
        if until is not None and (first_at is None or first_at > until):
            continue
        yield rec


def _by_session(
    folded: Iterable[tuple[Record, float | None, float | None]],
) -> list[dict[str, Any]]:
    """``JournalReader.sessions``' entries from a stream of ``(record, first_at, last_at)``."""
    by: dict[str | None, dict[str, Any]] = {}
    attested: dict[str | None, dict[str, int]] = {}
    for rec, first_at, last_at in folded:
        s = by.get(rec.session)
        if s is None:
            s = by[rec.session] = {
                "session": rec.session,
                "actions": 0,
                "outcomes": {},
                "attested": {},  # (filled at the end: in ``outcomes``' order)
                "first_seen": first_at,
                "last_seen": last_at,
            }
        s["actions"] += 1
        s["outcomes"][rec.outcome.value] = s["outcomes"].get(rec.outcome.value, 0) + 1
        if is_attested(rec):
            mine = attested.setdefault(rec.session, {})
            mine[rec.outcome.value] = mine.get(rec.outcome.value, 0) + 1
        if first_at is not None and (s["first_seen"] is None or first_at < s["first_seen"]):
            s["first_seen"] = first_at
        if last_at is not None and (s["last_seen"] is None or last_at > s["last_seen"]):
            s["last_seen"] = last_at
    for name, s in by.items():
        s["attested"] = attested_counts(s["outcomes"], attested.get(name, {}))
    return list(by.values())
