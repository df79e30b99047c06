"""Calls in flight: each runs in a task the daemon owns, never in the request's handler.

Seed, "A result delivery error must not repeat execution": a caller hanging up must not abandon
an effect half-observed.  So a call is started in the daemon's own nursery; the handler only
waits for it.  What a hang-up may still do is decided by the engine's dispatch gate
(``CallControl.withdraw``): before DISPATCH_STARTED the call is cancelled and recorded
CALLER_CANCELLED / not_attempted; after it, the call runs on, its result is stored, and the
failed answer is recorded RESULT_DELIVERY_FAILED (result_delivery, fetch_result).

At shutdown the daemon stops taking calls, waits up to ``[service] shutdown_grace`` for these to
finish, then ``stop``s the rest: each is recorded BROKER_SHUTDOWN with what its evidence proves
(not_attempted before its dispatch gate, unknown after it).  Its answer's write, when the call
writes it itself (``Running.delivery``: a stored result the engine delivers, a poll's or a
query's answer), has ``ANSWER_WAIT`` from when it is handed over, the chance an answer written
after the calls has -- and no more once the grace has ended: one handed over ``ANSWER_WAIT`` or
more before the grace's end (a client that did not read it) is cut off then; one handed over
just before has the rest of its ``ANSWER_WAIT`` (its answer is encoded, and may wait for room
in the answer budget, after the hand-over: cut off at once, a client reading promptly lost it);
one handed over after the stop -- the BROKER_SHUTDOWN of a call held till then, recorded first,
which may take seconds on a reconnecting journal -- has its ``ANSWER_WAIT`` from then.  The
connections' deadline and the stop's watchdog bound the whole stop still.  A write cut off
fails its delivery (RESULT_DELIVERY_FAILED, when it carried a stored result), never written
again.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import trio

from affidavit.console.request import Refused
from affidavit.engine import CallControl, internal_failure
from affidavit.journal import AlteredRow, JournalError
from affidavit.stopping.bound import ANSWER_WAIT, RECORD_WAIT

from .http import ApiProblem

__all__ = ["Calls", "Overloaded", "Running", "internal_problem"]

log = logging.getLogger("affidavit.daemon")

Run = Callable[["Running"], Awaitable[dict[str, Any]]]
"""A call's work: the caller's action, or an approved one the dispatcher sends."""


class Overloaded(ApiProblem):
    """``[service] max_calls`` calls are running; the caller should try again later: the
    API's 503 OVERLOADED, nothing sent."""

    def __init__(self, limit: int) -> None:
        super().__init__(503, "OVERLOADED", f"{limit} calls are running; call again later")


def internal_problem(exc: Exception, control: CallControl | None, what: str) -> ApiProblem:
    """A poll or a reconciliation query its request's handler ran (``Calls.linked``) that failed
    inside the broker (a bug, not the journal's), answered as a call is: one log line naming
    its linked invocation and the exception's type only (its text may quote remote bytes) --
    never a traceback -- and 500 INTERNAL naming it (``internal_failure``), whose record the
    engine closed (``Engine._answered``)."""
    name = type(exc).__name__
    iid = control.invocation_id if control is not None else None
    log.error("%s ended without an answer (%s): %s", what, iid or "none recorded", name)
    return ApiProblem(*internal_failure(name, iid))


class Running:
    """One call in flight, shared by its task and the request handler waiting for it."""

    def __init__(self) -> None:
        self.control = CallControl()
        self.done = trio.Event()
        self.envelope: dict[str, Any] | None = None
        self.failure: str | None = None
        """The exception type name, when the call ended without an envelope."""
        self.journal_failed: JournalError | None = None
        """Why it ended so, when the journal could not be written or read (a shared journal's
        database unreachable past the writer's reconnect window) or proved a row altered."""
        self.handed_at: float | None = None
        """When the answer was handed over to be written in ``delivery`` (``hand_over``; trio's
        clock), None before."""
        self.stopped = False
        """The grace ran out while the call was in flight (``stop``)."""
        self.delivery = trio.CancelScope()
        """Bounds the answer's write (``hand_over``, ``stop``)."""

    @property
    def answering(self) -> bool:
        """The answer was handed over (the engine's ``deliver``, a linked call's
        ``Answering``): the handler must not answer again."""
        return self.handed_at is not None

    def hand_over(self) -> trio.CancelScope:
        """The answer is handed over to be written now: the scope to write it in.  After the
        stop it has ``ANSWER_WAIT`` from now -- not from the stop, whose recording (a barrier
        on a reconnecting journal) may have taken them all."""
        self.handed_at = now = trio.current_time()
        if self.stopped:
            self.delivery.deadline = now + ANSWER_WAIT
        return self.delivery

    def stop(self) -> None:
        """The shutdown grace ran out: stop wherever the call is, and bound an answer under way
        to ``ANSWER_WAIT`` from its hand-over (see module docstring): cut off now when handed
        over that long ago, else when they are out -- never past ``ANSWER_WAIT`` from now."""
        self.control.stop()
        self.stopped = True
        if self.handed_at is not None:
            now = trio.current_time()
            self.delivery.deadline = max(now, self.handed_at + ANSWER_WAIT)


