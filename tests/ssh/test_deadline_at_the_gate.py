"""A deadline that strikes while the dispatch gate's barrier commits sends no exec request.

The gate's DISPATCH_STARTED is written shielded (a caller's cancellation must not leave it
unclear whether it landed), so a deadline that passes meanwhile is delivered at the next
checkpoint.  HTTP's ``send_all`` is one, before its first byte; the SSH driver handed the exec
request to libssh synchronously right after the gate, with no checkpoint: the command ran after
the attempt's deadline -- its lease's end less ``lease_margin``, when another worker may already
take the holder for gone.  The record says what the journal proves either way: dispatched,
outcome unknown (the barrier is durable; whether bytes left is not recorded).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.statemachine import EventKind
from tests.broker.helpers import open_broker, write_config

from .brokerkit import ssh_target
from .sshd import Sshd

E = EventKind
TIMEOUT = 2.0  # the call's deadline
COMMIT = 3.0  # how long the gate's barrier takes to commit: past the deadline


pytestmark = pytest.mark.usefixtures("key_env")


async def test_a_deadline_struck_during_the_gate_sends_no_exec(
    tmp_path: Path, sshd: Sshd, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "ran"
    cfg = write_config(tmp_path, {"box": ssh_target(sshd.port, sshd.user, sshd.host_pin)})
    async with open_broker(cfg) as broker:
        real = broker.journal.append

        async def slow(event: Any, *args: Any, **kw: Any) -> Any:
            if event.kind is E.DISPATCH_STARTED:
                with trio.CancelScope(shield=True):  # a slow commit, shielded as the gate's
                    await trio.sleep(COMMIT)
            return await real(event, *args, **kw)

        monkeypatch.setattr(broker.journal, "append", slow)
        action = {"target": "box", "command": f"touch {shlex.quote(str(marker))}"}
        with trio.fail_after(30):
            env = await broker.call(action, timeout=TIMEOUT)
            await trio.sleep(1.0)  # a command sent would have run by now (loopback)
        assert not marker.exists()
        err = env["error"]
        assert (err["phase"], err["outcome"]) == ("remote_execution", "unknown"), env
        assert env["evidence"]["dispatch_started"] is True
