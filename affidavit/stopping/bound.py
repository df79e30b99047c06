"""A broker process's stop has a bound, even when its journal stops answering.

Written for the daemon (``affidavit serve``, whose stop is told here); the embedded ``affidavit
mcp`` stops through the same phases and is bounded the same way (``affidavit.mcp.stop``).

A stop (SIGTERM, SIGINT) waits for things only storage can end: a call's journal write is
waited for uncancellably once queued (``Writer.submit``: a caller never loses track of a
barrier that did commit), the calls' nursery waits for those calls, and closing the journal
waits for every queued write to be answered and for the writer thread to end
(``Writer.stop``).  A disk that stops answering, an NFS mount gone, a PostgreSQL server that
holds its connection open and never answers (stopped: the kernel still acknowledges its
packets, so neither keepalives nor ``tcp_user_timeout`` notice, and its ``statement_timeout``
runs in the stopped process) -- each held the stop for ever.

So once the stop starts -- when the signal arrives, taken by a thread of its own
(``signals``): the event loop may be the thing that hangs, in a read of a journal that
stopped answering -- a watchdog thread (``StopBound``) gives it ``stop_bound`` seconds: the
phases the stop has anyway -- ``shutdown_grace`` for the calls, as long again (at least
``RECORD_WAIT``) for the stopped ones to record where they stood (``Calls.drain``),
``ANSWER_WAIT`` for their answers -- and ``CLOSE_WAIT`` for the journal to take what was
queued, or the journal's own ``[journal] reconnect`` window when longer (a shared journal's
writer that lost its connection retries that long before it answers: a write that would land
is let land).  A fixed bound, not a knob: each part is one the operator already sets or one no
healthy journal comes near (its close commits what is queued in one transaction).  Past it,
one log line names what was still pending -- the journal's unanswered writes (invocation id
and event kind), the calls still running (invocation id), how long ago the journal last
finished a transaction: never a row's attributes -- and the process ends with
``EXIT_STOP_UNFINISHED`` (sysexits' EX_IOERR), not 0: the journal was not closed.  The line
is written by a thread of its own, waited for ``LOG_WAIT`` at most: a stderr nobody reads does
not keep the process alive.

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
import time
from collections.abc import Callable
from typing import Protocol

from affidavit.text import named

__all__ = [
    "ANSWER_WAIT",
    "CLOSE_WAIT",
    "EXIT_STOP_UNFINISHED",
    "LOG_WAIT",
    "RECORD_WAIT",
    "StopBound",
    "journal_pending",
    "pending_words",
    "stop_bound",
]

log = logging.getLogger("affidavit.stopping")

CLOSE_WAIT = 5.0
"""Seconds the journal's close may take at least once the answers are out."""
ANSWER_WAIT = 5.0
"""The daemon's stop: after the calls are over, how long their answers may take to be written
before the connections are closed -- and how long a call's answer may take from its hand-over
(``Running.hand_over``), never past the grace's end by more (``Running.stop``)."""
RECORD_WAIT = 5.0
"""After the grace, how long at least the stopped calls may take to record where they stood
(the daemon's ``Calls.drain``, the MCP session's ``drain``: ``max(grace, RECORD_WAIT)``)."""
# ``stop_bound`` counts no time of its own for an answer under way at the grace's end: it is cut
# off at most ``ANSWER_WAIT`` after it (``Running.stop``), which ends within the calls' recording
# wait only while RECORD_WAIT is at least as long (its RESULT_DELIVERY_FAILED row then has the
# connections' ``ANSWER_WAIT`` at least).
assert RECORD_WAIT >= ANSWER_WAIT, "an answer under way at the grace's end outlasts the drain"
EXIT_STOP_UNFINISHED = 74
"""The exit status of ``affidavit serve`` and of ``affidavit mcp`` embedded when the stop ran
out of ``stop_bound``: sysexits' EX_IOERR (the journal's storage did not answer) -- neither 0
(stopped) nor 2 (refused)."""
LOG_WAIT = 2.0
"""Seconds the exit waits for its log line to be written, at most."""
EXIT_WAIT = 2 * LOG_WAIT
"""Seconds a disarm that came too late waits for the watchdog's exit, at most: its account of
what was pending (a read of two queues), then its line (``LOG_WAIT``)."""


def stop_bound(grace: float, wait: float, reconnect: float | None) -> float:
    """Seconds from the stop's start after which the process exits whatever it waits for: the
    calls' grace, their recording (``max(grace, RECORD_WAIT)``), ``wait`` (the daemon's: its
    answers, ``ANSWER_WAIT``; the embedded MCP stop's: the loop's lag, ``mcp.stop.LOOP_WAIT``),
    and the journal's close (``CLOSE_WAIT``, or a shared journal's ``reconnect`` when longer)."""
    return grace + max(grace, RECORD_WAIT) + wait + max(CLOSE_WAIT, reconnect or 0.0)


