"""The broker's idle view readers (``Broker.view``): read-only ``JournalReader`` s kept open
between views, so a view does not open a connection of its own -- on PostgreSQL a new session
and its set-up queries -- for every record or page a caller asks for.

A reader is taken by one view thread at a time and given back after a clean read, reset to what
a new reader knows (``JournalReader.reset``: no snapshot, key or proof carried into the next
read); one whose read raised (a lost connection, an altered row, anything) or whose view was
abandoned is closed instead.  An idle reader taken again is first checked to be reading what
a new one would (``JournalReader.fresh``: the same file, the same recorded schema -- a stat
and a header read on SQLite, one query on PostgreSQL); one that is not is closed and a new one
opened, whose own checks then answer (a journal upgraded by a newer broker is refused, a
removed file is "no journal").  The broker's pool also checks, before a reader is opened, after,
and with every check of an idle one, that the path still names the file its writer writes
(``writer_file``: ``Backend.require_writer_file``): a SQLite file replaced or removed under a
running broker is refused (``JournalReplaced``, 503 ``JOURNAL_REPLACED``), never read in the
writer's place.  At most ``keep`` (the returning view's limiter's threads) wait
idle, none longer than ``IDLE_FOR`` (``prune``, on every take and give-back and from the
daemon's upkeep): a quiet daemon holds no database sessions and no descriptor of a journal
file replaced or removed meanwhile.  Each reader waits at most ``VIEW_WAIT`` for a lock another
session holds (``lock_wait``), then the database declines the read (``ReadFailed``, 503
``JOURNAL_READ_DECLINED``).  ``close`` (the broker's) closes the idle ones, and a reader given
back after it is closed there and then -- never kept, never used after."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from typing import Protocol

import trio

from affidavit.journal import JournalReader, ReadFailed

__all__ = ["IDLE_FOR", "VIEW_WAIT", "BoundedTurn", "ThreadTurn", "ViewReaders"]

IDLE_FOR = 60.0
"""Seconds an idle reader is kept at most (then closed by the next ``prune``)."""

FRESH_FOR = 1.0
"""Seconds a reader's check (``JournalReader.fresh``, or its opening) holds: one taken again
within them is not checked again -- on PostgreSQL the check is a query, ~1 in 7 of a record
view's, paid at most once a second per reader under load.  A view then reads with what was
checked at most this long ago, as a new reader opened that long ago and reading since would."""

VIEW_WAIT = 10.0
"""Seconds a view waits at most -- for one of its limiter's threads (``Broker.view``), for the
kept views' turn (the daemon's ``read_summarized``), for a lock the database holds on what it
reads (``lock_wait``) -- before it is answered ``JOURNAL_READ_DECLINED`` (503, ``Retry-After``):
a caller holding every view thread, or a session holding a lock, parks no other request.  A
view's long scan is not cut short: a read that is under way is its right."""


