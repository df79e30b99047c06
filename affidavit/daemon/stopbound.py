"""The daemon's stop has a bound, even when its journal stops answering.

A stop (SIGTERM, SIGINT) waits for things only storage can end: a call's journal write is
waited for uncancellably once queued (``Writer.submit``: a caller never loses track of a
barrier that did commit), the calls' nursery waits for those calls, and closing the journal
waits for every queued write to be answered and for the writer thread to end
(``Writer.stop``).  A disk that stops answering, an NFS mount gone, a PostgreSQL server that
holds its connection open and never answers (stopped: the kernel still acknowledges its
packets, so neither keepalives nor ``tcp_user_timeout`` notice, and its ``statement_timeout``
runs in the stopped process) -- each held the stop for ever.

So once the stop starts, a watchdog thread (``StopBound``) gives it ``stop_bound`` seconds: the
phases the stop has anyway -- ``shutdown_grace`` for the calls, as long again (at least 5 s)
for the stopped ones to record where they stood (``Calls.drain``), ``ANSWER_WAIT`` for their
answers -- and ``CLOSE_WAIT`` for the journal to take what was queued, or the journal's own
``[journal] reconnect`` window when longer (a shared journal's writer that lost its connection
retries that long before it answers: a write that would land is let land).  A fixed bound, not
a knob: each part is one the operator already sets or one no healthy journal comes near (its
close commits what is queued in one transaction).  Past it, one log line names what was still
pending -- the journal's unanswered writes (invocation id and event kind) and the calls still
running (invocation id): never a row's attributes -- and the process ends at once with
``EXIT_STOP_UNFINISHED`` (sysexits' EX_IOERR), not 0: the journal was not closed.

Why exiting so claims nothing: a write not answered was not reported durable to anyone -- its
call is still waiting for it, so no answer went out for it (its connection is closed
unanswered at ``ANSWER_WAIT``), and nothing after it was sent (DISPATCH_STARTED is a barrier:
the request leaves only once it is answered).  The process ends as a killed one does, which
the journal is built to survive: an unfinished transaction is not in it, and the next start's
recovery closes each record left open with what its durable events prove.  The socket file
went when the stop began; ``<socket>.lock`` and the SQLite journal's lock are locks the kernel
lets go with the process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable

__all__ = ["CLOSE_WAIT", "EXIT_STOP_UNFINISHED", "StopBound", "pending_words", "stop_bound"]

log = logging.getLogger("affidavit.daemon")

CLOSE_WAIT = 5.0
"""Seconds the journal's close may take at least once the answers are out."""
EXIT_STOP_UNFINISHED = 74
"""``affidavit serve``'s exit status when its stop ran out of ``stop_bound``: sysexits'
EX_IOERR (the journal's storage did not answer) -- neither 0 (stopped) nor 2 (refused)."""
NAMED = 20
"""Pending writes and calls the log line names at most (then "and N more")."""


def stop_bound(grace: float, answer_wait: float, reconnect: float | None) -> float:
    """Seconds from the stop's start after which the daemon exits whatever it waits for: the
    calls' grace, their recording (``Calls.drain``: ``max(grace, 5)``), their answers, and the
    journal's close (``CLOSE_WAIT``, or a shared journal's ``reconnect`` when longer)."""
    return grace + max(grace, 5.0) + answer_wait + max(CLOSE_WAIT, reconnect or 0.0)


class StopBound:
    """A watchdog thread, armed when the stop starts and disarmed once the journal is closed:
    if ``bound`` seconds pass first, it logs what was pending (``pending()``'s words) and ends
    the process with ``exit_status`` (None: a daemon run inside another program -- a test's
    -- only logs).  A thread, not a task: the loop itself may be what waits for the storage (a
    close run on it, a read), and a task would wait with it."""

    def __init__(self, bound: float, pending: Callable[[], str], exit_status: int | None) -> None:
        self.bound = bound
        self._pending = pending
        self._exit_status = exit_status
        self._disarmed = threading.Event()
        self._thread = threading.Thread(
            target=self._watch, name="affidavit-stop-bound", daemon=True
        )
        self._thread.start()

    def disarm(self) -> None:
        self._disarmed.set()

    def _watch(self) -> None:
        if self._disarmed.wait(self.bound):
            return
        try:
            what = self._pending()
        except Exception as exc:  # the type only; the exit happens all the same
            what = f"what was pending could not be read ({type(exc).__name__})"
        status = self._exit_status
        log.critical(
            "stop unfinished after %gs: %s; %s (the next start's recovery closes their records "
            "with what the journal holds)",
            self.bound,
            what,
            "not exiting: not run by `affidavit serve`"
            if status is None
            else f"exiting {status} without closing the journal",
        )
        if status is None:
            return
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):  # a broken stderr must not keep us alive
                handler.flush()
        os._exit(status)


def pending_words(writes: list[tuple[str, str]], calls: list[str]) -> str:
    """The log line's account: the journal's unanswered writes (invocation id, event kind) and
    the calls still running (invocation id)."""
    return "; ".join(
        (
            _listed("journal writes unanswered", [f"{iid} {kind}" for iid, kind in writes]),
            _listed("calls still running", calls),
        )
    )


def _listed(what: str, items: list[str]) -> str:
    if not items:
        return f"{what}: none"
    more = len(items) - NAMED
    tail = f" and {more} more" if more > 0 else ""
    return f"{what}: {len(items)} ({', '.join(items[:NAMED])}{tail})"
