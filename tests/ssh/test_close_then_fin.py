"""A server that ends the TCP connection right after a complete result (exit-status, EOF and
CHANNEL_CLOSE, then its FIN in the same breath), against the scripted server.

libssh reports a dead session's channel as closed too, so only a close seen while the session is
alive proves one.  The driver pumped the socket once both streams were at EOF even when the
close was already in: the pump read the FIN, the session died, and the complete result was
REMOTE_RESULT_INCOMPLETE / REMOTE_OUTCOME_UNKNOWN in most loopback runs (measured 39 of 40).
Once the close is in, nothing touches the socket any more, and the result is the result.
"""

from __future__ import annotations

import trio

from affidavit.adapters.ssh import perform, prepare_credential
from affidavit.statemachine import Outcome

from .conftest import Recorder, SshKeys, hostile_target
from .hostile import HostileServer

RUNS = 10
"""Every run must be a result: before the fix about one in ten was."""


async def test_a_result_followed_at_once_by_the_connections_end_is_still_the_result(
    hostile: HostileServer, ssh_keys: SshKeys
) -> None:
    credential = prepare_credential(ssh_keys.client_key)
    for _ in range(RUNS):
        rec = Recorder()
        with trio.fail_after(10):
            res = await perform(hostile_target(hostile), credential, "exitdrop", None, rec.ctx)
        assert (res.outcome, res.code, res.summary["exit_status"]) == (Outcome.COMMITTED, None, 0)
        assert rec.events[-2:] == ["eof", "channel_closed"] and "exit_status" in rec.events
        assert rec.stream("stdout") == b"out\n"
