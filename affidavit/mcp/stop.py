"""The embedded ``affidavit mcp``'s stop: taken off the event loop, and bounded.

Embedded, this process opens the broker and its journal itself, so its stop waits for what only
storage can end, exactly as ``affidavit serve``'s does (``affidavit.stopping.bound`` says
what): the stopped calls' journal writes are waited for uncancellably, and the journal's close
waits for every queued write.  And a shared journal's reads run on the event loop: a PostgreSQL
that holds its connection and never answers keeps the loop in a socket read, where trio's signal
receiver -- a task on that loop -- never hears SIGTERM.

So, as the daemon does, the signals are taken by a thread of the process's own
(``StopSignals``), which arms the stop's bound (``StopBound``, ``EXIT_STOP_UNFINISHED``) first
and then asks the loop to end the session (``McpSession.end``, through the trio token: a
second signal stops the rest at once).  The bound is the MCP stop's own phases -- the grace,
``max(grace, RECORD_WAIT)`` for the stopped calls to record where they stood, no answer wait
(the connection is cut once they did) but ``LOOP_WAIT`` for the loop to get to the stop, the
journal's close -- ``stop_bound`` with ``LOOP_WAIT``.  A session that ends without a signal
(the client gone, a failure) arms it too, when it ends.  The bound is disarmed once the
journal is closed, and a signal from then on stops nothing (``closed``); past the bound, one
log line names the journal's unanswered writes and the calls still running, and the process
exits 74.

Taken so by the embedded path of ``affidavit mcp`` (``run`` with ``_cli``): the process is ours,
a CLI entry.  ``run`` called by a program of its own takes them with trio's receiver on the loop
(``received``), its bound only logging, and puts the handlers it found back.  The proxy
(``--socket``) keeps trio's receiver: its loop waits on no storage, only on its sockets, so it
always gets to the signal.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

import trio

from affidavit.stopping.bound import (
    EXIT_STOP_UNFINISHED,
    StopBound,
    journal_pending,
    stop_bound,
)

if TYPE_CHECKING:
    from affidavit.journal import Journal

    from .backends import Embedded
    from .server import McpSession

__all__ = ["EmbeddedStop"]

log = logging.getLogger("affidavit.mcp")

LOOP_WAIT = 5.0
"""Slack for the loop's lag.  The embedded stop has no wait for answers of its own (the
connection is cut once the stopped calls recorded where they stood, ``serve``), but its bound
starts at the signal, on the signals' thread, while the grace and the recording's timers start
only once the loop runs the stop (``_end``): a read in progress on the loop (a shared
journal's) holds it meanwhile, and a healthy stop must not be ended while it makes progress.
As long as the daemon's ``ANSWER_WAIT``, so the two bounds are one sum.  A read held longer --
a shared journal's writer reconnecting, up to ``reconnect`` -- is the outage the close's term
(``max(CLOSE_WAIT, reconnect)``) already counts."""


class EmbeddedStop:
    """One embedded process's stop.  Made on the loop (its token); ``signalled`` is called on
    the signal thread; the rest on the loop."""

    def __init__(
        self, grace: float, reconnect: float | None, exit_status: int | None = EXIT_STOP_UNFINISHED
    ) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self.bound = StopBound(self._pending, exit_status)
        """Past it: exit ``exit_status`` (``affidavit mcp``); None, run inside another program
        (``run`` called without ``_cli``): logged only."""
        self.grace = grace
        """The calls' grace: ``--shutdown-grace``, else the config's ``[service]
        shutdown_grace`` -- known before the signals are taken (``run``), so that a signal
        during the start-up counts it too."""
        self.reconnect = reconnect
        """A shared journal's ``[journal] reconnect`` (None: SQLite): the start-up's recovery
        may wait on it as the close does."""
        self.starting = trio.CancelScope()
        """The start-up, cancelled by a signal that comes before the session exists."""
        self._embedded: Embedded | None = None
        self._journal: Journal | None = None
        self._session: McpSession | None = None
        self._over = False
        """The journal is closed: a signal's stop that reaches the loop now has nothing to stop."""

    def opened(self, embedded: Embedded) -> None:
        """The broker is open: its journal and calls are what the bound's line names."""
        self._embedded, self._journal = embedded, embedded.broker.journal

    def attach(self, session: McpSession) -> None:
        """The session a signal ends from now on."""
        self._session = session

    def arm(self) -> None:
        """From here the stop has ``stop_bound`` seconds, whatever the journal does (the first
        call counts; any thread)."""
        self.bound.arm(self._seconds())

    def arm_on_the_loop(self) -> None:
        """``arm``, by the stop itself: one that cannot be is logged, and the stop goes on
        unbounded (``StopBound.arm_on_the_loop``)."""
        self.bound.arm_on_the_loop(self._seconds())

    def _seconds(self) -> float:
        return stop_bound(self.grace, LOOP_WAIT, self.reconnect)

    def closed(self) -> None:
        """On the loop, once the journal is closed (however the process ends): nothing is left
        to bound, nor for a signal to stop."""
        self._over = True
        self.bound.disarm()

    def signalled(self, signum: int) -> None:
        """SIGTERM or SIGINT, on the thread that took it (``StopSignals``): the bound starts
        now, then the loop is asked to stop -- it may never get to it (held in a read of a
        journal that stopped answering): the bound ends it."""
        try:
            self.arm()  # (may fail: no thread left to start)
        finally:  # the stop is asked for all the same
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(self._end, signum)

    def received(self, signum: int) -> None:
        """SIGTERM or SIGINT, taken on the loop (trio's receiver: ``run`` inside another
        program): the bound starts now, then the stop as ``signalled``'s."""
        self.arm_on_the_loop()
        self._end(signum)

    def _end(self, signum: int) -> None:
        """On the loop: the session's end (a second signal: the rest stopped at once), or the
        start-up's (the journal closed, exit 0).  Nothing once the journal is closed: a signal
        the thread took as the process stopped reaches the loop after the stop was over."""
        if self._over:
            return
        session = self._session
        if session is None:
            log.info("signal %d: stopping the start-up", signum)
            self.starting.cancel()
            return
        log.info("signal %d: stopping (%d call(s) running)", signum, session.running)
        session.end()

    def _pending(self) -> str:
        """The watchdog's account of what the stop still waited for (its thread)."""
        embedded, journal = self._embedded, self._journal
        running = embedded.running_ids() if embedded is not None else []
        return journal_pending(journal, running)
