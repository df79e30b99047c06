"""Fair shares of what the socket's askers take turns on (audit 48, findings 4 and 5).

``FairShare``: the views' worker threads (``Api.view_share``) and the kept views' turn
(``Api.summary_turn``) handed out by asker -- a peer's uid, or the operator console -- not in
the order the requests came:

* an asker who is not an operator holds at most ``per_asker`` at once (half the views'
  threads); the askers who are not operators hold at most ``others`` together (all but one
  when operators are configured: theirs is never taken by agents' views);
* a free place goes to the operators' first waiting view, else to the first waiting view of
  the asker holding the fewest, the one served longest ago among equals -- one uid looping on
  ``/v1/sessions`` on 30 connections makes another's view wait for one view of its, not 30;
* an asker's first waiting view is the next piece of an answer under way (``answering``),
  if one waits: ahead of its asker's other views, or the answer could wait behind them past
  ``wait`` and be cut short;
* an asker is a uid as an operator or not (``Asker.group``): counted and queued apart;
* at most ``queue`` views of one asker who is not an operator wait at once: one more is
  answered at once 503 ``VIEWS_IN_FLIGHT`` with ``Retry-After`` (``ViewsInFlight``), read
  nothing -- its own views ahead of it are what it waits for;
* a view waits at most ``wait`` seconds (the broker's ``view_wait``), then is declined as
  before (``busy``: 503 ``JOURNAL_READ_DECLINED``).

A place is held inside ``async with share.place(...)``, or as ``trio.to_thread.run_sync``'s
limiter from before the thread starts until it ends (``Place``; ``Broker.view``).

``CallRate``: the calls (job polls and reconciliation queries too) one uid may start, a token
bucket per uid -- ``[service] call_rate`` a second, ``call_burst`` at once -- past which a call
is answered 429 ``RATE_LIMITED`` with ``Retry-After`` before anything of it is journaled or
run: a refused call was still journaled whole (~2.4 KB each, 10 000 in 11 s from one uid), and
nothing bounded how fast one uid filled the journal's disk.  Memory: a bucket per uid that
called within the last ``call_burst / call_rate`` seconds, and up to as many again (or
``PRUNE_AT``) before the refilled ones are dropped -- a full bucket is what a new one is
(``tests/daemon/test_shares.py`` counts them).

Everything here runs on the event loop (no locks): trio's one thread.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import trio

from affidavit.api.readers import busy
from affidavit.engine import NotAnswered

from .http import ApiProblem

__all__ = ["CONSOLE", "Asker", "CallRate", "FairShare", "Place", "RateLimited", "ViewsInFlight"]

log = logging.getLogger("affidavit.daemon")

PRUNE_AT = 64
"""Buckets kept before the refilled ones are dropped (``CallRate._prune``)."""

SHARE_RETRY = 1
"""``Retry-After`` (seconds) of a 503 ``VIEWS_IN_FLIGHT``: its own views ahead end soon."""


@dataclass(frozen=True)
class Asker:
    """Whose view it is: ``key`` a peer's uid (the kernel's), or ``"console"``; ``operator``:
    an operator's (by the kernel's credentials, as the operator routes decide); ``answering``:
    a read of an answer already under way (a stored result's next piece), never refused for
    its asker's queue -- it waits its turn as any, and the answers under way are bounded by the
    answer budget -- so an answer is not cut short by the asker's other views."""

    key: int | str
    operator: bool
    answering: bool = False

    @property
    def group(self) -> tuple[int | str, bool]:
        """Whose queue and count a view is in: one uid's operator views apart from its others
        (operator status may differ between its connections: ``operator_gids``)."""
        return (self.key, self.operator)


CONSOLE = Asker("console", operator=True)
"""The operator console's views: only a logged-in operator reaches them."""


class ViewsInFlight(ApiProblem, NotAnswered):
    """503 ``VIEWS_IN_FLIGHT``: the asker has ``queue`` views waiting already; nothing read --
    to the engine a ``NotAnswered`` (a fetch refused so records no delivery failure)."""

    def __init__(self, queue: int) -> None:
        super().__init__(
            503,
            "VIEWS_IN_FLIGHT",
            f"{queue} views of this uid are waiting for the journal already; read again when "
            "they are answered",
            retry_after=SHARE_RETRY,
        )


class _Waiter:
    __slots__ = ("asker", "granted")

    def __init__(self, asker: Asker) -> None:
        self.asker = asker
        self.granted = trio.Event()


Group = tuple[int | str, bool]


class FairShare:
    """``slots`` places handed out by asker (the module's rules).  ``place(asker, wait)`` is
    one asker's turn: an async context manager holding a place, or the limiter
    ``trio.to_thread.run_sync`` takes (its place is then given back when the thread ends)."""

    def __init__(
        self,
        slots: int,
        *,
        per_asker: int,
        others: int,
        queue: int,
        what: str,
        theirs: str | None = None,
        keep: int | None = None,
    ) -> None:
        self.slots, self.per_asker, self.others, self.queue = slots, per_asker, others, queue
        self.keep = slots if keep is None else keep
        """Readers kept idle for the next views (``Place.total_tokens``): the threads of every
        share that takes from the same pool, not this one's alone -- a turn of one thread
        closed its reader after each view while another's idled, and opened one for the next."""
        self.what = what
        """What an operator's view waited for, in its message when declined (``busy``) ..."""
        self.theirs = theirs or what
        """... and what another's did (its share of them: not necessarily all were busy)."""
        self.total = 0
        """Places held."""
        self.held: dict[Group, int] = {}
        """Places held, by asker (``Asker.group``; none held: no entry)."""
        self.held_by_others = 0
        """Places held by askers who are not operators."""
        self.waiting: dict[Group, deque[_Waiter]] = {}
        """Waiting views by asker, the pieces of answers under way first, then first come
        first (none waiting: no entry)."""
        self._served: dict[Group, int] = {}
        """When each asker holding or waiting was last given a place (a count, not a clock)."""
        self._tick = 0

    def place(self, asker: Asker, wait: float) -> Place:
        return Place(self, asker, wait)

    async def acquire(self, asker: Asker, wait: float) -> None:
        queue = self.waiting.get(asker.group)
        bounded = not (asker.operator or asker.answering)
        if bounded and queue is not None and len(queue) >= self.queue:
            raise ViewsInFlight(self.queue)
        waiter = _Waiter(asker)
        queue = self.waiting.setdefault(asker.group, deque())
        if asker.answering:  # an answer's next piece: behind those of answers, before views
            queue.insert(sum(1 for w in queue if w.asker.answering), waiter)
        else:
            queue.append(waiter)
        self._hand_out()
        try:
            with trio.move_on_after(wait):
                await waiter.granted.wait()
        except BaseException:  # cancelled (a caller gone, a shutdown): nothing kept
            if waiter.granted.is_set():
                self.release(asker)
            else:
                self._withdraw(waiter)
            raise
        if not waiter.granted.is_set():
            self._withdraw(waiter)
            raise busy(wait, self.what if asker.operator else self.theirs)

    def release(self, asker: Asker) -> None:
        self.total -= 1
        group = asker.group
        left = self.held[group] - 1
        if left:
            self.held[group] = left
        else:
            del self.held[group]
            if group not in self.waiting:
                self._served.pop(group, None)
        if not asker.operator:
            self.held_by_others -= 1
        self._hand_out()

    def _withdraw(self, waiter: _Waiter) -> None:
        key = waiter.asker.group
        queue = self.waiting[key]
        queue.remove(waiter)
        if not queue:
            del self.waiting[key]
            if key not in self.held:
                self._served.pop(key, None)

    def _may_take(self, asker: Asker) -> bool:
        if asker.operator:
            return True
        return self.held.get(asker.group, 0) < self.per_asker and self.held_by_others < self.others

    def _hand_out(self) -> None:
        while self.total < self.slots:
            best: tuple[bool, int, int] | None = None
            chosen: deque[_Waiter] | None = None
            for key, queue in self.waiting.items():
                asker = queue[0].asker
                if not self._may_take(asker):
                    continue
                rank = (not asker.operator, self.held.get(key, 0), self._served.get(key, -1))
                if best is None or rank < best:
                    best, chosen = rank, queue
            if chosen is None:
                return
            waiter = chosen.popleft()
            key = waiter.asker.group
            if not chosen:
                del self.waiting[key]
            self.held[key] = self.held.get(key, 0) + 1
            self.total += 1
            if not waiter.asker.operator:
                self.held_by_others += 1
            self._tick += 1
            self._served[key] = self._tick
            waiter.granted.set()


class Place:
    """``asker``'s place in ``share``, waited for at most ``wait`` seconds: held inside
    ``async with``, or -- given to ``trio.to_thread.run_sync`` as its limiter (``Broker.view``)
    -- from before the thread starts until it ends: a view abandoned when its caller is
    cancelled keeps its place until its read ends, as it keeps its thread, so a place given
    to the next view is a thread free for it (never one it waits for outside these rules)."""

    def __init__(self, share: FairShare, asker: Asker, wait: float) -> None:
        self.share, self.asker, self.wait = share, asker, wait

    @property
    def total_tokens(self) -> int:
        """The readers ``Broker.view`` keeps idle (``FairShare.keep``)."""
        return self.share.keep

    async def acquire_on_behalf_of(self, borrower: object) -> None:
        await self.share.acquire(self.asker, self.wait)

    def release_on_behalf_of(self, borrower: object) -> None:
        self.share.release(self.asker)

    async def __aenter__(self) -> None:
        await self.share.acquire(self.asker, self.wait)

    async def __aexit__(self, *exc: object) -> None:
        self.share.release(self.asker)


class RateLimited(ApiProblem):
    """429 ``RATE_LIMITED``: the uid started ``burst`` calls faster than ``rate`` a second;
    nothing journaled, nothing run."""

    def __init__(self, rate: float, burst: int, retry_after: int) -> None:
        super().__init__(
            429,
            "RATE_LIMITED",
            f"this uid started calls faster than {rate:g} a second (at most {burst} at once: "
            "the daemon's [service] call_rate and call_burst); nothing was recorded or sent: "
            f"call again in {retry_after} s",
            retry_after=retry_after,
        )


class CallRate:
    """The calls each uid may start: a token bucket per uid (the module's words)."""

    def __init__(
        self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate, self.burst, self._clock = rate, burst, clock
        self.buckets: dict[int, tuple[float, float]] = {}
        """By uid: its tokens and when they were counted.  A refilled one is dropped."""
        self.dry: set[int] = set()
        """The uids refused since their bucket was last full: logged once per spell."""
        self._prune_at = PRUNE_AT

    def take(self, uid: int) -> None:
        """One call of ``uid``'s, or ``RateLimited`` -- logged once per spell (until its
        bucket is full again)."""
        now = self._clock()
        if len(self.buckets) >= self._prune_at:
            self._prune(now)
        tokens, then = self.buckets.get(uid, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - then) * self.rate)
        if tokens >= self.burst:
            self.dry.discard(uid)
        if tokens < 1.0:
            self.buckets[uid] = (tokens, now)
            if uid not in self.dry:
                self.dry.add(uid)
                log.warning(
                    "uid %d starts calls faster than [service] call_rate (%g a second, %d at "
                    "once): refused RATE_LIMITED, nothing journaled, until it slows down",
                    uid,
                    self.rate,
                    self.burst,
                )
            raise RateLimited(self.rate, self.burst, max(1, math.ceil((1.0 - tokens) / self.rate)))
        self.buckets[uid] = (tokens - 1.0, now)

    def _prune(self, now: float) -> None:
        """Drop the buckets refilled since (each as a new one would be): O(1) a call amortized
        -- done when their number doubled since the last prune."""
        full = self.burst / self.rate
        for uid in [u for u, (_, then) in self.buckets.items() if now - then >= full]:
            del self.buckets[uid]
            self.dry.discard(uid)
        self._prune_at = max(PRUNE_AT, 2 * len(self.buckets))
