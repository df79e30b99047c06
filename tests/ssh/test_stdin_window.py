"""stdin is written only into the server's open receive window, so a server that stops reading
never holds the trio loop.

ssh-python's ``Channel.write`` loops in C, without yielding, until every byte it was given is
written; libssh 0.11 answers 0 (not "again") while the window is shut, and the binding counts 0
as progress.  A write larger than the window therefore spun on the trio thread until the server
opened the window again: the exec timeout, cancellation and every other task stopped with it.
"""

from __future__ import annotations

import socket
import time

import pytest
import trio

from affidavit.adapters.base import AttemptInterrupted
from affidavit.adapters.ssh import connect, libssh, perform, prepare_credential
from affidavit.statemachine import Code, Outcome
from tests.cancel import REACHED_WITHIN, cancel_once

from .conftest import LOOP_HELD, Recorder, SshKeys, hostile_target
from .hostile import SMALL_WINDOW, HostileServer

STDIN = b"x" * 100_000
SERVER_ENDS = 12
"""Seconds the stalling server holds out (``stall``, ``rekeystall``, ``deaf``): a client bound
only by it takes that long; one bound by its own 1-1.5 s timeout answers within
``SERVER_ENDS - 4`` even when a loaded machine slows its handshake by seconds (the bound was
3-4 s, against a 6 s server: a handshake slowed 2 s would have failed it)."""
STALL, REKEYSTALL, DEAF = (f"{verb} {SERVER_ENDS}" for verb in ("stall", "rekeystall", "deaf"))
"""Four times the scripted server's small window."""


async def _ticking(run: object) -> tuple[object, list[float], float]:
    """Await ``run`` beside a 10 ms ticker on the same loop; the ticker's gaps, the time taken."""
    gaps: list[float] = []
    done = trio.Event()

    async def ticker() -> None:
        last = trio.current_time()
        while not done.is_set():
            await trio.sleep(0.01)
            now = trio.current_time()
            gaps.append(now - last)
            last = now

    outcome: list[object] = []

    async def call() -> None:
        try:
            outcome.append(await run)  # type: ignore[misc]
        except AttemptInterrupted as exc:
            outcome.append(exc)
        finally:
            done.set()

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        nursery.start_soon(call)
    return outcome[0], gaps, trio.current_time() - start


async def test_a_server_that_stops_reading_stdin_lets_the_exec_timeout_fire_on_time(
    hostile: HostileServer, ssh_keys: SshKeys
) -> None:
    # The server reads nothing for 12 s; its 24 KiB window is shut after the first write.  Before
    # the fix the write spun until the server read again, then the call came back complete,
    # exit-status 0.  (``took`` counts the handshake too: a loaded machine's few seconds.)
    assert len(STDIN) > 4 * SMALL_WINDOW
    rec = Recorder()
    target = hostile_target(hostile, "smallwin", exec=1.0)
    cred = prepare_credential(ssh_keys.client_key)
    with trio.fail_after(20):
        res, gaps, took = await _ticking(perform(target, cred, STALL, STDIN, rec.ctx))
    assert isinstance(res, AttemptInterrupted), res
    assert res.code == Code.REMOTE_OUTCOME_UNKNOWN and rec.events[-1] == "timed_out"
    assert took < SERVER_ENDS - 4  # the 1 s exec timeout, not the server's 12 s
    assert len(gaps) > 50 and max(gaps) < LOOP_HELD  # the loop was never held


@pytest.mark.parametrize("pause", [0.0, 1.5])
async def test_stdin_larger_than_the_window_is_delivered_whole_as_the_window_reopens(
    hostile: HostileServer, ssh_keys: SshKeys, pause: float
) -> None:
    rec = Recorder()
    target = hostile_target(hostile, "smallwin", exec=10.0)
    cred = prepare_credential(ssh_keys.client_key)
    with trio.fail_after(20):
        res, gaps, _took = await _ticking(perform(target, cred, f"stall {pause}", STDIN, rec.ctx))
    assert not isinstance(res, AttemptInterrupted), res
    assert (res.outcome, res.code) == (Outcome.COMMITTED, None)  # type: ignore[attr-defined]
    assert rec.stream("stdout") == b"%d\n" % len(STDIN)  # the server read every byte
    assert max(gaps) < LOOP_HELD


