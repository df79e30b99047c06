"""``CallControl``: how whoever runs a call for a caller stops it, and with which recorded cause.

The daemon runs each call in a task of its own (a caller hanging up must not tear the call down
half-observed) and needs two ways to stop one:

* ``withdraw()`` -- the caller is gone.  Seed, "Cancellation after dispatch is not a preflight
  error": only a call that has not reached its dispatch gate may be cancelled; it is recorded
  CALLER_CANCELLED with outcome not_attempted.  After the gate, withdrawing does nothing: the
  call runs on, its result is stored, and the lost answer is RESULT_DELIVERY_FAILED.
* ``stop(code)`` -- the daemon is shutting down and the grace ran out: cancel wherever the call
  is, recorded with ``code`` (BROKER_SHUTDOWN) at the boundary its evidence proves:
  not_attempted before the gate, unknown after it.

A caller that *joined* an invocation awaiting approval (the same idempotency key: ``resume``)
only waits for, or sends on another's behalf, what an operator approved for whoever asked first:
its hang-up *detaches* it (``detached``: it stops waiting, and a dispatch it took on runs to its
end, its result stored for ``fetch_result``) and never cancels the approved request.

Race-free by construction: both sides run on one trio thread, and the gate checks for a stop and
sets ``dispatching`` with no checkpoint in between (``attempt.py``'s gate), so a withdrawal is
either seen by the gate -- nothing is written -- or refused because the gate was entered.
"""

from __future__ import annotations

import trio

from affidavit.statemachine import Code

__all__ = ["CallControl"]


class CallControl:
    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        """Entered by the engine around the attempt; cancelled by ``withdraw`` / ``stop``."""
        self.code: Code | None = None
        """The recorded cause once stopped."""
        self.dispatching = False
        """Set by the dispatch gate, atomically with its last check for a stop; cleared if the
        gate's DISPATCH_STARTED is refused (the lease lost: nothing was sent)."""
        self.invocation_id: str | None = None
        """Known once the engine has created (or resumed) the invocation."""
        self.joined = False
        """Set by the engine when this call joined an invocation awaiting approval: a
        withdrawal then only detaches it (module docstring)."""
        self.detached = False
        """A joined call's caller went away: it waits no more, and cancels nothing."""
        self.answer_by: float | None = None
        """Set (trio's clock) by the engine when the call runs on past its caller's deadline
        -- a joined call it dispatches under the target's own timeout (``resume``): the host
        answers the caller then as one that ran out of time (IN_PROGRESS, fetch the result),
        and the call runs on, its result stored."""
        self._answer_scope: trio.CancelScope | None = None

    def answer_within(self, scope: trio.CancelScope) -> None:
        """The host waits for the call under ``scope``: given ``answer_by``'s deadline when
        the engine sets it (now, if it has) -- no task of its own to watch for it."""
        self._answer_scope = scope
        if self.answer_by is not None:
            scope.deadline = self.answer_by

    def run_past(self, deadline: float) -> None:
        """The call runs on past its caller's ``deadline`` (``answer_by``)."""
        self.answer_by = deadline
        if self._answer_scope is not None:
            self._answer_scope.deadline = deadline

    @property
    def gone(self) -> bool:
        """The caller went away (withdrawn, detached) or the call was stopped."""
        return self.code is not None or self.detached

    def withdraw(self) -> bool:
        """Cancel the call if it has not reached its dispatch gate; True if it was cancelled.
        A joined call is only detached (False): the approved request is not its to cancel."""
        if self.dispatching:
            return False
        if self.joined:
            self.detached = True
            return False
        self._cancel(Code.CALLER_CANCELLED)
        return True

    def stop(self, code: Code = Code.BROKER_SHUTDOWN) -> None:
        """Cancel the call wherever it is; its record says what its evidence proves."""
        self._cancel(code)

    def _cancel(self, code: Code) -> None:
        if self.code is None:
            self.code = code
        self.scope.cancel()
