"""What arrives on the channel before the exec reply (audit 51a, #1 and #3).

While the exec request waits for its reply no channel data is read, so the channel's receive
window is never adjusted; libssh 0.11 drops a data packet the window has no room for and goes
on.  A server that sent 3 MB before CHANNEL_SUCCESS had 2,080,000 bytes recorded and the result
committed.  And a channel closed before any reply was noticed only at the exec timeout.
"""

from __future__ import annotations

import pytest
import trio

from affidavit.adapters.base import AttemptInterrupted
from affidavit.adapters.ssh import perform, prepare_credential
from affidavit.adapters.ssh.before_reply import _LOCAL_WINDOW, _MAX_PACKET
from affidavit.statemachine import Code, Outcome

from .conftest import Recorder, SshKeys, hostile_target
from .hostile import HostileServer


@pytest.fixture
def key(ssh_keys: SshKeys) -> bytes:
    return ssh_keys.client_key


async def test_output_past_the_window_before_the_exec_reply_is_no_result(
    hostile: HostileServer, key: bytes
) -> None:
    # 2,976,000 bytes before CHANNEL_SUCCESS; libssh keeps 2,080,000 and drops the rest.
    rec = Recorder()
    with trio.fail_after(30), pytest.raises(AttemptInterrupted) as ei:
        target = hostile_target(hostile, "bob", exec=25)
        await perform(target, prepare_credential(key), "floodthenok 3", None, rec.ctx)
    assert ei.value.code == Code.REMOTE_OUTCOME_UNKNOWN
    assert "before the exec reply" in ei.value.detail
    assert rec.events[-1] == "stream_broken" and "exec_accepted" not in rec.events
    facts = ei.value.facts
    unread = facts["unread_stdout_bytes"] + facts["unread_stderr_bytes"]
    assert _LOCAL_WINDOW - _MAX_PACKET < unread <= _LOCAL_WINDOW
    assert facts["window"] == _LOCAL_WINDOW and facts["stdout_bytes"] == 0
    assert rec.ctx.machine.state == "interrupted" and not rec.ctx.machine.complete
    assert not rec.chunks  # nothing of it reached the sink


async def test_output_well_inside_the_window_before_the_exec_reply_is_still_a_result(
    hostile: HostileServer, key: bytes
) -> None:
    rec = Recorder()
    with trio.fail_after(30):
        target = hostile_target(hostile, "bob", exec=25)
        res = await perform(target, prepare_credential(key), "floodthenok 1", None, rec.ctx)
    assert (res.outcome, res.code, res.summary["exit_status"]) == (Outcome.COMMITTED, None, 0)
    assert rec.stream("stdout") == b"x" * 992_000


async def test_a_channel_closed_before_the_exec_reply_ends_the_attempt_at_once(
    hostile: HostileServer, key: bytes
) -> None:
    # "ran", exit-status 0, EOF and CHANNEL_CLOSE, and never a reply: the attempt waited for
    # the exec timeout and ended ``timed_out``.  The bound below only keeps a failure short.
    rec = Recorder()
    with trio.fail_after(30), pytest.raises(AttemptInterrupted) as ei:
        target = hostile_target(hostile, "bob", exec=20)
        await perform(target, prepare_credential(key), "closenoreply", None, rec.ctx)
    assert rec.events[-1] == "ended_unanswered", rec.events
    assert "timed_out" not in rec.events and "exec_accepted" not in rec.events
    assert ei.value.code == Code.REMOTE_RESULT_INCOMPLETE  # an exit report came: it ran
    assert "exec request was not answered" in ei.value.detail
    facts = ei.value.facts
    assert (facts["unread_stdout_bytes"], facts["exit_status"]) == (4, 0)
    assert rec.ctx.machine.state == "interrupted" and rec.ctx.machine.dispatched


async def test_output_then_a_close_without_exit_report_or_reply_ends_only_at_the_exec_timeout(
    hostile: HostileServer, key: bytes
) -> None:
    # A pinned limit (review of round 1): "ran", EOF and CHANNEL_CLOSE, no exit report, no
    # reply.  libssh holds the close back behind the unread "ran" (delayed close) and reports
    # no EOF on stdout while it holds data -- only the empty stderr answers EOF, which a server
    # that refuses after EOF shows as well.  Nothing shows the command's end, so the exec
    # timeout ends the attempt, ``unknown``.  Should libssh show the end, this fails.
    rec = Recorder()
    with trio.fail_after(30), pytest.raises(AttemptInterrupted) as ei:
        target = hostile_target(hostile, "bob", exec=1.5)
        await perform(target, prepare_credential(key), "closenoreply noexit", None, rec.ctx)
    assert rec.events[-1] == "timed_out", rec.events
    assert "ended_unanswered" not in rec.events and "exec_accepted" not in rec.events
    assert ei.value.code == Code.REMOTE_OUTCOME_UNKNOWN
    assert rec.ctx.machine.state == "interrupted" and rec.ctx.machine.dispatched
