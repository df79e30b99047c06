"""The TCP socket of a set-up that fails before libssh owns it is closed at once.

``Connection.setup`` hands the fd to libssh only inside ``handshake`` (``sock.detach``); a
failure between the connect and that hand-over -- a pinned key type this libssh cannot
negotiate, an observer that raises -- left the connected socket open until the garbage
collector found it (audit 51a's suspected leak, confirmed for these paths; a cancellation
cannot land there: nothing between them awaits, and trio closes a socket whose connect is
cancelled).
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from affidavit.adapters.ssh import connect, perform, prepare_credential

from .conftest import Recorder, SshKeys, hostile_target
from .hostile import HostileServer


class _Boom(Exception):
    pass


async def test_a_failure_before_libssh_owns_the_socket_closes_it(
    hostile: HostileServer, ssh_keys: SshKeys, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[Any] = []
    real_open = connect.open_tcp

    async def recording_open(target: Any) -> Any:
        sock = await real_open(target)
        opened.append(sock)
        return sock

    monkeypatch.setattr(connect, "open_tcp", recording_open)
    rec = Recorder()
    real_observe = rec.ctx.observe

    def observe(step: Any, facts: Any) -> None:
        real_observe(step, facts)
        if step.event == "tcp_connected":
            raise _Boom  # the engine's observer failing (a journal error) before the hand-over

    rec.ctx.observe = observe  # type: ignore[method-assign]
    with trio.fail_after(10), pytest.raises(_Boom):
        target = hostile_target(hostile)
        await perform(target, prepare_credential(ssh_keys.client_key), "exit 0", None, rec.ctx)
    [sock] = opened
    assert sock.fileno() == -1  # closed now, not when collected
