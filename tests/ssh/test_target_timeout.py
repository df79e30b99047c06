"""The target's own total timeout ends an SSH attempt through the driver's rule (audit 51a, #4).

The binding gave the driver an exec timeout equal to the target's total, while the engine's
deadline for that total began earlier (before connection setup): the engine's always fell
first.  The driver then fired ``cancelled`` with the fact ``code: CALLER_CANCELLED`` -- a cause
it did not know, and wrong (the engine recorded REMOTE_OUTCOME_UNKNOWN) -- and its own
``timed_out`` rule, which records what was seen (an exit-status with the streams still open:
REMOTE_RESULT_INCOMPLETE), never ran.  The engine now tells the driver where the target's total
ends (``AttemptContext.deadline``) and the driver ends a little before it; a caller's shorter
deadline stays the caller's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from affidavit.adapters.base import SetupError
from affidavit.adapters.ssh import connect, perform, prepare_credential
from affidavit.statemachine import Code, EventKind, Outcome
from tests.broker.helpers import assert_error, open_broker, write_config

from .brokerkit import ssh_target
from .conftest import Recorder, hostile_target
from .hostile import HostileServer
from .sshd import SshKeys

pytestmark = pytest.mark.usefixtures("key_env")


def _observed(events: list) -> dict:  # type: ignore[type-arg]
    [observed] = [e for e in events if e.kind is EventKind.PROTOCOL_OBSERVED]
    return dict(observed.attrs["facts"])


async def test_the_target_s_total_timeout_is_the_driver_s_timed_out_with_what_it_saw(
    tmp_path: Path, hostile: HostileServer
) -> None:
    # "out", exit-status 0 and EOF, the CHANNEL_CLOSE 100 s later: the target's total (2 s)
    # ends it.  An exit-status without the close is an incomplete result, not "nothing known".
    target = ssh_target(hostile.port, "bob", hostile.pin, timeout={"connect": 2, "total": 2})
    cfg = write_config(tmp_path, {"evil": target})
    with trio.fail_after(20):
        async with open_broker(cfg) as b:
            env = await b.call({"target": "evil", "command": "slowclose 100"})
            assert_error(b, env, phase="remote_execution", outcome="unknown",
                         retry="reconcile", code="REMOTE_RESULT_INCOMPLETE")  # fmt: skip
            facts = _observed(b.events(env["invocation_id"]))
    # The driver's closing step's code: its own rule ran (the engine's ending would be
    # REMOTE_OUTCOME_UNKNOWN, and the driver's cancelled step said CALLER_CANCELLED).
    assert facts["path"][-1] == "interrupted" and "exit_status_seen" in facts["path"]
    assert facts["exit_status"] == 0 and facts["code"] == "REMOTE_RESULT_INCOMPLETE"


async def test_a_caller_s_shorter_deadline_is_the_caller_s_and_the_driver_claims_no_cause(
    tmp_path: Path, hostile: HostileServer
) -> None:
    target = ssh_target(hostile.port, "bob", hostile.pin, timeout={"connect": 5, "total": 10})
    cfg = write_config(tmp_path, {"evil": target})
    with trio.fail_after(20):
        async with open_broker(cfg) as b:
            env = await b.call({"target": "evil", "command": "slowclose 100"}, timeout=1.5)
            assert_error(b, env, phase="remote_execution", outcome="unknown",
                         retry="reconcile", code="CALLER_CANCELLED")  # fmt: skip
            facts = _observed(b.events(env["invocation_id"]))
    # The engine records the cause; the driver's step says only that it was cancelled.
    assert facts["path"][-1] == "interrupted" and "code" not in facts, facts


@pytest.mark.parametrize(("left", "sent"), [(0.45, False), (5.0, True)], ids=["short", "long"])
async def test_a_deadline_within_the_margin_at_the_gate_ends_before_it_nothing_sent(
    hostile: HostileServer,
    ssh_keys: SshKeys,
    monkeypatch: pytest.MonkeyPatch,
    left: float,
    sent: bool,
) -> None:
    # Review of round 1: the margin was applied after the gate, so 0.45 s left at the gate
    # put the exec timeout in the past -- timed_out before the request was written, recorded
    # as dispatched, REMOTE_OUTCOME_UNKNOWN, with ``exec_requests == []``.
    setup = connect.Connection.setup

    async def set_up_then_deadline(conn: connect.Connection) -> None:
        await setup(conn)
        conn.ctx.deadline = trio.current_time() + left  # what remains at the gate

    monkeypatch.setattr(connect.Connection, "setup", set_up_then_deadline)
    rec = Recorder()
    target = hostile_target(hostile, "bob")
    before = list(hostile.exec_requests)  # the server is shared by the module's tests
    with trio.fail_after(10):
        if sent:
            result = await perform(target, prepare_credential(ssh_keys.client_key), "exit 0",
                                   None, rec.ctx)  # fmt: skip
            assert result.outcome is Outcome.COMMITTED and hostile.exec_requests == [
                *before,
                "exit 0",
            ]
            return
        with pytest.raises(SetupError) as ei:
            await perform(target, prepare_credential(ssh_keys.client_key), "exit 0", None,
                          rec.ctx)  # fmt: skip
    assert ei.value.code is Code.CONNECT_TIMEOUT and ei.value.stage == "session_open"
    assert rec.gate_calls == [] and not rec.ctx.machine.dispatched
    assert rec.events[-1] == "setup_failed" and hostile.exec_requests == before


async def test_a_target_total_too_short_for_the_command_sends_nothing_and_is_not_attempted(
    tmp_path: Path, hostile: HostileServer
) -> None:
    # Through the engine: less than the margin is left at the gate (or the total ends during
    # setup, on a loaded machine) -- either way nothing is requested and the answer is the
    # engine's for a total spent before dispatch, never a dispatch recorded for nothing sent.
    target = ssh_target(hostile.port, "bob", hostile.pin, timeout={"connect": 0.5, "total": 0.5})
    cfg = write_config(tmp_path, {"evil": target})
    before = list(hostile.exec_requests)
    with trio.fail_after(20):
        async with open_broker(cfg) as b:
            env = await b.call({"target": "evil", "command": "exit 0"})
            assert_error(b, env, phase="connection_setup", outcome="not_attempted",
                         retry="backoff", code="CONNECT_TIMEOUT")  # fmt: skip
            assert EventKind.DISPATCH_STARTED not in {
                e.kind for e in b.events(env["invocation_id"])
            }
    assert hostile.exec_requests == before
