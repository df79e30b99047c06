"""``Calls.drain`` waits for the calls in flight, and no longer: a call that joins one already
running (an operator's attestation accepted while draining, counted by ``Calls.linked``) must
not hide the end of the last one from it.  ``start`` and ``linked`` used to replace the idle
event whatever its state, so that ``drain``, waiting on the old one, waited out its whole
grace with nothing running.  And its stop bounds a call's answer in order (``Running.stop``):
cut off at the grace's end when under way, else ``ANSWER_WAIT`` from then.  Virtual time
(trio's autojump clock): no wall-clock figure."""

from __future__ import annotations

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


async def _answer(running: Running, lasts: float) -> bool:
    """A linked call's asker writing its answer (``Answering``): handed over, then a write
    lasting ``lasts`` seconds in the call's delivery scope; whether it was written whole."""
    running.answering = True
    with running.delivery:
        await trio.sleep(lasts)
    return not running.delivery.cancelled_caught


async def test_an_answer_under_way_when_the_grace_ends_is_cut_off_then(
    autojump_clock: MockClock,
) -> None:
    """Its client did not read it through the whole grace: cut off at the grace's end (then
    recorded RESULT_DELIVERY_FAILED), not given another ``ANSWER_WAIT``."""
    calls = Calls(4)
    ended: list[tuple[bool, float]] = []  # written whole, when
    async with trio.open_nursery() as nursery:

        async def poll() -> None:
            with calls.linked() as running:
                ended.append((await _answer(running, 1000.0), trio.current_time()))

        nursery.start_soon(poll)
        await trio.sleep(0.1)
        start = trio.current_time()
        await calls.drain(1.0)
    (whole, at), grace_end = ended[0], start + 1.0
    assert not whole
    assert at - grace_end < 0.01, at - grace_end  # (virtual seconds)


@pytest.mark.parametrize("lasts", [1.0, 1000.0])
async def test_an_answer_handed_over_after_the_grace_has_answer_wait(
    autojump_clock: MockClock, lasts: float
) -> None:
    """A call held at the grace's end is stopped, then hands its answer over (a poll's
    BROKER_SHUTDOWN): that write is not cut off at once -- e9b84223 cancelled it with the call,
    and the poller got no answer -- but has ``ANSWER_WAIT``: one taking a second is written
    whole, one never done is cut off at ``ANSWER_WAIT`` after the grace."""
    calls = Calls(4)
    ended: list[tuple[bool, float]] = []  # written whole, when
    async with trio.open_nursery() as nursery:

        async def poll() -> None:
            with calls.linked() as running:
                with running.control.scope:
                    await trio.sleep_forever()  # held by the remote till the stop
                ended.append((await _answer(running, lasts), trio.current_time()))

        nursery.start_soon(poll)
        await trio.sleep(0.1)
        start = trio.current_time()
        await calls.drain(1.0)
    (whole, at), grace_end = ended[0], start + 1.0
    if lasts < ANSWER_WAIT:
        assert whole and at - grace_end < ANSWER_WAIT, at - grace_end
    else:
        assert not whole and abs(at - grace_end - ANSWER_WAIT) < 0.01, at - grace_end
