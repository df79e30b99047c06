"""``daemon/shares.py`` alone: who gets the next view place (``FairShare``), and the calls a uid
may start (``CallRate``) -- with what each keeps in memory counted, not timed."""

from __future__ import annotations

import dataclasses
import math
import threading

import pytest
import trio
import trio.testing

from affidavit.daemon.shares import (
    PRUNE_AT,
    Asker,
    CallRate,
    FairShare,
    RateLimited,
    ViewsInFlight,
)
from affidavit.journal import ReadFailed

A, B, C = Asker(1001, False), Asker(1002, False), Asker(1003, False)
OP = Asker(0, True)


def _share(slots: int = 4, others: int = 3, queue: int = 8) -> FairShare:
    return FairShare(
        slots, per_asker=slots // 2, others=others, queue=queue, what="all", theirs="yours"
    )


async def _hold(share: FairShare, asker: Asker, order: list[int | str], go: trio.Event) -> None:
    async with share.place(asker, 60):
        order.append(asker.key)
        await go.wait()


def _empty(share: FairShare) -> bool:
    return (share.total, share.held, share.waiting, share.held_by_others, share._served) == (
        0,
        {},
        {},
        0,
        {},
    )


async def test_a_free_place_goes_to_the_operator_then_the_asker_holding_fewest() -> None:
    """A floods (its two, four more waiting), then B asks, then C and an operator: the operator
    has the last place at once, and the place one of A's frees goes to C -- never to A's
    earlier waiters first."""
    share, order, go = _share(others=3), [], trio.Event()
    first = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_hold, share, A, order, first)
        await trio.testing.wait_all_tasks_blocked()  # (holding: tasks start in no set order)
        for _ in range(5):
            nursery.start_soon(_hold, share, A, order, go)
        await trio.testing.wait_all_tasks_blocked()
        assert order == [A.key, A.key]  # its share: two of four
        nursery.start_soon(_hold, share, B, order, go)
        await trio.testing.wait_all_tasks_blocked()
        assert order[2:] == [B.key]  # at once: a place was free
        nursery.start_soon(_hold, share, C, order, go)
        nursery.start_soon(_hold, share, OP, order, go)
        await trio.testing.wait_all_tasks_blocked()
        assert order[3:] == [OP.key]  # the agents hold their three: C waits, the operator not
        first.set()  # one of A's ends
        await trio.testing.wait_all_tasks_blocked()
        assert order[4:] == [C.key]  # C holds none, A one: C's turn
        assert len(share.waiting[A.group]) == 4
        go.set()
    assert order.count(A.key) == 6
    assert _empty(share)


async def test_the_kept_turn_goes_round_the_askers() -> None:
    """One place (the kept views' turn): A's five waiting views and B's one -- B's is next."""
    share = FairShare(1, per_asker=1, others=1, queue=8, what="the turn")
    order: list[int | str] = []
    gates = [trio.Event() for _ in range(7)]

    async def one(asker: Asker, gate: trio.Event) -> None:
        async with share.place(asker, 60):
            order.append(asker.key)
            await gate.wait()

    async with trio.open_nursery() as nursery:
        for i in range(6):
            nursery.start_soon(one, A, gates[i])
            await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(one, B, gates[6])
        await trio.testing.wait_all_tasks_blocked()
        for gate in gates:
            gate.set()
            await trio.testing.wait_all_tasks_blocked()
    assert order[:2] == [A.key, B.key], order
    assert _empty(share)


async def test_past_its_queue_a_uid_is_refused_at_once_the_operator_never() -> None:
    share, order, go = _share(queue=3), [], trio.Event()
    async with trio.open_nursery() as nursery:
        for _ in range(2 + 3):
            nursery.start_soon(_hold, share, A, order, go)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(ViewsInFlight) as refused:
            await share.acquire(A, 60)
        assert (refused.value.status, refused.value.code, refused.value.retry_after) == (
            503,
            "VIEWS_IN_FLIGHT",
            1,
        )
        # The next piece of an answer under way waits its turn: never cut short by the queue.
        nursery.start_soon(_hold, share, dataclasses.replace(A, answering=True), order, go)
        await trio.testing.wait_all_tasks_blocked()
        assert len(share.waiting[A.group]) == 4
        for _ in range(5):
            nursery.start_soon(_hold, share, OP, order, go)
        await trio.testing.wait_all_tasks_blocked()
        assert len(share.waiting[OP.group]) == 3  # two places were free; no queue bound for it
        go.set()
    assert _empty(share)


async def test_a_wait_past_its_bound_or_cancelled_leaves_nothing_behind() -> None:
    """Declined after ``wait`` (ReadFailed, naming what a non-operator waited for: its share),
    or cancelled while waiting or holding: no place, no waiter, no entry kept."""
    share, order, go = _share(), [], trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_hold, share, A, order, go)
        nursery.start_soon(_hold, share, A, order, go)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(ReadFailed, match="yours stayed busy"):
            await share.acquire(A, 0)
        with trio.CancelScope() as scope:
            scope.cancel()
            await share.acquire(A, 60)
        assert share.waiting == {}
        go.set()
    assert _empty(share)


