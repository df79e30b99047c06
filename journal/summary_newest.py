"""A page of the sessions view -- the ``limit`` sessions seen last, in the view's order -- kept
ready in a ``SessionSummary`` instead of built per request.

A caller names its sessions (an agent, as many as it likes): each visit of ``/v1/sessions`` or
the console's journal page built every session's entry and sorted them all to show the newest
few hundred (76-195 ms a visit at 50k sessions, audit 49).  ``NewestSessions`` keeps the
sessions ordered by ``(last_seen, order)`` in a heap whose entries are pushed when a session's
``last_seen`` changes (a session's earlier entries go stale, skipped and dropped when met), so
a page costs O(limit x log sessions) however many sessions there are.  The order is the one
``newest_page`` sorts by, and a page equals ``newest_page`` of every entry
(tests/journal/conformance/test_session_summary.py).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import Any, Protocol

__all__ = ["NewestSessions", "newest_page"]


def newest_page(sessions: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """A page of ``JournalReader.sessions``: the ``limit`` seen last (``last_seen``; the later
    one of a tie), in the reader's order -- ``{"sessions", "limit", "total", "truncated"}``.
    A caller names its sessions (an agent, as many as it likes): an answer holds a page."""
    shown = sessions
    if len(sessions) > limit:
        order = sorted(range(len(sessions)), key=lambda i: (sessions[i].get("last_seen") or 0, i))
        keep = sorted(order[len(order) - limit :])
        shown = [sessions[i] for i in keep]
    return _page(shown, limit, len(sessions))


def _page(shown: list[dict[str, Any]], limit: int, total: int) -> dict[str, Any]:
    return {"sessions": shown, "limit": limit, "total": total, "truncated": len(shown) < total}


class Kept(Protocol):
    """What ``NewestSessions`` orders: a session's place in the view (``order``: its index in
    order of first appearance, never changing) and when it was seen last."""

    order: int
    last_seen: float
    stamp: int
    """Which of its heap entries is current (``NewestSessions`` numbers them; 0: none yet)."""
    heaped: float | None
    """Its ``last_seen`` in that entry."""

    def entry(self) -> dict[str, Any]: ...


class NewestSessions:
    """Every session in a max-heap by ``(last_seen, order)``: ``moved`` after a session's
    ``last_seen`` changed or it was added, ``page`` for the newest ``limit``.  Entries are
    ``(-last_seen, -order, stamp, session)``: a session's current entry is the one carrying its
    ``stamp``; the others are stale and are dropped when a page meets them, or when they
    outnumber the sessions (the heap made again: amortised O(1) a move)."""

    __slots__ = ("_heap", "_next")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, Any]] = []
        self._next = 0

    def moved(self, sessions: Iterable[Kept], count: int) -> None:
        """Bring ``sessions`` (added, or whose ``last_seen`` may have changed) into the
        order; ``count``: how many sessions there are in all."""
        for s in sessions:
            if s.stamp and s.heaped == s.last_seen:
                continue
            s.heaped = s.last_seen
            self._next += 1
            s.stamp = self._next
            heapq.heappush(self._heap, (-s.last_seen, -s.order, s.stamp, s))
        if len(self._heap) > 2 * count + 64:
            live = [e for e in self._heap if e[3].stamp == e[2]]
            heapq.heapify(live)
            self._heap = live

    def page(self, limit: int, total: int, every: Callable[[], Iterable[Kept]]) -> dict[str, Any]:
        """``newest_page`` of the ``total`` sessions' entries, reading only those shown;
        ``every``: all of them in the view's order (a page holding every session).  A
        ``limit`` below 0 shows none, as ``newest_page``'s."""
        if total <= limit:
            return _page([s.entry() for s in every()], limit, total)
        heap, found = self._heap, list[tuple[float, int, int, Any]]()
        while heap and len(found) < limit:
            entry = heapq.heappop(heap)
            if entry[3].stamp == entry[2]:
                found.append(entry)
        for entry in found:
            heapq.heappush(heap, entry)
        shown = sorted((e[3] for e in found), key=_in_order)
        return _page([s.entry() for s in shown], limit, total)


def _in_order(s: Kept) -> int:
    return s.order
