"""A caller's cancellation placed at an event, not at a wall-time guess.

``with trio.move_on_after(0.5): await call()`` meant as "the caller gives up after dispatch"
is a guess that the call reaches dispatch within 0.5 s; on a loaded CI machine (two xdist
workers on two cores, an SSH handshake, a journal commit) it sometimes has not, and the test
then proves the other case or fails.  ``cancel_once`` cancels the caller's scope as soon as
the event it is about has happened -- a request the peer received, a connection it accepted,
``machine.dispatched`` -- polled every 10 ms, with a generous bound that fails loudly.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

__all__ = ["REACHED_WITHIN", "cancel_once"]

REACHED_WITHIN = 60.0
"""Seconds an event a test cancels at may take to happen: a loaded machine's worst case, never
reached by a working call (a broken one fails the wait, it does not pass)."""


async def cancel_once(
    scope: trio.CancelScope,
    reached: Callable[[], object],
    what: str,
    after: float = 0.0,
    *,
    within: float = REACHED_WITHIN,
) -> None:
    """Cancel ``scope`` once ``reached()`` is truthy (then ``after`` more seconds: the wait the
    cancellation is to land in).  Run it in a nursery beside the call the scope wraps.  The
    scope's deadline then says when it was cancelled."""
    with trio.move_on_after(within) as waited:
        while not reached():
            await trio.sleep(0.01)
    if waited.cancelled_caught:
        raise AssertionError(f"not within {within} s: {what}")
    await trio.sleep(after)
    scope.deadline = trio.current_time()