class Calls:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.running: set[Running] = set()
        self.accepting = True
        self._nursery: trio.Nursery | None = None
        self._idle = trio.Event()
        self._idle.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The nursery the calls run in; returns once it is cancelled and every call is over."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def start(self, run: Run) -> Running:
        self._room(True)
        assert self._nursery is not None, "Calls.run is not running"
        call = Running()
        self._add(call)
        self._nursery.start_soon(self._one, run, call)
        return call

    @contextlib.contextmanager
    def linked(self, capped: bool = True) -> Iterator[Running]:
        """A poll or a reconciliation query that its request's handler runs itself (a linked
        call to the remote): counted among the calls in flight, so the grace waits for it and
        its end stops it where it is (BROKER_SHUTDOWN) -- never left to be cut off later as if
        its caller had gone -- and bounds its answer's write, which its asker's ``deliver``
        makes in the scope ``Running.hand_over`` gives (app.py ``Answering``; ``Running.stop``).
        ``Overloaded`` when ``limit`` calls are running, as a call is: each reaches the remote,
        and the cap is on what is in flight (the call a poll follows has ended, so it holds no
        slot then).  ``capped=False``: an operator's attestation, which sends nothing, is
        counted but never refused."""
        self._room(capped)
        call = Running()
        self._add(call)
        try:
            yield call
        finally:
            self._over(call)

    @contextlib.contextmanager
    def console(self, capped: bool) -> Iterator[CallControl]:
        """``linked`` for the operator console's reconciliation (a query: ``capped``), with the
        socket's refusals as the console's pages: 503 SHUTTING_DOWN once stopping, 503
        OVERLOADED past ``max_calls`` -- nothing sent either way.  A query run outside them
        bypassed the cap and the grace, and was cut off at the end as if its caller had gone
        (CALLER_CANCELLED, not BROKER_SHUTDOWN)."""
        try:
            if capped and not self.accepting:
                raise ApiProblem(
                    503, "SHUTTING_DOWN", "the broker is shutting down; call again later"
                )
            self._room(capped)
        except ApiProblem as exc:
            raise Refused(exc.status, exc.message, exc.code) from None
        with self.linked(capped) as call:  # (no checkpoint since the check: room is left)
            yield call.control

    def _room(self, capped: bool) -> None:
        """``Overloaded`` when ``limit`` calls are running and this one is ``capped``."""
        if capped and len(self.running) >= self.limit:
            raise Overloaded(self.limit)

    async def _one(self, run: Run, call: Running) -> None:
        try:
            call.envelope = await run(call)
        except Exception as exc:
            # A journal that cannot be written, a broken binding: the type only, for the log
            # (an exception's text may quote remote bytes).
            call.failure = type(exc).__name__
            if isinstance(exc, JournalError):
                call.journal_failed = exc
            # Which invocation: set by the engine once it wrote for one (``Engine._answered``).
            iid = call.control.invocation_id or "none accepted"
            if isinstance(exc, AlteredRow):  # the journal's own words: where, which seq
                log.error("a call ended without an envelope (%s): %s: %s", iid, call.failure, exc)
            else:
                log.error("a call ended without an envelope (%s): %s", iid, call.failure)
        finally:
            self._over(call)

    def _add(self, call: Running) -> None:
        self.running.add(call)
        if self._idle.is_set():
            # A new Event only once the old one is set: ``drain`` may be waiting on the one
            # in use (a call joining one in flight -- an attestation accepted while draining
            # -- would otherwise leave it waiting out the whole grace with none running).
            self._idle = trio.Event()

    def _over(self, call: Running) -> None:
        call.done.set()
        self.running.discard(call)
        if not self.running:
            self._idle.set()

    async def drain(self, grace: float, grace_over: Callable[[], object] = lambda: None) -> int:
        """Stop taking calls; wait up to ``grace`` seconds for the running ones, then call
        ``grace_over()`` (the answers waiting for room are given up: ``Server.give_up_waits``)
        -- whether or not any is still running -- and stop those that are, waiting for them to
        record where they stood.  Returns how many were still running when the grace ran out."""
        self.accepting = False
        with trio.move_on_after(grace):
            await self._idle.wait()
        grace_over()
        left = list(self.running)
        for call in left:
            call.stop()
        # Stopping only records the boundary each call reached (shielded journal writes).
        with trio.move_on_after(max(grace, RECORD_WAIT)):
            await self._idle.wait()
        return len(left)
