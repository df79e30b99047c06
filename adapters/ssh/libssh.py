"""libssh under trio: the session's non-blocking calls, parked on the socket libssh waits on.

Every libssh call on the trio thread is made with the session in non-blocking mode; when it
answers "again" we park on ``trio.lowlevel.wait_readable/wait_writable`` for the direction libssh
says it is waiting on.  The one exception, a stdin write on its worker thread (``Io.write``),
runs blocking: its waits in libssh's poll are bounded by the session timeout, its send() into
a full socket by nothing but the write's stall bound or cancellation.
What a failure proves is not decided here (see ``driver.py``); this module only moves bytes and
describes library exceptions without secrets.
"""

from __future__ import annotations

import fcntl
import socket
import struct
import termios
import threading
from collections.abc import Callable
from typing import Any

import ssh.event
import ssh.options
import trio

__all__ = ["SSH_AGAIN", "SSH_AUTH_AGAIN", "SSH_AUTH_SUCCESS", "Io", "Park", "describe", "text"]

# libssh return codes (libssh.h): SSH_AGAIN for connect/open/exec/read, SSH_AUTH_AGAIN for
# userauth_*; SSH_WRITE_PENDING in ssh_get_poll_flags() means libssh waits to write, not read.
SSH_AGAIN = -2
SSH_AUTH_AGAIN = 4
SSH_AUTH_SUCCESS = 0
_SSH_WRITE_PENDING = 0x08

_RECHECK_SECONDS = 0.25
"""Longest park on the socket without re-asking libssh: a packet libssh already took off the
socket while answering another call (data for the other stream, EOF, CHANNEL_CLOSE) does not
make the fd readable again, so a wait for readability alone could outlast the exchange."""

_WOKE_WRITABLE = -1
"""``Park.woke`` after a park that ended on "writable" (libssh had output pending)."""
_BACKOFF_FIRST = 0.001
"""First pause after a wake-up after which nothing moved -- on a readable socket libssh took
nothing from, or on a writable one while libssh said it had output pending; it doubles on every
further such round, up to ``_RECHECK_SECONDS``: a socket libssh will not read (or a buffer it
does not flush) can never make the collect loop spin."""


