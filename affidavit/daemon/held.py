"""Bytes a listener holds in memory at once, shared out by peer as its connections are
(``admission.Server``): its answers (``ANSWER_BUDGET``) and its request bodies
(``BODY_BUDGET``).  One ``Shares`` per budget -- one rule for both:

* ``budget`` bytes in all;
* no one uid more than ``per_uid`` (half by default);
* the peers who are not operators (not ``reserved``: ``other``) no more than ``others``
  together (half), and one uid of theirs no more than ``per_other`` (a quarter of that).

A share is never less than ``least`` (within what holds it): the largest single piece one
peer must always be able to hold -- a request body of ``max_body`` bytes -- or a uid could
never send one.  ~164 slow readers of one uid held the whole answer budget (audit 50);
17 connections of one uid dripping 16 MiB bodies held the whole body budget, and every other
uid's call over 64 KiB was 503 for as long as they dripped (audit 53)."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["OTHER_SHARES", "Shares"]

OTHER_SHARES = 4
"""Where operators are configured, one uid that is not an operator holds at most this part of
what the peers who are not operators may hold together (``admission``'s module docstring says
why a fixed part)."""


class Shares:
    """A budget of bytes held at once, shared out by uid (the module docstring)."""

    def __init__(
        self,
        budget: int,
        per_uid: int | None = None,
        others: int | None = None,
        per_other: int | None = None,
        *,
        least: int = 0,
    ) -> None:
        floor = min(least, budget)
        self.budget = budget
        self.per_uid = max(budget // 2, floor) if per_uid is None else per_uid
        """Bytes one peer uid may hold at once (half the budget unless given)."""
        self.others = max(budget // 2, floor) if others is None else others
        """Bytes the peers not ``reserved`` hold together, at most (half)."""
        self.per_other = (
            max(1, self.others // OTHER_SHARES, min(least, self.others))
            if per_other is None
            else per_other
        )
        """Bytes one peer uid not ``reserved`` may hold at once (a quarter of ``others``
        unless given; none of this without a reserve)."""
        self.held = 0
        """Bytes held now."""
        self.others_held = 0
        """Of ``held``, those held for peers not ``reserved``."""
        self.by_uid: dict[int, int] = {}
        """Bytes held now, by peer uid (none listed with 0)."""

    def share(self, other: bool) -> int:
        """The bytes one uid may hold at once: ``per_uid``, and no more than ``per_other`` for
        a peer not ``reserved`` (``other``)."""
        return min(self.per_uid, self.per_other) if other else self.per_uid

    def most(self, other: bool) -> int:
        """The most one peer (``other``: one not ``reserved``) could ever be let hold: its
        uid's share, within the budget and the others' joint share."""
        most = min(self.budget, self.share(other))
        return min(most, self.others) if other else most

    def limit(self, full: str, other: bool) -> int:
        """The bytes of the share ``full`` names (``"all"``, ``"uid"``, ``"others"``)."""
        return {"all": self.budget, "uid": self.share(other), "others": self.others}[full]

    def full(
        self,
        n: int,
        uid: int,
        other: bool,
        waits: Mapping[int | str, int] | None = None,
        *,
        mine_first: bool = False,
    ) -> str | None:
        """None if ``n`` more bytes for peer ``uid`` fit in the budget, the uid's share and --
        ``other`` -- the joint share of the peers not reserved; else the one they do not fit
        in: ``"all"``, ``"uid"`` or ``"others"``.  A share named in ``waits`` (a uid,
        ``"others"``, ``"all"``) counts as full.  ``mine_first``: the uid's own share is named
        before the budget."""
        waits = waits or {}
        over_mine = bool(waits.get(uid)) or self.by_uid.get(uid, 0) + n > self.share(other)
        if mine_first and over_mine:
            return "uid"
        if waits.get("all") or self.held + n > self.budget:
            return "all"
        if over_mine:
            return "uid"
        if other and (waits.get("others") or self.others_held + n > self.others):
            return "others"
        return None

    def add(self, n: int, uid: int, other: bool) -> None:
        """Count ``n`` bytes as held for peer ``uid`` (checked by ``full`` first)."""
        self.held += n
        self.by_uid[uid] = self.by_uid.get(uid, 0) + n
        self.others_held += n if other else 0

    def drop(self, n: int, uid: int, other: bool) -> int:
        """``n`` bytes of peer ``uid``'s are no longer held: what the uid still holds."""
        self.held -= n
        self.others_held -= n if other else 0
        left = self.by_uid.get(uid, 0) - n
        if left:
            self.by_uid[uid] = left
        else:
            self.by_uid.pop(uid, None)
        return left
