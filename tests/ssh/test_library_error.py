"""An error libssh raises after dispatch, on a live connection, that no rule of the driver reads:
fault injection at the ssh-python boundary (the channel object), against the scripted server.

It used to escape the driver raw: the engine answered ``unknown``, but the protocol machine
stayed in a running state with no closing step.  It now ends the attempt ``library_error`` ->
``interrupted`` with a stable code: REMOTE_OUTCOME_UNKNOWN, or REMOTE_RESULT_INCOMPLETE once an
exit report was seen.
"""

from __future__ import annotations

from typing import Any

import pytest
import ssh.exceptions
import trio

from affidavit.adapters.base import AttemptInterrupted, SetupError
from affidavit.adapters.ssh import connect, libssh, perform, prepare_credential
from affidavit.statemachine import Code

from .conftest import Recorder, SshKeys, hostile_target
from .hostile import HostileServer


class _FaultyChannel:
    """The driver's ssh-python channel, whose ``read_nonblocking`` raises libssh's error once
    ``armed`` -- at once, or after ``get_exit_state`` reported an exit."""

    def __init__(self, channel: Any, *, after_exit: bool) -> None:
        self._channel = channel
        self.armed = not after_exit

    def __getattr__(self, name: str) -> Any:
        return getattr(self._channel, name)

    def get_exit_state(self) -> Any:
        state = self._channel.get_exit_state()
        if state[0] != -2:
            self.armed = True
        return state

    def read_nonblocking(self, size: int, is_stderr: bool) -> Any:
        if self.armed:
            raise ssh.exceptions.SSHError(-1, "injected libssh failure")
        return self._channel.read_nonblocking(size, is_stderr)


@pytest.mark.parametrize(
    ("command", "after_exit", "code"),
    [
        ("hang", False, Code.REMOTE_OUTCOME_UNKNOWN),
        ("status 0 5", True, Code.REMOTE_RESULT_INCOMPLETE),
    ],
    ids=["while-running", "after-exit-status"],
)
async def test_a_libssh_error_while_reading_ends_the_attempt_through_the_machine(
    hostile: HostileServer,
    ssh_keys: SshKeys,
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    after_exit: bool,
    code: Code,
) -> None:
    opened = connect.Connection.open_session

    async def open_faulty(conn: connect.Connection) -> None:
        await opened(conn)
        conn.channel = _FaultyChannel(conn.channel, after_exit=after_exit)

    monkeypatch.setattr(connect.Connection, "open_session", open_faulty)
    rec = Recorder()
    target = hostile_target(hostile, "bob")
    with trio.fail_after(10), pytest.raises(AttemptInterrupted) as ei:
        await perform(target, prepare_credential(ssh_keys.client_key), command, None, rec.ctx)
    assert ei.value.code == code
    assert "injected libssh failure" in ei.value.detail
    assert rec.events[-1] == "library_error"
    assert rec.ctx.machine.state == "interrupted" and rec.ctx.machine.dispatched
    assert (ei.value.facts["exit_status"] == 0) is after_exit


async def test_a_libssh_error_reading_the_host_key_before_dispatch_is_a_setup_failure(
    hostile: HostileServer, ssh_keys: SshKeys, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The key is read at verification and again just before dispatch (a re-exchange may have
    # switched it, tests/ssh/test_rekey_host_key.py): the second read fails.
    reads = {"n": 0}
    host_key = libssh.Io.host_key

    def failing(io: libssh.Io) -> bytes:
        reads["n"] += 1
        if reads["n"] > 1:
            raise ssh.exceptions.SSHError(-1, "injected libssh failure")
        return host_key(io)

    monkeypatch.setattr(libssh.Io, "host_key", failing)
    rec = Recorder()
    before = len(hostile.exec_requests)
    with trio.fail_after(10), pytest.raises(SetupError) as ei:
        await perform(
            hostile_target(hostile), prepare_credential(ssh_keys.client_key), "exit 0", None,
            rec.ctx,
        )  # fmt: skip
    assert (ei.value.code, ei.value.stage) == (Code.SETUP_FAILED, "host_key")
    assert rec.ctx.machine.state == "setup_failed" and not rec.ctx.machine.dispatched
    assert rec.gate_calls == [] and hostile.exec_requests[before:] == []
