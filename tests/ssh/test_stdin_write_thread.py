"""``Io.write`` hands one ``channel.write`` to a worker thread and never lets two threads use
the session at once: a write given up before its thread began never begins; one given up while
it runs ends the connection and is waited for; the ``stall`` clock starts when the call begins,
not while it waits for a thread; SSH writes have threads of their own.  A fake channel stands in
for libssh (no server needed); every wait is bounded."""

from __future__ import annotations

import socket
import threading

import pytest
import trio

from affidavit.adapters.ssh import libssh

BOUND = 10.0
"""The ceiling on every wait here (a hang fails, it does not stall the worker)."""


class FakeChannel:
    """``write`` blocks until ``release`` is set or the socket pair's far end reads EOF
    (``Io.end`` shut it down); records every call and whether one overlapped another."""

    def __init__(self, far: socket.socket) -> None:
        self.far = far
        self.release = threading.Event()
        self.began = threading.Event()
        self.calls = 0
        self.busy = False
        self.overlapped = False

    def write(self, data: bytes) -> tuple[int, int]:
        if self.busy:
            self.overlapped = True
        self.busy = True
        self.calls += 1
        self.began.set()
        try:
            self.far.settimeout(BOUND)
            while not self.release.is_set():
                try:
                    self.far.settimeout(0.01)
                    if self.far.recv(1) == b"":
                        return -1, 0  # the connection ended under it: the write fails
                except TimeoutError:
                    continue
            return 0, len(data)
        finally:
            self.busy = False


class FakeSession:
    """What ``Io`` asks of the libssh session: its blocking mode (each change recorded) and
    the option it sets."""

    def __init__(self) -> None:
        self.blocking: list[bool] = []
        self.options: list[tuple[object, bytes]] = []

    def set_blocking(self, blocking: bool) -> None:
        self.blocking.append(bool(blocking))

    def options_set(self, option: object, value: bytes) -> None:
        self.options.append((option, value))


@pytest.fixture
def pair() -> object:
    near, far = socket.socketpair()
    yield near, far
    near.close()
    far.close()


def _io(near: socket.socket, session: FakeSession | None = None) -> libssh.Io:
    return libssh.Io(session=session or FakeSession(), fd=near.fileno())


async def test_a_write_that_returns_gives_its_count(pair: tuple[socket.socket, ...]) -> None:
    near, far = pair
    channel = FakeChannel(far)
    channel.release.set()
    with trio.fail_after(BOUND):
        assert await _io(near).write(channel, b"abc", stall=BOUND) == 3
    assert channel.calls == 1


class Failing:
    """A channel whose write raises, as libssh's does for a connection that died under it."""

    def write(self, data: bytes) -> tuple[int, int]:
        raise OSError("Socket error: disconnected")


async def test_the_write_runs_on_a_blocking_session_and_leaves_it_non_blocking(
    pair: tuple[socket.socket, ...],
) -> None:
    """Blocking, libssh waits in its poll while a key re-exchange holds the write instead of
    answering 0 at once to ssh-python's loop (``test_stdin_window.py`` measures the CPU); every
    other libssh call is made non-blocking, so the mode is given back however the call ends."""
    near, far = pair
    session = FakeSession()
    channel = FakeChannel(far)
    channel.release.set()
    seen: list[list[bool]] = []
    write = channel.write

    def observed(data: bytes) -> tuple[int, int]:
        seen.append(list(session.blocking))
        return write(data)

    channel.write = observed  # type: ignore[method-assign]
    with trio.fail_after(BOUND):
        assert await _io(near, session).write(channel, b"abc", stall=BOUND) == 3
    assert seen == [[True]] and session.blocking == [True, False]
    with trio.fail_after(BOUND), pytest.raises(OSError, match="disconnected"):
        await _io(near, session).write(Failing(), b"abc", stall=BOUND)
    assert session.blocking == [True, False, True, False]


@pytest.mark.parametrize("end", ["stall", "cancel"])
async def test_the_blocking_mode_is_given_back_once_a_write_given_up_returns(
    pair: tuple[socket.socket, ...], end: str
) -> None:
    """Given up -- its stall passed, or trio abandoned the worker on a cancel -- the call
    returns once the connection is ended under it, and only then is the session made
    non-blocking again: never while the call still uses it, never left blocking."""
    near, far = pair
    session = FakeSession()
    channel = FakeChannel(far)  # never released: only the connection's end returns it
    modes: list[tuple[bool, bool]] = []  # (blocking, the channel's write still running)
    set_blocking = session.set_blocking

    def observed(blocking: bool) -> None:
        modes.append((bool(blocking), channel.busy))
        set_blocking(blocking)

    session.set_blocking = observed  # type: ignore[method-assign]
    io = _io(near, session)
    with trio.fail_after(BOUND):
        if end == "stall":
            assert await io.write(channel, b"abc", stall=0.1) is None
        else:
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:

                    async def cancel_once_running() -> None:
                        await trio.to_thread.run_sync(channel.began.wait, BOUND)
                        scope.cancel()

                    nursery.start_soon(cancel_once_running)
                    await io.write(channel, b"abc", stall=BOUND)
            assert scope.cancelled_caught
    assert modes == [(True, False), (False, False)] and channel.calls == 1


