"""A key re-exchange signed with another host key than the verified one, from the scripted server.

libssh 0.11 checks a re-exchange's signature against whatever key the server presents in it and
never compares that key with the one the session started with (``ssh_packet_newkeys``,
``src/packet_cb.c``): a server switching to a key no pin names mid-session was a complete
result, its ``host_key`` fact naming the pinned key.  The driver now compares the current key
(``ssh_get_server_publickey``) with the verified one: before dispatch (HOST_KEY_MISMATCH, the
command never requested), before an exec reply counts, before output reaches the sink and
before the close is judged (``host_key_changed`` -> ``interrupted``, unknown).  A re-exchange
with the same key changes nothing.
"""

from __future__ import annotations

import pytest
import trio

from affidavit.adapters.base import AttemptInterrupted, RemoteResult, SetupError
from affidavit.adapters.ssh import perform, prepare_credential
from affidavit.statemachine import Code, Outcome

from .conftest import Recorder, SshKeys, hostile_target
from .hostile import HostileServer


async def _run(
    srv: HostileServer, keys: SshKeys, command: str, rec: Recorder, user: str = "bob"
) -> RemoteResult:
    with trio.fail_after(10):
        target = hostile_target(srv, user)
        return await perform(target, prepare_credential(keys.client_key), command, None, rec.ctx)


@pytest.mark.parametrize("when", ["first", "last"])
async def test_a_rekey_with_the_same_key_keeps_the_result(
    hostile: HostileServer, ssh_keys: SshKeys, when: str
) -> None:
    rec = Recorder()
    res = await _run(hostile, ssh_keys, f"rekey same {when}", rec)
    assert isinstance(res, RemoteResult)
    assert (res.outcome, res.code, res.summary["exit_status"]) == (Outcome.COMMITTED, None, 0)
    assert rec.stream("stdout") == b"out\n"


@pytest.mark.parametrize(
    ("when", "last_before"),
    [("first", "exec_accepted"), ("last", "eof")],
    ids=["before-any-output", "after-exit-and-eof"],
)
async def test_a_rekey_with_another_host_key_is_no_result(
    hostile: HostileServer, ssh_keys: SshKeys, when: str, last_before: str
) -> None:
    rec = Recorder()
    with pytest.raises(AttemptInterrupted) as ei:
        await _run(hostile, ssh_keys, f"rekey other {when}", rec)
    assert ei.value.code == Code.REMOTE_OUTCOME_UNKNOWN
    assert "re-keyed with another host key" in ei.value.detail
    assert rec.events[-2:] == [last_before, "host_key_changed"]
    assert rec.ctx.machine.state == "interrupted"
    if when == "first":  # the output came after the switch: none of it reached the sink
        assert rec.stream("stdout") == b""
    # The facts keep the key that was verified; the detail names the one presented after it.
    assert ei.value.facts["host_key"] in ei.value.detail.split("verified ")[1]


async def test_a_rekey_with_another_host_key_before_dispatch_requests_nothing(
    hostile: HostileServer, ssh_keys: SshKeys
) -> None:
    rec = Recorder()
    before = len(hostile.exec_requests)
    with pytest.raises(SetupError) as ei:
        await _run(hostile, ssh_keys, "exit 0", rec, user="rekeyer")
    assert (ei.value.code, ei.value.stage) == (Code.HOST_KEY_MISMATCH, "host_key")
    assert "before the command was requested" in ei.value.detail
    assert rec.ctx.machine.state == "setup_failed" and not rec.ctx.machine.dispatched
    assert rec.gate_calls == [] and hostile.exec_requests[before:] == []
