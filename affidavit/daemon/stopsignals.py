"""SIGTERM and SIGINT reach the daemon through one thread of its own, not through its loop.

A signal's Python handler runs on the main thread, between two bytecodes -- and the main
thread is the event loop's, which may be the very thing a stop must not wait for: a shared
journal's reads run on the loop (``journal.postgres``), and a PostgreSQL that holds its
connection open and never answers (a stopped server) keeps the loop in a socket read for as
long as it likes.  trio's signal receiver is a task on that loop: the stop it would start
never starts, and SIGTERM does nothing at all.

So while the daemon runs, the signals' wakeup descriptor (``signal.set_wakeup_fd``) is a pipe
of ours, read by a thread of ours.  Python's C-level handler writes the signal's number to it
at once, on whichever thread the kernel chose, whatever the main thread is doing (blocked in a
C call included); the thread reads it and calls ``on_signal`` -- which starts the stop's bound
first (``stopbound.StopBound``: a thread too), then wakes the loop
(``trio.lowlevel.TrioToken.run_sync_soon``: it never waits for the loop).  A healthy loop stops
exactly as before; a hung one is ended by the bound.  The Python handler installed for the two
signals does nothing: the thread does it all, and a signal is acted on once.

Why not block the signals (``pthread_sigmask``) and take them with ``sigwait``: a mask is
inherited, by every thread created meanwhile and by every process those threads start, and
cannot be taken back from them.  trio's worker threads outlive the ``trio.run`` that made them
(shared by every run in the process, idle ones kept ~10 s): after a daemon embedded in another
program stopped, a child started from such a worker (``trio.run_process``) never saw SIGTERM.
The wakeup descriptor changes nothing a thread or a child inherits.

trio installs its own wakeup descriptor for the length of ``trio.run`` (its ``WakeupSocketpair``,
so that a signal wakes the loop's ``epoll``) and puts back whatever it found when the run ends:
ours is set inside the run and the one found -- trio's -- is put back at exit, so the two never
fight; meanwhile each byte read is forwarded to it, so that any other signal with a Python
handler (one of trio's own ``open_signal_receiver``) still wakes the loop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType

__all__ = ["STOP_SIGNALS", "StopSignals"]

log = logging.getLogger("affidavit.daemon")

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})
_CLOSING = 0
"""The byte ``__exit__`` writes to end the thread (no signal has the number 0)."""


class StopSignals:
    """``with StopSignals(on_signal):`` -- from entry to exit, each SIGTERM or SIGINT calls
    ``on_signal(signum)`` on a thread of its own, never on the event loop; one that raises is
    logged (its type) and the next signal is taken all the same.  ``on_signal`` must not wait
    for the loop.  Entered and left on the main thread (``signal``'s rule); the handlers and
    the wakeup descriptor are restored at exit, the handlers first: a signal from then on goes
    to the handler found at entry."""

    def __init__(self, on_signal: Callable[[int], None]) -> None:
        self._on_signal = on_signal
        self._thread = threading.Thread(
            target=self._take, name="affidavit-stop-signals", daemon=True
        )
        self._read = self._write = -1
        self._wakeup = -1
        """The wakeup descriptor found at entry (trio's, in ``trio.run``; -1: none)."""
        self._handlers: dict[signal.Signals, object] = {}

    def __enter__(self) -> StopSignals:
        self._read, self._write = os.pipe()  # (not inherited by a child: O_CLOEXEC)
        os.set_blocking(self._write, False)  # (set_wakeup_fd's rule: a full pipe never blocks)
        try:
            self._wakeup = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
            try:
                self._thread.start()
            except BaseException:
                signal.set_wakeup_fd(self._wakeup)
                raise
        except BaseException:
            os.close(self._read)
            os.close(self._write)
            raise
        for signum in STOP_SIGNALS:
            self._handlers[signum] = signal.signal(signum, _nothing)
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _exc: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        for signum, handler in self._handlers.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        signal.set_wakeup_fd(self._wakeup)
        # Every signal taken before is already in the pipe, ahead of this byte: each is acted
        # on before the thread ends.
        os.write(self._write, bytes([_CLOSING]))
        self._thread.join()
        os.close(self._read)
        os.close(self._write)

    def _take(self) -> None:
        while True:
            for signum in os.read(self._read, 64):
                if signum == _CLOSING:
                    return
                with contextlib.suppress(OSError):  # (trio's loop: woken by our call anyway)
                    if self._wakeup != -1:
                        os.write(self._wakeup, bytes([signum]))
                if signum in STOP_SIGNALS:
                    try:
                        self._on_signal(signum)
                    except Exception as exc:  # the type only: the next signal still counts
                        log.error(
                            "%s: the stop's start failed (%s)",
                            signal.Signals(signum).name,
                            type(exc).__name__,
                        )


def _nothing(_signum: int, _frame: FrameType | None) -> None:
    """The Python handler: installed so that Python's C handler writes to the wakeup pipe
    (``SIG_DFL`` would end the process, ``SIG_IGN`` would drop the signal); the thread acts."""
