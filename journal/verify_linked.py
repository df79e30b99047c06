"""``verify``'s check of ``linked_calls`` against the events: one pass beside the walk.

The table is not chained, and a claim's check reads it alone (``Txn._attrs_naming``): a row of
it removed lets a claim naming a call an earlier row names be written; one added refuses nothing
a row does not name (the check decodes the row it points at) but is not what a writer made.  So
each row walked must have exactly its ``rows.index_keys`` in the table.  The table is read by
seq beside the events (``linked_calls_seq``), each seq's rows compared with that row's and let
go: what verify holds for it is one row's keys and the first mismatch of each kind, whatever
the journal's length (a set of every entry cost ~260 B each: 0.5 GB at a million rows).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .rows import index_keys
from .verify_codes import LINKED_CALL_MISSING, LINKED_CALLS_ALTERED

__all__ = ["LinkedCheck"]

_END = 2**63
"""A seq past every row: the stored rows are exhausted."""


class LinkedCheck:
    """Fed each intact row in seq order (``row``), then told where the intact rows end
    (``finish``); reports the first row the table lacks and the first it holds too many of."""

    def __init__(self, stored: Iterable[tuple[Any, ...]]) -> None:
        self._stored: Iterator[tuple[Any, ...]] = iter(stored)
        self.next_seq = _END
        """The seq of the stored row not yet compared (``_END`` when none is left)."""
        self._held: tuple[Any, ...] = ()
        self.missing: tuple[int, str] | None = None
        self.extra: int | None = None
        self._advance()

    def _advance(self) -> None:
        for held in self._stored:
            if len(held) == 3 and type(held[2]) is int:  # (an altered seq: not a row's)
                self._held, self.next_seq = tuple(held), held[2]
                return
        self._held, self.next_seq = (), _END

    def row(self, seq: int, iid: str, text: Any) -> None:
        """The row at ``seq``: the stored rows before it were extra; those at it must be its
        keys.  Cheap for the rows that name nothing and have nothing stored."""
        keys = index_keys(text)
        if not keys and self.next_seq > seq:
            return
        held = set()
        while self.next_seq <= seq:
            if self.next_seq < seq:
                self._extra(self.next_seq)
            else:
                held.add((self._held[0], self._held[1]))
            self._advance()
        want = {(iid, key) for key in keys}
        if want - held and self.missing is None:
            self.missing = (seq, iid)
        if held - want:
            self._extra(seq)

    def _extra(self, seq: int) -> None:
        if self.extra is None:
            self.extra = seq

    def finish(self, limit: int | None, add: Callable[[int, str, str], None]) -> None:
        """Report what was found before ``limit`` (the rows from it on are not intact, or not
        proven: nothing about them is claimed), stored rows past the walk included; None: the
        walk found every row intact -- every stored row past it is reported, as far as any."""
        if limit is None:
            limit = _END  # past every seq a database stores: each stored row is below
        while self.next_seq < limit and self.extra is None:
            self._extra(self.next_seq)
            self._advance()
        if self.missing is not None and self.missing[0] < limit:
            seq, iid = self.missing
            add(seq, f"row {seq} names a linked call that linked_calls does not hold (removed, "
                "or written by a broker of the schema before the upgrade: a claim on "
                f"{iid}'s record naming that call would be written)",
                LINKED_CALL_MISSING)  # fmt: skip
        if self.extra is not None and self.extra < limit:
            add(self.extra, f"linked_calls holds a row for seq {self.extra} that the event "
                "does not name (the table was altered)", LINKED_CALLS_ALTERED)  # fmt: skip
