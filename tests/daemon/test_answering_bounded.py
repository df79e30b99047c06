"""A linked call's answer (a poll's, a reconciliation query's: ``Answering``) is written through
its call's ``delivery`` scope (``Calls.linked``), so the grace's end cuts off a write to a
client that stopped reading: the asker is told ``ClientGone`` (the engine records
RESULT_DELIVERY_FAILED) and the call's ``max_calls`` slot is freed.  Before, the write ran in a
fresh scope nothing cancelled: the slot was held past the grace and the cancel that finally
came landed as neither delivered nor failed.  Virtual time (trio's autojump clock)."""

from __future__ import annotations

from typing import Any, cast

import pytest
import trio
from trio.testing import MockClock

from affidavit.daemon.app import Answering
from affidavit.daemon.calls import Calls
from affidavit.daemon.http import ClientGone, Request


class _Unread:
    """A request whose client stopped reading: its answer's write never returns."""

    def __init__(self) -> None:
        self.hung_up = trio.Event()
        self.broken = False
        self.link = self

    async def respond_json(self, answer: dict[str, Any]) -> None:
        await trio.sleep_forever()


async def test_the_grace_s_end_cuts_a_linked_answer_no_one_reads(autojump_clock: MockClock) -> None:
    calls = Calls(1)
    answering = Answering(cast(Request, _Unread()))
    told: list[type[BaseException]] = []

    async def poll() -> None:
        with calls.linked() as running:
            answering.running = running
            with pytest.raises(ClientGone) as gone:
                await answering({"poll": {}})
            told.append(gone.type)

    async with trio.open_nursery() as nursery:
        await nursery.start(calls.run)
        nursery.start_soon(poll)
        await trio.sleep(0.1)
        start = trio.current_time()
        with trio.fail_after(60):
            left = await calls.drain(1.0)
        waited = trio.current_time() - start
        nursery.cancel_scope.cancel()
    assert left == 1 and told == [ClientGone]
    assert waited < 2.0, waited  # the grace, not the 5 s wait for calls that ignore their stop
    assert not calls.running