class ViewReaders:
    """Idle read-only readers of one journal; thread-safe (taken and given back in view
    threads, pruned and closed on the event loop)."""

    def __init__(
        self,
        location: str | os.PathLike[str],
        key_file: str | os.PathLike[str] | None,
        *,
        lock_wait: float | None = VIEW_WAIT,
        idle_for: float | None = None,
        fresh_for: float = FRESH_FOR,
        clock: Callable[[], float] = time.monotonic,
        writer_file: Callable[[], None] | None = None,
    ) -> None:
        self._location = location
        self._writer_file = writer_file
        """The writing journal's ``Backend.require_writer_file`` (the broker's): run with every
        check of a reader -- before one is opened, after, and when an idle one is checked
        again -- so a view never reads a file put in the writer's place (``JournalReplaced``)."""
        self._key_file = key_file
        self._lock_wait = lock_wait
        self._idle_for = IDLE_FOR if idle_for is None else idle_for
        self._fresh_for = fresh_for
        self._clock = clock
        self._lock = threading.Lock()
        self._idle: list[tuple[JournalReader, float]] = []
        """Idle readers and when each was given back, oldest first (taken from the end)."""
        self._checked: dict[int, float] = {}
        """By reader (its id, while open): when it was last checked, or opened."""
        self._closed = False
        self.opened = 0
        """Readers opened so far (each a connection: the pool's measure)."""

    def take(self) -> JournalReader:
        """An idle reader still reading what a new one would, else a new one (``JournalError``
        as ``JournalReader.open`` raises)."""
        with self._lock:
            stale = self._stale()
            reader = self._idle.pop()[0] if self._idle else None
        for old in stale:
            self.discard(old)
        check = self._writer_file
        if reader is not None:
            now = self._clock()
            if now - self._checked.get(id(reader), -float("inf")) < self._fresh_for:
                return reader
            try:
                if check is not None:
                    check()
                fresh = reader.fresh()
            except BaseException:
                self.discard(reader)
                raise
            if fresh:
                self._checked[id(reader)] = now
                return reader
            self.discard(reader)
        if check is not None:
            check()  # nothing opened by the path unless it names the writer's file
        reader = JournalReader.open(
            self._location, key_file=self._key_file, lock_wait=self._lock_wait
        )
        if check is not None:
            try:
                check()  # (replaced while it opened: the file it opened may be the new one)
            except BaseException:
                self.discard(reader)
                raise
        with self._lock:
            self.opened += 1
            self._checked[id(reader)] = self._clock()
        return reader

    def give_back(self, reader: JournalReader, keep: int) -> None:
        """``reader`` after a clean read: kept for the next view if it resets cleanly, fewer
        than ``keep`` wait and the pool is open; else closed."""
        try:
            reader.reset()
        except Exception:
            self.discard(reader)
            return
        with self._lock:
            stale = self._stale()
            kept = not self._closed and len(self._idle) < keep
            if kept:
                self._idle.append((reader, self._clock()))
        for old in stale:
            self.discard(old)
        if not kept:
            self.discard(reader)

    @property
    def idle_for(self) -> float:
        return self._idle_for

    def prune(self) -> int:
        """Close the readers idle longer than ``idle_for``; how many."""
        with self._lock:
            stale = self._stale()
        for old in stale:
            self.discard(old)
        return len(stale)

    def _stale(self) -> list[JournalReader]:
        """(Under the lock.)  The readers idle too long, taken out of the pool."""
        since = self._clock() - self._idle_for
        cut = 0
        while cut < len(self._idle) and self._idle[cut][1] <= since:
            cut += 1
        stale = [reader for reader, _ in self._idle[:cut]]
        del self._idle[:cut]
        return stale

    def discard(self, reader: JournalReader) -> None:
        self._checked.pop(id(reader), None)
        with contextlib.suppress(Exception):
            reader.close()

    def idle(self) -> int:
        with self._lock:
            return len(self._idle)

    def close(self) -> None:
        """Every idle reader closed; one given back later is closed then."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for reader, _ in idle:
            self.discard(reader)


class ThreadTurn(Protocol):
    """A view's wait for a thread as ``trio.to_thread.run_sync`` takes one (its ``limiter``),
    bounded (a wait past its bound raises ``ReadFailed``), and how many threads it shares out
    (``total_tokens``): ``BoundedTurn``, or the daemon's fair share of them
    (``affidavit.daemon.shares.Place``)."""

    @property
    def total_tokens(self) -> float: ...

    async def acquire_on_behalf_of(self, borrower: object) -> None: ...

    def release_on_behalf_of(self, borrower: object) -> None: ...


class BoundedTurn:
    """``limiter`` as ``trio.to_thread.run_sync`` takes one, its wait for a thread bounded:
    after ``wait`` seconds a view is declined (``ReadFailed``: every view thread stayed busy)
    instead of waiting as long as the views that hold them read.  A thread it got is released
    by trio when the thread ends -- an abandoned view's too (``Broker.view``)."""

    def __init__(self, limiter: trio.CapacityLimiter, wait: float) -> None:
        self._limiter = limiter
        self._wait = wait

    @property
    def total_tokens(self) -> float:
        return self._limiter.total_tokens

    async def acquire_on_behalf_of(self, borrower: object) -> None:
        with trio.move_on_after(self._wait):
            await self._limiter.acquire_on_behalf_of(borrower)
            return
        raise busy(self._wait, "every view thread")

    def release_on_behalf_of(self, borrower: object) -> None:
        self._limiter.release_on_behalf_of(borrower)


def busy(wait: float, what: str) -> ReadFailed:
    """The refusal of a view that waited ``wait`` seconds for ``what`` in vain: nothing was
    read, nothing is known to be wrong with the journal (503 ``JOURNAL_READ_DECLINED``)."""
    return ReadFailed(f"the journal was not read: {what} stayed busy for {wait:g} s")