class Io:
    """The libssh session plus the fd trio waits on."""

    def __init__(self, session: Any, fd: int) -> None:
        self.session = session
        self.fd = fd
        # The longest a libssh call made in blocking mode -- only ``Io.write``'s, on its worker
        # -- waits in libssh's poll on the socket before it answers (SSH_TIMEOUT_DEFAULT in
        # ``ssh_handle_packets_termination``: the session's timeout, infinite while unset).
        # Not a bound on its send(): see ``Io.write``.
        # libssh reads the option as a C ``long``; ssh-python's ``options_set_int_val`` hands
        # it an ``int`` (the upper half read from whatever follows on the stack), so the long
        # is passed as its native bytes.
        usec = struct.pack("@l", int(_RECHECK_SECONDS * 1_000_000))
        session.options_set(ssh.options.TIMEOUT_USEC, usec)

    async def wait(self) -> bool:
        """Park until the socket is ready in the direction libssh waits on; True if that was
        "readable"."""
        if self.session.get_poll_flags() & _SSH_WRITE_PENDING:
            await trio.lowlevel.wait_writable(self.fd)
            return False
        await trio.lowlevel.wait_readable(self.fd)
        return True

    def pump(self) -> None:
        """Make libssh read and process what the socket holds, now, without reading channel data.

        Once a channel has seen EOF and an exit report, no channel call reads packets any more:
        ``read_nonblocking`` answers EOF from its flags and ``get_exit_state`` its stored
        report, so a later CHANNEL_CLOSE would stay on the socket.  ``ssh_event_dopoll`` with
        timeout 0 runs libssh's socket callback once (read what is there, process whole
        packets) and never blocks.  The session's poll handle is lent to the event only for
        this call and given back to the session's own poll context after it."""
        event = ssh.event.Event()
        event.add_session(self.session)
        try:
            event.dopoll(0)
        finally:
            event.remove_session(self.session)

    async def write(self, channel: Any, data: bytes, stall: float) -> int | None:
        """``channel.write(data)`` on a worker thread: the bytes written, or None when the call
        was given up -- cancelled, or not returned ``stall`` seconds after it began -- and the
        connection was ended for it (or the write never began).

        ssh-python's write loops in C, without returning, until libssh has taken every byte.
        ``data`` never exceeds the channel's window (the caller's rule), so libssh writes it in
        one pass -- except while a key re-exchange is under way: libssh 0.11's
        ``channel_write_common`` then answers 0 (``ssh_waitsession_unblocked``), which the
        binding counts as progress, so a server that starts a re-exchange and never finishes
        it held the calling thread for as long as it liked.  On the trio thread that froze
        every task.  On a worker it holds only this call.  The session is blocking for the
        call (``_Write.run``), so each of those rounds waits in libssh's poll on the socket
        for the exchange's next packet, at most ``_RECHECK_SECONDS``, instead of asking again
        at once: a non-blocking session polled with timeout 0, and the loop spun one core
        until the bound (measured: 1.75 s of CPU in a 2.2 s stall).  That timeout does not
        bound the bytes' way into the kernel: libssh makes the socket blocking again once it
        is connected (``src/socket.c:360``), whatever the session's mode, so the packet is
        handed over by a blocking send() that waits for as long as the remote reads nothing
        off its socket (measured: a 64 KiB piece 3.0 s, until a server that stopped reading
        dropped the connection).  Only ``stall`` and cancellation end that wait.

        The session is never used by two threads at once: ``_Write`` says whether the worker
        began the call.  Given up before it began, the worker never touches the session; given
        up while it runs, the socket is shut down (libssh's next pump reads its end and the
        write fails) and the session is touched again only once the call has returned.  The
        workers are SSH writes' own (``_WRITERS``): a stuck one never holds a thread another
        part of the broker (a DNS lookup) waits for, and the ``stall`` clock starts when the
        call begins, not while it waits for a thread."""
        op = _Write(self.session, channel, data, stall)
        try:
            with op.bound:  # its deadline is set when the call begins
                _rc, written = await trio.to_thread.run_sync(
                    op.run, abandon_on_cancel=True, limiter=_writers()
                )
                return None if written is None else int(written)
        finally:
            if op.give_up():
                # It runs: end the connection so that it returns, and wait for that before
                # anyone touches the session again (microseconds once the socket is shut).
                self.end()
                with trio.CancelScope(shield=True):
                    await op.returned.wait()
                op.outcome = None  # what it returned after the connection's end says nothing
        # The stall passed.  A call that returned in that same instant (its answer not yet
        # delivered when the bound fired) stands as it returned: nothing was ended for it.
        return op.answer()

    def end(self) -> None:
        """End the TCP connection now: the fd is shut down, not closed (libssh owns it and
        closes it when the session is freed), through a socket object lent the fd and detached
        from it after -- no new descriptor, so a process out of them still ends it."""
        try:
            lent = socket.socket(fileno=self.fd)
        except OSError:
            return
        try:
            lent.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            lent.detach()

    def pending(self) -> int:
        """Bytes waiting in the kernel's receive buffer of the socket (FIONREAD)."""
        try:
            raw = fcntl.ioctl(self.fd, termios.FIONREAD, b"\0\0\0\0")
        except OSError:
            return 0
        return int(struct.unpack("i", raw)[0])

    async def call(self, fn: Callable[..., Any], *args: Any, again: int = SSH_AGAIN) -> Any:
        while True:
            rc = fn(*args)
            code = rc[0] if isinstance(rc, tuple) else rc
            if code != again:
                return rc
            await self.wait()

    def alive(self) -> bool:
        return bool(self.session.is_connected())

    def host_key(self) -> bytes:
        """The server's host key of the current keys, base64 as libssh exports it."""
        return bytes(self.session.get_server_publickey().export_pubkey_base64())