class StopBound:
    """A watchdog thread, armed when the stop starts (``arm``: the first call counts; from the
    stop's signal thread, ``signals``, or the loop) and disarmed once the journal is
    closed: if ``bound`` seconds pass first, it logs what was pending (``pending()``'s words)
    and ends the process with ``exit_status`` (None: a daemon run inside another program -- a
    test's -- only logs).  A thread, not a task: the loop itself may be what waits for the
    storage (a close run on it, a read), and a task would wait with it."""

    def __init__(self, pending: Callable[[], str], exit_status: int | None) -> None:
        self._pending = pending
        self._exit_status = exit_status
        self._disarmed = threading.Event()
        self._lock = threading.RLock()
        """(``arm`` is called from the stop-signal thread and from the loop.  No handler of
        ours arms: re-entrant, and ``_armed`` set before any call, only so that code a host
        runs on the arming thread meanwhile -- its own Python signal handler, between two
        bytecodes -- can neither deadlock nor start a second watchdog.)"""
        self._armed = False
        self._thread: threading.Thread | None = None
        """The watchdog, once started (never one whose start failed)."""
        self._exiting = False
        """The watchdog's bound ran out before any disarm: it logs, and exits if it may."""
        self.bound = 0.0
        self.deadline: float | None = None
        """Epoch seconds by which the process will have ended (None: not armed)."""

    def arm(self, bound: float) -> None:
        with self._lock:
            if self._armed or self._disarmed.is_set():
                return
            self._armed = True
            self.bound = bound
            deadline = time.time() + bound
            thread = threading.Thread(target=self._watch, name="affidavit-stop-bound", daemon=True)
            try:
                thread.start()
            except BaseException:  # (no thread left): unarmed, so a later arm tries again
                self._armed = False
                raise
            # Only now: a reader on another thread (``<socket>.lock``'s) never sees the end of
            # a bound whose watchdog failed to start.
            self.deadline = deadline
            self._thread = thread

    def arm_on_the_loop(self, bound: float) -> None:
        """``arm``, by the stop itself (on the loop, not the signals' thread): one that cannot
        be (no thread left to start: a cgroup's ``pids.max``) is logged by its type, and the
        stop goes on unbounded -- its grace, its calls' recording and the journal's close are
        not given up for the want of a watchdog, nor is the failure that started it replaced."""
        try:
            self.arm(bound)
        except Exception as exc:
            log.error(
                "the stop's bound could not be armed (%s): the stop goes on unbounded",
                type(exc).__name__,
            )

    def disarm(self) -> None:
        """No exit from now on -- unless the bound ran out first: then it waits for the exit
        (``EXIT_WAIT`` at most).  Otherwise it returns once the watchdog ended, or after
        ``LOG_WAIT`` when it is writing its line (``exit_status`` None) to a stderr that does
        not take it."""
        with self._lock:
            self._disarmed.set()
            thread, exiting = self._thread, self._exiting
        if thread is not None:
            thread.join(EXIT_WAIT if exiting and self._exit_status is not None else LOG_WAIT)

    def _watch(self) -> None:
        if self._disarmed.wait(self.bound):
            return
        with self._lock:  # a disarm that landed after the wait ran out still counts
            if self._disarmed.is_set():
                return
            self._exiting = True
        try:
            what = self._pending()
        except Exception as exc:  # the type only; the exit happens all the same
            what = f"what was pending could not be read ({type(exc).__name__})"
        status = self._exit_status
        if status is None:
            _say(self.bound, what, "not exiting: run inside another program")
            return
        # The exit does not wait for the log: a stderr nobody reads (a full pipe, a stopped
        # journald) would block the line, and the line must not keep the process alive.
        said = threading.Thread(
            target=_say,
            args=(self.bound, what, f"exiting {status} without closing the journal"),
            name="affidavit-stop-bound-log",
            daemon=True,
        )
        try:
            said.start()
            said.join(LOG_WAIT)
        finally:  # (no thread for the line: the exit all the same)
            os._exit(status)


def _say(bound: float, what: str, then: str) -> None:
    log.critical(
        "stop unfinished after %gs: %s; %s (the next start's recovery closes their records "
        "with what the journal holds)",
        bound,
        what,
        then,
    )
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):  # a broken stderr must not keep us alive
            handler.flush()


def pending_words(
    writes: list[tuple[str, str]], calls: list[str], answered_ago: float | None = None
) -> str:
    """The log line's account: the journal's unanswered writes (invocation id, event kind), the
    calls still running (invocation id), and how long ago the journal last finished a
    transaction (``answered_ago`` seconds; None: not once) -- a journal that stopped answering
    told from a slow one."""
    last = (
        "the journal finished no transaction since it opened"
        if answered_ago is None
        else f"the journal last finished a transaction {answered_ago:.1f}s ago"
    )
    return "; ".join(
        (
            _listed("journal writes unanswered", [f"{iid} {kind}" for iid, kind in writes]),
            _listed("calls still running", calls),
            last,
        )
    )


class _Journal(Protocol):
    def unanswered_writes(self) -> list[tuple[str, str]]: ...
    def last_answered_ago(self) -> float | None: ...


def journal_pending(journal: _Journal | None, calls: list[str]) -> str:
    """``pending_words`` of an open journal (None: none opened yet) and the calls still running:
    the watchdog's account for ``affidavit serve`` and the embedded ``affidavit mcp`` alike."""
    if journal is None:
        return pending_words([], calls)
    return pending_words(journal.unanswered_writes(), calls, journal.last_answered_ago())


def _listed(what: str, items: list[str]) -> str:
    if not items:
        return f"{what}: none"
    return f"{what}: {len(items)} ({named(items)})"
