"""Spells of refusals, logged as runs rather than one line each: the daemon's admission (a uid
turned away at its share of connections) and the console's (a peer presenting another's session)
both count them here -- a leaf, so the console need not import the daemon that serves it
(tests/test_layers.py)."""

from __future__ import annotations

from collections.abc import Hashable

REFUSED_QUIET = 60.0
"""A spell of refused peers ends once this many seconds pass without one (``_RefusedPeers``)."""


class UidSpells:
    """The uids turned away at their own share of connections (``Server``'s, ``ConsoleCap``'s):
    a spell each, logged at its start and at its end -- once the uid holds half its share or
    less, not at its first admission under it: a client reconnecting as fast as its
    connections close would otherwise make a line per connection.  The console's refusals of
    a peer presenting another's session (``Console._require_peer``) are spells too, by (peer
    uid, session), each ended once ``over``: no refusal of it for a while."""

    def __init__(self) -> None:
        self._turned_away: dict[Hashable, int] = {}
        """By uid (or key) in a spell: its connections turned away in it."""
        self._last: dict[Hashable, float] = {}
        """By key, when its spell's last was (those ``turned_away`` was told ``now`` of)."""

    def turned_away(self, uid: Hashable, now: float | None = None) -> bool:
        """One of ``uid``'s connections was turned away (or, ``Server._uid_evictions``, an idle
        one of its evicted), at ``now`` if given: whether a spell starts with it."""
        first = uid not in self._turned_away
        self._turned_away[uid] = self._turned_away.get(uid, 0) + 1
        if now is not None:
            self._last[uid] = now
        return first

    def over(self, now: float, quiet: float) -> list[tuple[Hashable, int]]:
        """The spells whose last was ``quiet`` seconds or more before ``now``, ended: (key,
        how many were turned away in it) each."""
        ended = [key for key, last in self._last.items() if now - last >= quiet]
        for key in ended:
            del self._last[key]
        return [(key, self._turned_away.pop(key, 0)) for key in ended]

    def left(self, uid: Hashable, held: int, share: int) -> int | None:
        """``uid`` holds ``held`` connections now, of ``share``: how many were turned away
        when its spell ends with this, else None."""
        if uid in self._turned_away and held <= share // 2:
            return self._turned_away.pop(uid)
        return None