async def test_a_key_reexchange_that_never_ends_lets_the_exec_timeout_fire_on_time(
    hostile: HostileServer, ssh_keys: SshKeys
) -> None:
    # The window is open, but the server started a key re-exchange it never finishes: libssh
    # answers every write 0 until it ends, and ssh-python's write loop spun on the trio thread
    # until the server dropped the connection (12 s here; never, for a patient server).
    rec = Recorder()
    target = hostile_target(hostile, "smallwin", exec=1.0)
    cred = prepare_credential(ssh_keys.client_key)
    with trio.fail_after(20):
        res, gaps, took = await _ticking(perform(target, cred, REKEYSTALL, STDIN, rec.ctx))
    assert isinstance(res, AttemptInterrupted), res
    assert res.code == Code.REMOTE_OUTCOME_UNKNOWN and rec.events[-1] == "timed_out"
    assert took < SERVER_ENDS - 4  # the 1 s exec timeout, not the server's 12 s
    assert len(gaps) > 50 and max(gaps) < LOOP_HELD


async def test_a_key_reexchange_that_never_ends_is_given_the_connect_timeout(
    hostile: HostileServer, ssh_keys: SshKeys
) -> None:
    # The exec timeout (an hour by default) is no bound for a stuck write: the re-exchange
    # gets what the first exchange got, the connect timeout; then the connection is ended.
    rec = Recorder()
    target = hostile_target(hostile, "smallwin", exec=30.0, connect=1.5)
    cred = prepare_credential(ssh_keys.client_key)
    with trio.fail_after(20):
        res, gaps, took = await _ticking(perform(target, cred, REKEYSTALL, STDIN, rec.ctx))
    assert isinstance(res, AttemptInterrupted), res
    assert res.code == Code.REMOTE_OUTCOME_UNKNOWN and rec.events[-1] == "connection_lost"
    assert "key re-exchange" in res.detail and "1.5s" in res.detail
    assert took < SERVER_ENDS - 4  # 1.5 s, not the server's 12 s
    assert max(gaps) < LOOP_HELD


async def test_a_key_reexchange_that_never_ends_is_waited_for_not_spun_on(
    hostile: HostileServer, ssh_keys: SshKeys
) -> None:
    # While the re-exchange is under way libssh answers every write 0; ssh-python's write loop
    # asked again at once, so the worker spun one core until the connect timeout ended the
    # connection (CPU time ~ the wall time of the stall).  It now waits in libssh's poll on
    # the socket.  CPU time of this process (its threads, the scripted server's included)
    # against the wall time of the same call: load from other processes stretches the wall
    # time, never this process's CPU time.
    rec = Recorder()
    target = hostile_target(hostile, "smallwin", exec=30.0, connect=2.0)
    cred = prepare_credential(ssh_keys.client_key)
    wall, cpu = time.monotonic(), time.process_time()
    with trio.fail_after(20):
        with pytest.raises(AttemptInterrupted) as caught:
            await perform(target, cred, "rekeystall 6", STDIN, rec.ctx)
    wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    assert rec.events[-1] == "connection_lost" and "key re-exchange" in caught.value.detail
    assert wall > 2.0  # the stall lasted the connect timeout
    assert cpu < wall / 4, f"{cpu:.2f}s of CPU in {wall:.2f}s"


async def test_a_caller_cancelling_during_a_stuck_reexchange_is_answered_at_once(
    hostile: HostileServer, ssh_keys: SshKeys
) -> None:
    rec = Recorder()
    target = hostile_target(hostile, "smallwin", exec=30.0)
    cred = prepare_credential(ssh_keys.client_key)
    with trio.fail_after(REACHED_WITHIN + 20), trio.CancelScope() as caller:
        async with trio.open_nursery() as nursery:
            # The caller gives up 0.6 s after the exec request (the server stalls 0.2 s after
            # it), not 1 s after the call began: a loaded machine had not always sent it by
            # then.  "At once" is timed from the cancellation, not from the call's start.
            sent = lambda: rec.ctx.machine.dispatched  # noqa: E731
            nursery.start_soon(cancel_once, caller, sent, "exec sent", 0.6)
            await perform(target, cred, "rekeystall 6", STDIN, rec.ctx)
    assert caller.cancelled_caught and trio.current_time() - caller.deadline < 2.0
    assert rec.events[-1] == "cancelled" and rec.ctx.machine.dispatched


