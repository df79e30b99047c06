"""SIGTERM and SIGINT reach a broker process (``affidavit serve``, ``affidavit mcp`` embedded)
through one thread of its own, not through its loop.

A signal's Python handler runs on the main thread, between two bytecodes -- and the main
thread is the event loop's, which may be the very thing a stop must not wait for: a shared
journal's reads run on the loop (``journal.postgres``), and a PostgreSQL that holds its
connection open and never answers (a stopped server) keeps the loop in a socket read for as
long as it likes.  trio's signal receiver is a task on that loop: the stop it would start
never starts, and SIGTERM does nothing at all.

So while the broker runs, the signals' wakeup descriptor (``signal.set_wakeup_fd``) is a pipe
of ours, read by a thread of ours.  Python's C-level handler writes the signal's number to it
at once, on whichever thread the kernel chose, whatever the main thread is doing (blocked in a
C call included); the thread reads it and calls ``on_signal`` -- which starts the stop's bound
first (``bound.StopBound``: a thread too), then wakes the loop
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
ours is set inside the run and the one found -- trio's -- is put back at exit (with
``warn_on_full_buffer=False``, trio's own choice: Python cannot tell what the one found had), so
the two never fight; meanwhile each byte of any other signal is forwarded to it, so that a
signal with a Python handler (one of trio's own ``open_signal_receiver``) still wakes the loop.
The stop's own signals are not forwarded: a host's loop would act on them a second time.

Used only where the process is the broker's own: ``affidavit serve`` (``Daemon.run`` as
``serve(_cli=True)`` runs it) and ``affidavit mcp`` run embedded (``affidavit.mcp.stop``,
``run(_cli=True)``: the public ``serve`` and ``run`` called without it leave the process's
signals as a daemon run inside another program does, below; its proxy,
``--socket``, keeps trio's receiver: its loop waits on no storage).  Once either stopped clean
-- the journal closed -- the process only ends, and a SIGTERM or SIGINT then ends it at once,
exit 0 (``exit_after``): true then, and the one way out of a last write that blocks for ever
(a stderr nobody reads, a stopped journald: no watchdog is left, the bound is disarmed).  It is
a Python handler, run by the main thread itself: a signal sent to the process goes to its main
thread when that one does not block it (Linux), which is the thread in the write, and a write
interrupted by a Python handler's signal (installed without ``SA_RESTART``) runs the handler
before it is retried.  Not this module's thread: its pipe is no longer the wakeup descriptor
once trio's run ends, nor ``SIG_DFL``: killed by the signal, not 0.  After a stop that failed,
the signals get their default action back: no exit status is claimed for it.  A
daemon run inside another program -- a host's, a test's, two in one process, one in a forked
child -- uses trio's signal receiver instead, a second owner of the wakeup descriptor being a
fight with no right answer (another daemon's ``StopSignals``, a wakeup descriptor put back by
trio without our flag).  That receiver is still the daemon's, not the host's: for as long as
``Daemon.run`` runs, SIGTERM and SIGINT stop the daemon and nothing else -- the host's own
handlers are set aside (put back when it returns), so Ctrl-C raises no KeyboardInterrupt in the
host meanwhile -- and of two daemons running at once only the one started last hears them
(trio's handler for a signal is the last receiver's).  Its watchdog only logs (``StopBound``:
``exit_status`` None), and it is armed once the loop saw the signal.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType

__all__ = ["NOT_MAIN_THREAD", "STOP_SIGNALS", "StopSignals", "off_the_main_thread"]

log = logging.getLogger("affidavit.stopping")

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})
JOIN_WAIT = 2.0
"""Seconds the exit waits for the thread to act on the signals taken before it, at most (an
``on_signal`` that hangs leaves the thread behind, not the exit)."""
NOT_MAIN_THREAD = "NOT_MAIN_THREAD"
"""The code of a broker run refused off the main thread (``off_the_main_thread``)."""


def off_the_main_thread(what: str) -> str | None:
    """Why ``what`` (a broker's run, which takes SIGTERM and SIGINT for its stop) cannot run on
    this thread -- None on the main thread.  Python sets signal handlers on the main thread
    only: off it trio's receiver and this module's thread would fail with a bare RuntimeError
    or ValueError, and a stop no signal can start is no stop."""
    if threading.current_thread() is threading.main_thread():
        return None
    return (
        f"{what} takes SIGTERM and SIGINT for its stop, which Python allows on the main "
        f"thread only: run it there (trio.run on the main thread), not on thread "
        f"{threading.current_thread().name!r}"
    )


class StopSignals:
    """``with StopSignals(on_signal):`` -- from entry to exit, each SIGTERM or SIGINT calls
    ``on_signal(signum)`` on a thread of its own, never on the event loop; one that raises is
    logged (its type) and the next signal is taken all the same.  ``on_signal`` must not wait
    for the loop.  Entered and left on the main thread (``signal``'s rule); the handlers and
    the wakeup descriptor are restored at exit, the handlers first: a signal from then on goes
    to the handler found at entry -- or, with ``exit_after`` (a process that only ends once the
    broker stopped: ``affidavit serve``, ``affidavit mcp`` embedded), ends the process at once,
    exit 0, when the block ended without an exception (its journal closed), and gets the
    signal's default action when it raised.  An entry that fails part-way (a KeyboardInterrupt
    included) puts back all it did."""

    def __init__(self, on_signal: Callable[[int], None], *, exit_after: bool = False) -> None:
        self._on_signal = on_signal
        self._exit_after = exit_after
        self._thread = threading.Thread(
            target=self._take, name="affidavit-stop-signals", daemon=True
        )
        self._read = self._write = -1
        self._wakeup: int | None = None
        """The wakeup descriptor found at entry (trio's, in ``trio.run``; -1: none; None: ours
        not set)."""
        self._handlers: dict[signal.Signals, object] = {}
        self._lock = threading.Lock()
        self._ended = False
        """The thread is past its last read."""
        self._left = False
        """The exit gave up waiting for the thread: the pipe's read end is the thread's to
        close (closed under it, its number could be another file's by its next read)."""

    def __enter__(self) -> StopSignals:
        try:
            self._read, self._write = os.pipe()  # (not inherited by a child: O_CLOEXEC)
            os.set_blocking(self._write, False)  # (set_wakeup_fd's rule: never blocks)
            self._wakeup = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
            self._thread.start()
            for signum in STOP_SIGNALS:
                self._handlers[signum] = signal.signal(signum, _nothing)
        except BaseException:
            self._restore()
            raise
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _exc: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        after = None
        if self._exit_after:
            after = _stopped if _exc is None else signal.SIG_DFL
        self._restore(after)

    def _restore(self, after: object = None) -> None:
        """Whatever entry did, undone: the handlers (or ``after`` instead), the wakeup
        descriptor, then the pipe's write end -- its end of file, after every signal taken
        before, ends the thread."""
        try:
            for signum, handler in self._handlers.items():
                signal.signal(signum, handler if after is None else after)  # type: ignore[arg-type]
            if self._wakeup is not None:
                signal.set_wakeup_fd(self._wakeup, warn_on_full_buffer=False)
        finally:
            if self._write != -1:
                os.close(self._write)
            if self._thread.ident is not None:
                self._thread.join(JOIN_WAIT)
            with self._lock:
                if self._read != -1 and (self._thread.ident is None or self._ended):
                    os.close(self._read)
                else:
                    self._left = True

    def _take(self) -> None:
        try:
            while chunk := os.read(self._read, 64):  # (b"": the write end closed, the exit)
                for signum in chunk:
                    self._took(signum)
        finally:
            with self._lock:
                self._ended = True
                if self._left:
                    os.close(self._read)

    def _took(self, signum: int) -> None:
        if signum not in STOP_SIGNALS:  # another signal's: to the loop it was meant to wake
            with contextlib.suppress(OSError):  # (full, or gone: as Python's own handler does)
                if self._wakeup is not None and self._wakeup != -1:
                    os.write(self._wakeup, bytes([signum]))
            return
        try:
            self._on_signal(signum)
        except Exception as exc:  # the type only: the next signal still counts
            log.error(
                "%s: the stop's bound could not be armed (%s)",
                signal.Signals(signum).name,
                type(exc).__name__,
            )


def _nothing(_signum: int, _frame: FrameType | None) -> None:
    """The Python handler: installed so that Python's C handler writes to the wakeup pipe
    (``SIG_DFL`` would end the process, ``SIG_IGN`` would drop the signal); the thread acts."""


def _stopped(_signum: int, _frame: FrameType | None) -> None:
    """The handler once the broker stopped clean (``exit_after``): the process ends, 0, at
    once -- nothing flushed, a flush being a write that may block too."""
    os._exit(0)
