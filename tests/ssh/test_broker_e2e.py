"""SSH end to end through ``Broker.call``: envelope phase/outcome/retry/code agree with the
durable record, and the private key never reaches the journal file."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.broker.helpers import assert_error, assert_ok, open_broker, write_config

from .hostile import HostileServer
from .sshd import Sshd

KEY_ENV = "AFFIDAVIT_TEST_SSH_KEY"
LIMIT = 20


@pytest.fixture
def key_env(sshd: Sshd) -> Iterator[None]:
    os.environ[KEY_ENV] = sshd.client_key.decode()
    try:
        yield
    finally:
        del os.environ[KEY_ENV]


def _target(port: int, user: str, pin: str, **kw: Any) -> dict[str, Any]:
    t: dict[str, Any] = {
        "kind": "ssh",
        "host": "127.0.0.1",
        "port": port,
        "user": user,
        "host_key": pin,
        "credential": f"env:{KEY_ENV}",
        "timeout": {"connect": 5, "total": 10},
    }
    t.update(kw)
    return t


def _cfg(tmp_path: Path, sshd: Sshd, hostile: HostileServer) -> Path:
    return write_config(
        tmp_path,
        {
            "box": _target(sshd.port, sshd.user, sshd.host_pin),
            "wrongkey": _target(sshd.port, sshd.user, hostile.pin),
            "evil": _target(hostile.port, "bob", hostile.pin),
        },
    )


@pytest.mark.usefixtures("key_env")
async def test_every_row_through_broker_call(
    tmp_path: Path, sshd: Sshd, hostile: HostileServer
) -> None:
    cfg = _cfg(tmp_path, sshd, hostile)
    with trio.fail_after(LIMIT):
        async with open_broker(cfg) as b:
            env = await b.call({"target": "box", "command": "echo hi"})
            assert_ok(b, env)
            env = await b.call({"target": "box", "command": "exit 23"})
            assert_error(b, env, phase="remote_execution", outcome="committed", retry="never",
                         code="REMOTE_COMMAND_FAILED")  # fmt: skip
            env = await b.call({"target": "wrongkey", "command": "true"})
            assert_error(b, env, phase="connection_setup", outcome="not_attempted",
                         retry="after_correction", code="HOST_KEY_MISMATCH")  # fmt: skip
            env = await b.call({"target": "evil", "command": "refuse"})
            assert_error(b, env, phase="remote_execution", outcome="rejected",
                         retry="after_correction", code="EXEC_REJECTED")  # fmt: skip
            env = await b.call({"target": "evil", "command": "noexit"})
            assert_error(b, env, phase="remote_execution", outcome="unknown",
                         retry="reconcile", code="REMOTE_RESULT_INCOMPLETE")  # fmt: skip
            env = await b.call({"target": "evil", "command": "drop"})
            assert_error(b, env, phase="remote_execution", outcome="unknown",
                         retry="reconcile", code="REMOTE_OUTCOME_UNKNOWN")  # fmt: skip
            env = await b.call({"target": "evil", "command": "status_then_break"})
            assert_error(b, env, phase="remote_execution", outcome="unknown",
                         retry="reconcile", code="REMOTE_RESULT_INCOMPLETE")  # fmt: skip
    # Canary over the journal file bytes: neither the key text nor any base64 line of it.
    data = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("journal"))
    body_lines = [ln for ln in sshd.client_key.splitlines()[1:-1] if len(ln) >= 24]
    assert body_lines and all(ln not in data for ln in body_lines)