async def test_a_place_granted_then_cancelled_is_given_back() -> None:
    """A view granted a place at once (one was free), its caller cancelled at that very
    checkpoint: the place is given back, not kept by nobody -- the next view gets it."""
    share, order, go = _share(slots=2, others=2), [], trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_hold, share, B, order, go)
        await trio.testing.wait_all_tasks_blocked()
        with trio.CancelScope() as scope:
            scope.cancel()
            await share.acquire(A, 60)  # granted in ``_hand_out``, cancelled in the wait
        assert scope.cancelled_caught
        assert (share.total, share.held, share.waiting) == (1, {B.group: 1}, {})
        nursery.start_soon(_hold, share, C, order, go)
        await trio.testing.wait_all_tasks_blocked()
        assert order == [B.key, C.key]
        go.set()
    assert _empty(share)


async def test_a_threads_place_is_held_until_the_thread_ends_its_caller_gone_or_not() -> None:
    """``Place`` as ``trio.to_thread.run_sync``'s limiter (``Broker.view``): a view abandoned
    when its caller is cancelled keeps its place until its read ends -- as it keeps its
    thread -- so the next view granted a place has a thread free (rv48 #4: the place was
    given back at the cancel, the thread kept, and the next view waited outside the rules)."""
    share = FairShare(1, per_asker=1, others=1, queue=8, what="the thread")
    reading, done = threading.Event(), threading.Event()

    def read() -> None:
        reading.set()
        assert done.wait(10)  # bounded: until the test lets it end

    with trio.fail_after(10):
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:

                async def cancel_once_reading() -> None:
                    while not reading.is_set():
                        await trio.sleep(0.005)
                    scope.cancel()

                nursery.start_soon(cancel_once_reading)
                await trio.to_thread.run_sync(
                    read, limiter=share.place(A, 60), abandon_on_cancel=True
                )
        assert scope.cancelled_caught
        assert share.held == {A.group: 1}  # the thread still reads: its place still held
        done.set()
        while share.total:
            await trio.sleep(0.005)
    assert _empty(share)


async def test_an_answers_next_piece_goes_before_its_uids_queued_views() -> None:
    """A's two places held, three views of A's waiting, then the next piece of an answer of
    A's (``answering``): it is served first when a place frees -- behind A's queued views it
    could wait past ``view_wait`` and be declined mid-answer (rv48 #2)."""
    share, go = _share(), trio.Event()
    first = trio.Event()
    piece = dataclasses.replace(A, answering=True)
    seen: list[bool] = []

    async def hold(asker: Asker, gate: trio.Event) -> None:
        async with share.place(asker, 60):
            seen.append(asker.answering)
            await gate.wait()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(hold, A, first)
        nursery.start_soon(hold, A, go)
        await trio.testing.wait_all_tasks_blocked()
        for _ in range(3):
            nursery.start_soon(hold, A, go)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(hold, piece, go)
        await trio.testing.wait_all_tasks_blocked()
        assert [w.asker.answering for w in share.waiting[A.group]] == [True, False, False, False]
        first.set()
        await trio.testing.wait_all_tasks_blocked()
        assert seen == [False, False, True]
        go.set()
    assert _empty(share)


async def test_one_uid_as_operator_and_not_has_two_queues() -> None:
    """A uid's operator views (one connection's credentials) and its others (another's): each
    counted and queued apart -- one queue held both, and the operator view at its head was
    granted past the non-operator cap, or a non-operator view at its head blocked the
    operator's (rv48 #5)."""
    share, order, go = _share(), [], trio.Event()
    a_operator = Asker(A.key, True)
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(_hold, share, A, order, go)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(_hold, share, a_operator, order, go)
        await trio.testing.wait_all_tasks_blocked()
        assert (share.held, len(share.waiting[A.group])) == ({A.group: 2, a_operator.group: 1}, 1)
        assert order == [A.key] * 3  # the operator's at once, though A's own view waits
        go.set()
    assert _empty(share)


def test_a_bucket_lets_a_burst_then_its_rate_and_says_when() -> None:
    now = [0.0]
    rate = CallRate(2.0, 3, clock=lambda: now[0])
    for _ in range(3):
        rate.take(7)
    with pytest.raises(RateLimited) as refused:
        rate.take(7)
    assert (refused.value.status, refused.value.code, refused.value.retry_after) == (
        429,
        "RATE_LIMITED",
        1,
    )
    rate.take(8)  # another uid's bucket is its own
    now[0] = 0.5  # one token back
    rate.take(7)
    with pytest.raises(RateLimited):
        rate.take(7)
    slow = CallRate(0.01, 1, clock=lambda: now[0])
    slow.take(7)
    with pytest.raises(RateLimited) as refused:
        slow.take(7)
    assert refused.value.retry_after == math.ceil(1 / 0.01)  # a whole token to come back


def test_buckets_are_kept_only_for_uids_that_called_lately() -> None:
    """Memory: 100 000 uids calling once each, a second apart in bursts of 1000, keep no more
    buckets than twice those that called within the refill time (here 10 s) -- a full bucket
    is what a new one is, so it is dropped."""
    now = [0.0]
    rate = CallRate(10.0, 100, clock=lambda: now[0])
    most = 0
    for second in range(100):
        now[0] = float(second)
        for uid in range(second * 1000, second * 1000 + 1000):
            rate.take(uid)
        most = max(most, len(rate.buckets))
    assert most <= 2 * 11 * 1000 + PRUNE_AT, most
