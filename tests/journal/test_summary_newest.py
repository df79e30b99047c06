"""``NewestSessions`` (journal/summary_newest.py) on its own: a page reads only the entries it
shows, equals ``newest_page`` of every entry however often the sessions moved, and the stale
heap entries those moves leave are dropped once they outnumber the sessions -- the heap stays
O(sessions), not O(moves)."""

from __future__ import annotations

import random
from typing import Any

from affidavit.journal.summary_newest import NewestSessions, newest_page


class _Kept:
    built = 0

    def __init__(self, order: int, last_seen: float) -> None:
        self.order, self.last_seen, self.stamp, self.heaped = order, last_seen, 0, None

    def entry(self) -> dict[str, Any]:
        _Kept.built += 1
        return {"session": f"s{self.order}", "last_seen": self.last_seen}


def test_moves_past_twice_the_sessions_drop_the_stale_entries_and_pages_stay_exact() -> None:
    rng = random.Random(49)
    sessions = [_Kept(i, float(rng.randrange(50))) for i in range(40)]
    newest = NewestSessions()
    newest.moved(sessions, len(sessions))
    largest = 0
    for _ in range(400):  # each a session seen again later (or, a clock set back, earlier)
        s = rng.choice(sessions)
        s.last_seen += rng.choice([1.0, 7.0, -3.0])
        newest.moved([s], len(sessions))
        largest = max(largest, len(newest._heap))
        for limit in (0, 1, 5):
            _Kept.built = 0
            page = newest.page(limit, len(sessions), lambda: sessions)
            assert _Kept.built == limit  # the entries shown, none other
            assert page == newest_page([k.entry() for k in sessions], limit)
    # 440 pushes in all: without the clean-up the heap would hold them all.
    assert largest <= 2 * len(sessions) + 64 + 1, largest
    assert len(newest._heap) < 2 * len(sessions) + 64


def test_a_session_moved_to_the_same_time_is_not_pushed_again() -> None:
    s = _Kept(0, 5.0)
    newest = NewestSessions()
    for _ in range(3):
        newest.moved([s], 1)
    assert len(newest._heap) == 1
