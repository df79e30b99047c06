"""The collect loop never parks on the socket for a packet libssh already took off it.

libssh pumps packets inside whichever call we make (a read on stdout, on stderr, or
``get_exit_state``), so the CHANNEL_CLOSE or a data packet can be consumed by one call after the
call that would have reported it already returned "nothing".  The fd is then not readable again
(the bytes are in libssh's buffers, not the socket's), and a loop that only waits for
readability hangs until the exec timeout — an hour by default — although the evidence is
complete.  Seen as a rare 10 s bound hit in ``test_hostile.py[closeonly]`` under load; this file
reproduces both orders deterministically with a scripted channel.
"""

from __future__ import annotations

from typing import Any

import pytest
import ssh.exceptions
import trio
from trio.testing import MockClock

from affidavit.adapters.base import AttemptInterrupted
from affidavit.adapters.ssh.driver import SshTarget, _Run
from affidavit.adapters.ssh.libssh import SSH_AGAIN
from affidavit.statemachine import Code, Outcome

from .conftest import Recorder

_BEFORE_COLLECT = (
    "tcp_connected", "transport_ready", "host_key_verified", "authenticated", "session_open",
    "exec", "exec_sent", "exec_accepted",
)  # fmt: skip


class _Channel:
    """libssh's channel as the loop sees it: every call pumps what is on the "socket" (as
    ``ssh_channel_read_nonblocking`` and ``get_exit_state`` do); ``arriving`` lands on the socket
    at the first ``get_exit_state`` — after both reads found nothing, the racy moment.

    Kinder than libssh: real ``read_nonblocking`` stops reading packets once the channel saw
    EOF, and real ``get_exit_state`` once it holds an exit report, so there the driver must
    pump (``Io.pump``) and must not spin on a readable fd.  That state is tested against a
    real peer: ``test_hostile.py`` (``slowclose``, ``unnamedsig``)."""

    def __init__(self, arriving: list[tuple[str, Any]]) -> None:
        self.socket: list[tuple[str, Any]] = []
        self.arriving = arriving
        self.buffers = {"stdout": bytearray(), "stderr": bytearray()}
        self.eof = False
        self.closed = False
        self.status = SSH_AGAIN

    def pump(self) -> None:
        while self.socket:
            kind, value = self.socket.pop(0)
            if kind == "data":
                self.buffers["stdout"] += value
            elif kind == "status":
                self.status = value
            elif kind == "close":
                self.eof = self.closed = True  # libssh sets remote_eof on CHANNEL_CLOSE

    def read_nonblocking(self, size: int, is_stderr: bool) -> tuple[int, bytes]:
        buf = self.buffers["stderr" if is_stderr else "stdout"]
        if not buf:
            self.pump()
        if buf:
            data = bytes(buf[:size])
            del buf[:size]
            return len(data), data
        if self.eof:
            raise ssh.exceptions.EOF
        return SSH_AGAIN, b""

    def get_exit_state(self) -> tuple[int, bytes, bool]:
        self.socket += self.arriving
        self.arriving = []
        self.pump()
        return self.status, b"", False

    def is_eof(self) -> bool:
        return self.eof and not any(self.buffers.values())

    def is_closed(self) -> bool:
        return self.closed

    def send_eof(self) -> None:
        pass

    def window_size(self) -> int:
        return 2 * 1024 * 1024  # no stdin in these tests: the window never moves


class _Io:
    """A socket with nothing more to read: every wait lasts until the caller gives up."""

    def __init__(self) -> None:
        self.waits = 0

    async def wait(self) -> bool:
        self.waits += 1
        await trio.sleep_forever()
        return True  # pragma: no cover

    def pump(self) -> None:
        pass  # the scripted channel's calls pump for themselves

    def pending(self) -> int:
        return 0

    def alive(self) -> bool:
        return True

    def host_key(self) -> bytes:
        return b""  # the key "verified" at setup (``Connection.host_key_b64``): never changes


def _run(channel: _Channel) -> tuple[_Run, _Io, Recorder]:
    rec = Recorder()
    run = _Run(SshTarget("127.0.0.1", 22, "bob", ()), None, "true", None, rec.ctx)  # type: ignore[arg-type]
    for event in _BEFORE_COLLECT:
        run.fire(event)
    io = _Io()
    run.conn.io, run.conn.channel = io, channel  # type: ignore[assignment]
    return run, io, rec