class Park:
    """The collect loop's wait between rounds in which nothing observable changed: on the
    socket, for at most ``_RECHECK_SECONDS``, and never in a spin."""

    def __init__(self, io: Io) -> None:
        self.io = io
        self.woke: int | None = None
        """bytes on the socket when a park last ended on "readable" (``_WOKE_WRITABLE`` when it
        ended on "writable"), None once a round moved something"""
        self.stalls = 0
        """consecutive such wake-ups after which libssh took nothing off the socket"""

    def moved(self) -> None:
        """A round made progress: the next park waits on the socket at once."""
        self.woke, self.stalls = None, 0

    async def __call__(self) -> None:
        # If the last park ended because the socket was readable and libssh has not taken a
        # byte off it since, waiting on the socket would return at once again: back off
        # instead of spinning.
        woke = self.woke
        if woke is not None and (woke == _WOKE_WRITABLE or self.io.pending() >= woke):
            self.stalls = min(self.stalls + 1, 16)  # 2**15 ms > the recheck: never overflows
            await trio.sleep(min(_RECHECK_SECONDS, _BACKOFF_FIRST * 2 ** (self.stalls - 1)))
        else:
            self.stalls = 0
        self.woke = None
        with trio.move_on_after(_RECHECK_SECONDS):
            # Writable: libssh said it had output pending.  The socket stays writable, so if no
            # call then moved anything, waiting on it again returns at once as well.
            self.woke = self.io.pending() if await self.io.wait() else _WOKE_WRITABLE


def describe(exc: BaseException) -> str:
    """A short, secret-free description of a library exception for ``detail``."""
    args = getattr(exc, "args", ())
    said = next((a for a in reversed(args) if isinstance(a, bytes | str)), "")
    if isinstance(said, bytes):
        said = said.decode("utf-8", "replace")
    return f"{type(exc).__name__}: {said}"[:200] if said else type(exc).__name__


def text(value: Any) -> str:
    """Remote bytes (a kex name, a signal name) as text; undecodable bytes replaced."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


_WRITERS: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("ssh_writers")
WRITERS = 8
"""Stdin writes of SSH calls on worker threads at once (``Io.write``): each stuck one (a key
re-exchange that never ends, a remote that reads nothing off its socket) holds its thread,
waiting in libssh's poll or in send(), until its ``stall``; the rest wait their turn."""


def _writers() -> trio.CapacityLimiter:
    try:
        return _WRITERS.get()
    except LookupError:
        limiter = trio.CapacityLimiter(WRITERS)
        _WRITERS.set(limiter)
        return limiter


class _Write:
    """One ``channel.write`` handed to a worker: whether it began, is running or returned, under
    a lock both threads take, so that a write given up before it began never begins."""

    def __init__(self, session: Any, channel: Any, data: bytes, stall: float) -> None:
        self.session, self.channel, self.data, self.stall = session, channel, data, stall
        self.token = trio.lowlevel.current_trio_token()
        self.lock = threading.Lock()
        self.state = "idle"  # -> "running" -> "returned", or "skipped"
        self.returned = trio.Event()
        self.bound = trio.CancelScope()
        """Ends the wait ``stall`` seconds after the call began (``_began``)."""
        self.outcome: tuple[int, int] | BaseException | None = None
        """What the call returned or raised, kept for a wait the stall ended in that instant."""

    def run(self) -> tuple[int, int | None]:
        with self.lock:
            if self.state != "idle":
                return 0, None  # given up before it began: the session is not touched
            self.state = "running"
        try:
            self.token.run_sync_soon(self._began)
            self.session.set_blocking(True)  # waits in libssh's poll, not in a spin (Io.write)
            try:
                rc, written = self.channel.write(self.data)
            finally:
                self.session.set_blocking(False)
            self.outcome = (rc, written)
            return rc, written
        except BaseException as exc:
            self.outcome = exc
            raise
        finally:
            with self.lock:
                self.state = "returned"
            self.token.run_sync_soon(self.returned.set)

    def answer(self) -> int | None:
        """After the stall ended the wait: the count a call that returned meanwhile wrote (its
        error raised again), None when it was given up."""
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return None if self.outcome is None else int(self.outcome[1])

    def _began(self) -> None:
        self.bound.deadline = trio.current_time() + self.stall

    def give_up(self) -> bool:
        """On the way out of ``Io.write``: True when the call is still running (end the
        connection and wait for ``returned``); a call that never began never will."""
        with self.lock:
            if self.state == "idle":
                self.state = "skipped"
                return False
            return self.state == "running" and not self.returned.is_set()
