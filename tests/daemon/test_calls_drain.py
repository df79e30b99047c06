"""``Calls.drain`` waits for the calls in flight, and no longer: a call that joins one already
running (an operator's attestation accepted while draining, counted by ``Calls.linked``) must
not hide the end of the last one from it.  ``start`` and ``linked`` used to replace the idle
event whatever its state, so that ``drain``, waiting on the old one, waited out its whole
grace with nothing running.  Virtual time (trio's autojump clock): no wall-clock figure."""

from __future__ import annotations

from typing import Any

import trio
from trio.testing import MockClock

from affidavit.daemon.calls import Calls, Running


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
