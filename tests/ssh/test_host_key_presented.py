"""A refused host key's fingerprint is on record (audit 51a, #5).

The setup failure journaled only the stage and the code: the fingerprint of the key the server
presented -- what an operator compares with the pin -- was in the exception's detail alone.  It
is public (any client of the server is shown it) and now among the ``setup_failed`` facts: in
the journal's PROTOCOL_OBSERVED and the envelope's ``evidence.ssh``.
"""

from __future__ import annotations

import base64
from pathlib import Path

import asyncssh
import pytest
import trio

from affidavit.adapters.ssh.keys import fingerprint
from affidavit.statemachine import EventKind
from tests.broker.helpers import assert_error, open_broker, write_config

from .brokerkit import ssh_target
from .hostile import HostileServer

pytestmark = pytest.mark.usefixtures("key_env")


def _fingerprint(pin: str) -> str:
    return fingerprint(base64.b64decode(pin.split()[1]))


async def test_a_refused_host_key_s_fingerprint_reaches_the_journal_and_the_evidence(
    tmp_path: Path, hostile: HostileServer
) -> None:
    other = asyncssh.generate_private_key("ssh-ed25519")
    pin = " ".join(other.export_public_key("openssh").decode().split()[:2])
    cfg = write_config(tmp_path, {"evil": ssh_target(hostile.port, "bob", pin)})
    with trio.fail_after(20):
        async with open_broker(cfg) as b:
            env = await b.call({"target": "evil", "command": "exit 0"})
            assert_error(b, env, phase="connection_setup", outcome="not_attempted",
                         retry="after_correction", code="HOST_KEY_MISMATCH")  # fmt: skip
            events = b.events(env["invocation_id"])
    presented = _fingerprint(hostile.pin)
    assert presented != _fingerprint(pin) and "SHA256:" in presented
    [observed] = [e for e in events if e.kind is EventKind.PROTOCOL_OBSERVED]
    assert observed.attrs["facts"]["presented"] == presented
    assert observed.attrs["state"] == "setup_failed"
    assert env["evidence"]["ssh"]["presented"] == presented