async def test_a_write_cancelled_before_its_thread_began_never_begins(
    pair: tuple[socket.socket, ...],
) -> None:
    near, far = pair
    channel = FakeChannel(far)
    with trio.move_on_after(BOUND) as outer:
        with trio.CancelScope() as scope:
            scope.cancel()  # already cancelled when the write is asked for
            await _io(near).write(channel, b"abc", stall=BOUND)
    assert not outer.cancelled_caught, "the write hung on a call that never began"
    await trio.sleep(0.2)  # a thread that would still begin has had its chance
    assert channel.calls == 0


async def test_a_write_whose_thread_begins_after_it_was_given_up_never_writes(
    pair: tuple[socket.socket, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thread is started (trio handed it the call) but reaches the call only after the
    write was given up: it must not touch the session."""
    near, far = pair
    channel = FakeChannel(far)
    late = threading.Event()

    class Late(libssh._Write):
        def run(self) -> tuple[int, int | None]:
            late.wait(BOUND)
            return super().run()

    monkeypatch.setattr(libssh, "_Write", Late)
    with trio.fail_after(BOUND):
        with trio.move_on_after(0.05):
            await _io(near).write(channel, b"abc", stall=BOUND)
        late.set()  # the thread goes on, after the give-up
        await trio.sleep(0.2)
    assert channel.calls == 0


async def test_a_write_that_waits_for_a_thread_is_not_timed_while_it_waits(
    pair: tuple[socket.socket, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With every SSH writer thread taken, a write waits for one without its stall running:
    given one, it completes."""
    near, far = pair
    limiter = trio.CapacityLimiter(1)
    monkeypatch.setattr(libssh, "_writers", lambda: limiter)
    channel = FakeChannel(far)
    channel.release.set()
    with trio.fail_after(BOUND):
        await limiter.acquire()
        async with trio.open_nursery() as nursery:
            got: list[int | None] = []

            async def write() -> None:
                got.append(await _io(near).write(channel, b"abcd", stall=0.05))

            nursery.start_soon(write)
            await trio.sleep(0.3)  # six stalls' worth, waiting for the thread
            assert channel.calls == 0 and got == []  # it did wait: the writers' own limiter
            limiter.release()
    assert got == [4]


async def test_a_write_that_stalls_ends_the_connection_and_is_waited_for(
    pair: tuple[socket.socket, ...],
) -> None:
    near, far = pair
    channel = FakeChannel(far)  # never released: only the connection's end returns it
    with trio.fail_after(BOUND):
        assert await _io(near).write(channel, b"abc", stall=0.1) is None
    assert channel.began.is_set() and not channel.busy  # returned before write() did


async def test_a_write_cancelled_while_it_runs_is_waited_for_before_the_cancel_goes_on(
    pair: tuple[socket.socket, ...],
) -> None:
    near, far = pair
    channel = FakeChannel(far)
    with trio.fail_after(BOUND):
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:

                async def cancel_once_running() -> None:
                    await trio.to_thread.run_sync(channel.began.wait, BOUND)
                    scope.cancel()

                nursery.start_soon(cancel_once_running)
                await _io(near).write(channel, b"abc", stall=BOUND)
    assert scope.cancelled_caught
    assert channel.calls == 1 and not channel.busy and not channel.overlapped


async def test_a_write_that_returns_as_its_stall_passes_stands_as_it_returned(
    pair: tuple[socket.socket, ...],
) -> None:
    """The stall's bound fires with the call returned but its answer not yet delivered: the
    count stands (nothing was ended for it), not "did not return"."""
    _near, far = pair
    channel = FakeChannel(far)
    op = libssh._Write(FakeSession(), channel, b"abcd", stall=BOUND)
    channel.release.set()
    op.run()  # returned, as a worker would have, before the wait read its answer
    assert op.give_up() is False and op.answer() == 4
    failing = libssh._Write(FakeSession(), channel, b"x", stall=BOUND)
    failing.outcome = OSError("Remote channel is closed")
    with pytest.raises(OSError, match="closed"):
        failing.answer()


def test_ending_the_connection_needs_no_new_descriptor(
    pair: tuple[socket.socket, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of descriptors (``os.dup`` failing), the connection is still ended: the far end
    reads EOF."""
    near, far = pair

    def no_fd(fd: int) -> int:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr("os.dup", no_fd)
    _io(near).end()
    far.settimeout(BOUND)
    assert far.recv(1) == b""
    assert near.fileno() >= 0  # the fd is libssh's: shut down, never closed


async def test_ssh_writes_have_threads_of_their_own() -> None:
    assert libssh._writers() is libssh._writers()
    assert libssh._writers() is not trio.to_thread.current_default_thread_limiter()
    assert libssh._writers().total_tokens == libssh.WRITERS
