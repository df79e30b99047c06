"""``Calls.drain`` waits for the calls in flight, and no longer: a call that joins one already
running (an operator's attestation accepted while draining, counted by ``Calls.linked``) must
not hide the end of the last one from it.  ``start`` and ``linked`` used to replace the idle
event whatever its state, so that ``drain``, waiting on the old one, waited out its whole
grace with nothing running.  And its stop bounds a call's answer (``Running.hand_over``,
``Running.stop``): ``ANSWER_WAIT`` from its hand-over, never past the grace's end by more.
Virtual time (trio's autojump clock): no wall-clock figure."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from affidavit.daemon.calls import Calls, Running
from affidavit.stopping.bound import ANSWER_WAIT


async def test_drain_returns_when_the_last_call_ends_even_if_one_joined_meanwhile(
    autojump_clock: MockClock,
) -> None:
    calls = Calls(4)
    async with trio.open_nursery() as nursery:
        await nursery.start(calls.run)

        async def call(running: Running) -> dict[str, Any]:
            await trio.sleep(0.2)
            return {}

        async def attest() -> None:
            await trio.sleep(0.1)
            with calls.linked(capped=False):
                await trio.sleep(0.05)  # an attestation's journal write

        calls.start(call)
        nursery.start_soon(attest)
        start = trio.current_time()
        left = await calls.drain(30.0)
        waited = trio.current_time() - start
        nursery.cancel_scope.cancel()
    assert (left, len(calls.running)) == (0, 0)
    assert 0.2 <= waited < 1.0, waited  # the call's end, not the grace's (virtual seconds)


async def _answer(running: Running, lasts: float) -> tuple[bool, float]:
    """A call's answer (``Answering``, the engine's ``deliver``): handed over now, then a write
    lasting ``lasts`` seconds in the scope it is given; whether it was written whole, and when
    it was handed over."""
    handed = trio.current_time()
    with running.hand_over() as scope:
        await trio.sleep(lasts)
    return not scope.cancelled_caught, handed


async def _stopped(
    calls: Calls, grace: float, answer: Callable[[Running], Awaitable[tuple[bool, float]]]
) -> tuple[bool, float, float, float]:
    """Drain ``calls`` with ``grace`` while a linked call runs ``answer`` (0.1 s in): whether
    its answer was written whole, when it was handed over, when it ended, when the grace did."""
    ended: list[tuple[bool, float, float]] = []
    async with trio.open_nursery() as nursery:

        async def linked() -> None:
            with calls.linked() as running:
                whole, handed = await answer(running)
                ended.append((whole, handed, trio.current_time()))

        nursery.start_soon(linked)
        await trio.sleep(0.1)
        grace_end = trio.current_time() + grace
        await calls.drain(grace)
    (whole, handed, at) = ended[0]
    return whole, handed, at, grace_end


async def test_an_answer_handed_over_answer_wait_before_the_grace_ends_is_cut_off_then(
    autojump_clock: MockClock,
) -> None:
    """Its client did not read it for ``ANSWER_WAIT`` and more: cut off at the grace's end
    (then recorded RESULT_DELIVERY_FAILED), not given another ``ANSWER_WAIT``."""
    whole, _handed, at, grace_end = await _stopped(
        Calls(4), ANSWER_WAIT + 1.0, lambda running: _answer(running, 1000.0)
    )
    assert not whole
    assert abs(at - grace_end) < 0.01, at - grace_end  # (virtual seconds)


@pytest.mark.parametrize("lasts", [1.0, 1000.0])
async def test_an_answer_handed_over_just_before_the_grace_ends_has_the_rest_of_answer_wait(
    autojump_clock: MockClock, lasts: float
) -> None:
    """Handed over 10 ms before the grace's end (its encoding, a wait for room in the answer
    budget, come after): a write taking a second is whole -- cut off at the grace's end
    before, where one handed over 10 ms later had ``ANSWER_WAIT`` -- and one never done is cut
    off ``ANSWER_WAIT`` after its hand-over, before the grace's end's ``ANSWER_WAIT``."""

    async def late(running: Running) -> tuple[bool, float]:
        await trio.sleep(1.09)  # the grace runs from 0.1 s in
        return await _answer(running, lasts)

    whole, handed, at, grace_end = await _stopped(Calls(4), 1.0, late)
    assert abs(grace_end - handed - 0.01) < 0.001, grace_end - handed
    if lasts < ANSWER_WAIT:
        assert whole and abs(at - handed - lasts) < 0.01, at - handed
    else:
        assert not whole and abs(at - handed - ANSWER_WAIT) < 0.01, at - handed


@pytest.mark.parametrize(("records", "lasts"), [(0.0, 1.0), (6.0, 1.0), (6.0, 1000.0)])
async def test_an_answer_handed_over_after_the_stop_has_answer_wait_from_then(
    autojump_clock: MockClock, records: float, lasts: float
) -> None:
    """A call held at the grace's end is stopped, records where it stood -- ``records``
    seconds: a barrier on a shared journal reconnecting, a slow fsync -- then hands its answer
    over (a poll's BROKER_SHUTDOWN): that write has ``ANSWER_WAIT`` from the hand-over.  One
    taking a second is whole -- cut off at once after 6 s of recording before, when the wait
    ran from the stop (and at once with the call in e9b84223); one never done is cut off at
    ``ANSWER_WAIT`` after its hand-over."""

    async def held(running: Running) -> tuple[bool, float]:
        with running.control.scope:
            await trio.sleep_forever()  # held by the remote till the stop
        await trio.sleep(records)  # ATTEMPT_INTERRUPTED, the poll's own record
        return await _answer(running, lasts)

    whole, handed, at, grace_end = await _stopped(Calls(4), 1.0, held)
    assert abs(handed - grace_end - records) < 0.01, handed - grace_end
    if lasts < ANSWER_WAIT:
        assert whole and abs(at - handed - lasts) < 0.01, at - handed
    else:
        assert not whole and abs(at - handed - ANSWER_WAIT) < 0.01, at - handed
