"""SIGTERM and SIGINT reach the daemon through one thread of its own, not through its loop.

A signal's Python handler runs on the main thread, between two bytecodes -- and the main
thread is the event loop's, which may be the very thing a stop must not wait for: a shared
journal's reads run on the loop (``journal.postgres``), and a PostgreSQL that holds its
connection open and never answers (a stopped server) keeps the loop in a socket read for as
long as it likes.  trio's signal receiver is a task on that loop: the stop it would start
never starts, and SIGTERM does nothing at all.

So while the daemon runs, SIGTERM and SIGINT are blocked in every thread but one
(``pthread_sigmask`` in the main thread before any of the daemon's threads exist: a thread
inherits its creator's mask), and that one takes them with ``sigwait``: whatever the loop is
doing, the signal is taken at once and ``on_signal`` runs on that thread -- which starts the
stop's bound first (``stopbound.StopBound``: a thread too), then wakes the loop
(``trio.lowlevel.TrioToken.run_sync_soon``: it never waits for the loop).  A healthy loop stops
exactly as before; a hung one is ended by the bound.  A Python handler stays installed as
well, forwarding to ``on_signal``, for a signal delivered to a thread that existed before the
daemon (one of a host program's, the daemon run inside it): only the main thread runs it.
A process started meanwhile would inherit the mask (the daemon starts none): one that should
take SIGTERM itself must unblock it first.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType

__all__ = ["STOP_SIGNALS", "StopSignals"]

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


class StopSignals:
    """``with StopSignals(on_signal):`` -- from entry to exit, each SIGTERM or SIGINT calls
    ``on_signal(signum)`` on the thread that took it (``sigwait``'s own, as a rule), never on
    the event loop.  ``on_signal`` must not raise and must not wait for the loop.  Entered on
    the main thread (``signal.signal``'s rule); the mask and handlers are restored at exit."""

    def __init__(self, on_signal: Callable[[int], None]) -> None:
        self._on_signal = on_signal
        self._closing = False
        self._woken = threading.Event()
        self._thread = threading.Thread(
            target=self._take, name="affidavit-stop-signals", daemon=True
        )
        self._mask: set[int | signal.Signals] = set()
        self._handlers: dict[signal.Signals, object] = {}

    def __enter__(self) -> StopSignals:
        for signum in STOP_SIGNALS:
            self._handlers[signum] = signal.signal(signum, self._handled)
        self._mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        self._thread.start()
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _exc: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        # Wake the thread with a signal of its own: it stays alive until it is sent (``_woken``),
        # so the signal never targets a thread that has gone.
        self._closing = True
        assert self._thread.ident is not None
        signal.pthread_kill(self._thread.ident, signal.SIGTERM)
        self._woken.set()
        self._thread.join()
        signal.pthread_sigmask(signal.SIG_SETMASK, self._mask)
        for signum, handler in self._handlers.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]

    def _take(self) -> None:
        while True:
            signum = signal.sigwait(STOP_SIGNALS)
            if self._closing:
                self._woken.wait()
                return
            self._on_signal(signum)

    def _handled(self, signum: int, _frame: FrameType | None) -> None:
        self._on_signal(signum)