@pytest.fixture
def small_send_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client's socket gets a 4 KiB send buffer: a server that reads nothing off its socket
    fills the kernel's buffers after a few KiB."""
    init = libssh.Io.__init__

    def small(self: libssh.Io, session: object, fd: int) -> None:
        init(self, session, fd)
        lent = socket.socket(fileno=fd)
        try:
            lent.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        finally:
            lent.detach()

    monkeypatch.setattr(libssh.Io, "__init__", small)


async def test_a_write_the_server_never_takes_off_its_socket_is_ended_at_the_stall_bound(
    hostile: HostileServer, ssh_keys: SshKeys, small_send_buffer: None
) -> None:
    # The window is open, but the server reads nothing more off its socket.  libssh sets the
    # socket blocking again once connected (src/socket.c:360), so a piece of stdin is handed to
    # the kernel by a blocking send(): the session timeout (0.25 s) bounds none of that wait,
    # only the stall bound (the connect timeout) and cancellation end it.
    rec = Recorder()
    target = hostile_target(hostile, "bob", exec=30.0, connect=1.0)
    cred = prepare_credential(ssh_keys.client_key)
    with trio.fail_after(20):
        res, gaps, took = await _ticking(perform(target, cred, DEAF, STDIN * 10, rec.ctx))
    assert isinstance(res, AttemptInterrupted), res
    assert res.code == Code.REMOTE_OUTCOME_UNKNOWN and rec.events[-1] == "connection_lost"
    assert "did not return within 1.0s" in res.detail
    assert took < SERVER_ENDS - 4  # 1 s, not the server's 12 s
    assert max(gaps) < LOOP_HELD  # the write waits on its worker, not on the trio thread


async def test_data_after_eof_taken_in_during_one_blocking_write_cannot_be_told_apart(
    hostile: HostileServer, ssh_keys: SshKeys, small_send_buffer: None
) -> None:
    # A known limit, pinned (docs/ssh-driver.md, "What the drain proves holds for one read"):
    # the stdin write runs blocking, and while its flush waits for a server that reads nothing
    # off its socket, libssh takes "out" and EOF in one read and "late" in a later one, into
    # one buffer -- no read of the driver's between them.  Read back as "out\nlate\n", then
    # EOF: committed.  If this fails, the driver has learnt to see it: make it stream_broken
    # and update the doc.
    rec = Recorder()
    target = hostile_target(hostile, "bob", exec=10.0)
    cred = prepare_credential(ssh_keys.client_key)
    with trio.fail_after(20):
        res = await perform(target, cred, "deaflate", STDIN * 10, rec.ctx)
    assert (res.outcome, res.code, res.summary["exit_status"]) == (Outcome.COMMITTED, None, 0)
    assert rec.stream("stdout") == b"out\nlate\n"


async def test_a_blocking_libssh_call_waits_at_most_the_recheck(
    hostile: HostileServer, ssh_keys: SshKeys
) -> None:
    # ``Io`` sets libssh's session timeout: without it a blocking call (the stdin write's, on
    # its worker) waits in libssh's poll without end -- for a key re-exchange's next packet.
    # It bounds libssh's polls only, not a send() into a full socket (the test above).
    rec = Recorder()
    conn = connect.Connection(
        hostile_target(hostile), prepare_credential(ssh_keys.client_key), rec.ctx
    )
    with trio.fail_after(20):
        await conn.setup()
    assert conn.io is not None and conn.channel is not None
    io, channel = conn.io, conn.channel

    began = trio.Event()

    def blocking_read() -> float:
        io.session.set_blocking(True)
        trio.from_thread.run_sync(began.set)
        start = time.monotonic()
        try:
            channel.read(16)  # nothing ever comes: no command was requested
        except Exception:  # the watchdog ended the connection under it
            pass
        finally:
            io.session.set_blocking(False)
        return time.monotonic() - start

    async def watchdog() -> None:
        # Counted from the read's start, as ``took`` is: a worker thread a loaded machine
        # starts late must not shorten the wait the test would see without the timeout.
        await began.wait()
        await trio.sleep(3.0)
        io.end()  # a read that waits without end returns once the socket is shut down

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watchdog)
            took = await trio.to_thread.run_sync(blocking_read)
            nursery.cancel_scope.cancel()
    finally:
        await conn.close()
    assert libssh._RECHECK_SECONDS * 0.8 < took < 2.0, took  # without the timeout: 3 s
