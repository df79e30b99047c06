"""The action and session views: every invocation's projected record, folded in one pass over
the events table.

Seed: "Sallyport's encrypted, hash-linked, write-only log, along with separate session and
action views, provides a durable place for these transitions."  Both views are folds of the
durable events -- nothing is stored twice, so a view can never disagree with the chain
``verify`` checks.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from affidavit.statemachine import ImpossibleEvent, Projector, Record, fold_runs

from .rows import close_rows, event_from_row, fold_events, noting_firsts, unfoldable
from .tables import Tables

__all__ = ["fold", "fold_each", "fold_listed", "newest"]

_BATCH = 500
"""Invocations whose events one statement reads (``fold_listed``)."""


def fold(
    tables: Tables, session: str | None, now: float
) -> list[tuple[Record, float | None, float | None]]:
    """(record, first_at, last_at) per invocation -- of ``session`` only, if given -- in order
    of first appearance; ``JournalReader.list_actions`` and ``sessions`` select and count.
    ``now``: when every record's retry hint is computed (the reader's clock, read once)."""
    cur = tables.scan_events(session)
    folds: dict[str, Projector] = {}
    first: dict[str, float | None] = {}
    last: dict[str, float | None] = {}
    get = folds.get
    apply = Projector.apply
    # No pause of the cyclic GC here (statemachine.project_all has one): the rows are read and
    # dropped one at a time, so there is no large list for a collection to re-walk -- with and
    # without a pause, 100k events fold in the same time (1.32 s vs 1.38 s, best of 5).
    # A row someone altered is an ``AlteredRow`` (``rows.event_from_row``).
    try:
        for row in cur:
            event = event_from_row(row)
            iid = event.invocation_id
            p = get(iid)
            if p is None:
                p = folds[iid] = Projector(iid)
                first[iid] = event.at
            apply(p, event)
            last[iid] = event.at
    except ImpossibleEvent as exc:  # stored events the broker could not have written
        raise unfoldable(exc) from None
    finally:
        close_rows(cur)
    return [(p.last_record(now), first[iid], last[iid]) for iid, p in folds.items()]


def fold_each(
    tables: Tables,
    session: str | None,
    now: float,
    span: tuple[int, int, int] | None = None,
) -> Iterator[tuple[Record, float | None, float | None]]:
    """``fold``'s entries one at a time, in the same order, holding one invocation's projection
    at a time (the rows come grouped by invocation): what a view streams over a journal of
    millions of events in bounded memory (issue 15: ``actions --json`` held 554 MB for 1M).
    ``span``: only the entries of ``Tables.grouped_span(*span)`` (no session filter)."""
    rows = tables.grouped_events(session) if span is None else tables.grouped_span(*span)
    try:
        for p, first, last in fold_runs(fold_events(rows)):
            yield p.last_record(now), first, last
    except ImpossibleEvent as exc:  # stored events the broker could not have written
        raise unfoldable(exc) from None
    finally:
        # A fold that fails (or a reader that stops) closes the statement now, while its
        # connection is open, not whenever the collector finds the cursor.
        close_rows(rows)


def newest(
    tables: Tables, limit: int, session: str | None, now: float, total: int | None = None
) -> tuple[list[Record], int]:
    """The last ``limit`` of ``fold_each``'s records (of ``session`` only, if given), in its
    order, and how many it has in all: ``fold_each`` cut to its tail without reading the rest
    (``Tables.newest_grouped``: the rows of the records shown, and a count in the database).
    Each record shown is folded from all its events as ``fold_each`` folds it, so an altered
    row among them is an ``AlteredRow`` here as there; one in a record not shown is not read
    (the record is counted, not shown).  ``total``: how many invocations there are, when it is
    known already (``SessionSummary.count``, read in the same snapshot): not counted again."""
    known = total
    if known is not None:  # counted already (a kept count, ``SessionSummary.count``)
        if session is not None:
            raise ValueError("a kept count is of every invocation")
        rows = tables.newest_page(limit)
    else:
        rows = tables.newest_grouped(limit, session)

    def strip(rows: Iterator[Any]) -> Iterator[Any]:
        nonlocal total
        for row in rows:
            if known is None:
                total = row[0]
            yield row[1:]

    try:
        records = [p.last_record(now) for p, _, _ in fold_runs(fold_events(strip(rows)))]
    except ImpossibleEvent as exc:  # stored events the broker could not have written
        raise unfoldable(exc) from None
    finally:
        close_rows(rows)
    if total is None:  # nothing to show: no invocation, or ``limit`` 0
        return records, tables.invocation_count(session)
    return records, int(total)


def fold_listed(
    tables: Tables, iids: Sequence[str], through: int, now: float
) -> dict[str, tuple[Record, int]]:
    """The records of ``iids`` as ``fold_each`` folds them, from their events up to seq
    ``through`` (``Tables.fold_rows_of``: their rows alone), each with the seq of its first
    event (its place in the view) -- by invocation id; an id with no event is left out.  A
    caller's page from a kept summary (``JournalReader.newest_readable``), which checks what
    it kept against these."""
    out: dict[str, tuple[Record, int]] = {}
    for i in range(0, len(iids), _BATCH):
        firsts: list[int] = []
        rows = tables.fold_rows_of(iids[i : i + _BATCH], through)
        try:
            runs = fold_runs(fold_events(noting_firsts(rows, firsts)))
            for n, (p, _, _) in enumerate(runs):
                rec = p.last_record(now)
                out[rec.invocation_id] = (rec, firsts[n])
        except ImpossibleEvent as exc:  # stored events the broker could not have written
            raise unfoldable(exc) from None
        finally:
            close_rows(rows)
    return out