async def test_close_pumped_by_get_exit_state_is_seen_without_parking() -> None:
    # "closeonly": the data was read, then CHANNEL_CLOSE (no EOF, no exit-status) is consumed
    # by get_exit_state() in an iteration where nothing else progressed.
    channel = _Channel([("close", None)])
    run, io, rec = _run(channel)
    with trio.fail_after(5), pytest.raises(AttemptInterrupted) as ei:
        await run.collect()
    assert ei.value.code == Code.REMOTE_RESULT_INCOMPLETE
    assert rec.events[-2:] == ["eof", "channel_closed"] and io.waits == 0


async def test_data_pumped_by_get_exit_state_is_read_within_the_recheck(
    autojump_clock: MockClock,
) -> None:
    # A data packet taken off the socket by get_exit_state(): the channel's eof/closed flags do
    # not change, so the loop parks — but only for the recheck interval, then reads it.
    channel = _Channel([("data", b"late\n")])
    run, io, rec = _run(channel)

    async def exit_later() -> None:
        await trio.sleep(1)
        channel.socket += [("status", 0), ("close", None)]  # the fd never becomes readable

    async with trio.open_nursery() as nursery:
        nursery.start_soon(exit_later)
        with trio.fail_after(10):
            result = await run.collect()
    assert (result.outcome, result.code) == (Outcome.COMMITTED, None)
    assert rec.stream("stdout") == b"late\n" and result.summary["exit_status"] == 0
    assert 2 <= io.waits <= 10  # re-asked libssh every recheck interval, never hung


class _DeafIo(_Io):
    """A socket that is always readable and that libssh never reads (the old busy loop)."""

    async def wait(self) -> bool:
        self.waits += 1
        await trio.lowlevel.checkpoint()
        return True

    def pending(self) -> int:
        return 36


async def test_a_socket_libssh_never_reads_costs_a_wait_per_recheck_for_hours(
    autojump_clock: MockClock,
) -> None:
    # Exit-status and EOF are in, the close never comes, the fd stays readable: the loop backs
    # off to one round per recheck interval — and keeps doing so for hours (the back-off's
    # exponent is capped: an uncapped 2**n overflowed float after a few minutes).
    channel = _Channel([("status", 0)])
    channel.eof = True
    run, _io, rec = _run(channel)
    io = _DeafIo()
    run.conn.io = io  # type: ignore[assignment]
    with pytest.raises(trio.TooSlowError):
        with trio.fail_after(3 * 3600):
            await run.collect()
    assert rec.events[-2:] == ["exit_status", "eof"]
    assert 3 * 3600 / 0.25 <= io.waits <= 3 * 3600 / 0.25 + 20


class _BurstAfterEof(_Channel):
    """Both streams at EOF; the exit-status and the CHANNEL_CLOSE then reach libssh in one
    read -- the driver's pump (``Io.pump``) takes them off the socket together, while
    ``get_exit_state`` before it found nothing yet (as real libssh does when the packets land
    between the two calls: seen 1 in ~15 runs of ``test_sshd.py``'s eight concurrent execs)."""

    def get_exit_state(self) -> tuple[int, bytes, bool]:
        return self.status, b"", False  # nothing on the socket at this call


class _PumpIo(_Io):
    def __init__(self, channel: _Channel) -> None:
        super().__init__()
        self.channel = channel

    def pump(self) -> None:
        self.channel.socket += self.channel.arriving
        self.channel.arriving = []
        self.channel.pump()


async def test_an_exit_report_pumped_with_the_close_is_read_before_the_close_is_judged() -> None:
    # The close used to be judged with the exit state read before the pump that brought both:
    # a complete result (exit-status 0) reported as "channel closed without exit-status".
    channel = _BurstAfterEof([("status", 0), ("close", None)])
    channel.buffers["stdout"] += b"out\n"
    channel.eof = True
    run, _io, rec = _run(channel)
    run.conn.io = _PumpIo(channel)  # type: ignore[assignment]
    with trio.fail_after(5):
        result = await run.collect()
    assert (result.outcome, result.code) == (Outcome.COMMITTED, None)
    assert result.summary["exit_status"] == 0 and rec.stream("stdout") == b"out\n"
    assert rec.events[-3:] == ["exit_status", "eof", "channel_closed"], rec.events
