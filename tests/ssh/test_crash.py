"""Crash test (seed, "Dispatch shifts the burden of proof"): a real ``affidavit call`` process is
SIGKILLed after its SSH ``exec`` request reached the server — proven by the server itself (the
real sshd's command wrote a marker; the scripted server recorded the request).  Read back by
other processes, the journal must say ``unknown`` with ``dispatch_started`` — never
``not_attempted`` — and nothing may claim a result.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from tests.broker.helpers import raw_kinds, write_config

from .brokerkit import KEY_ENV, leaked, ssh_target
from .hostile import HostileServer
from .sshd import Sshd, SshKeys

LIMIT = 30


async def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(LIMIT):
        p = await trio.run_process(
            [sys.executable, "-m", "affidavit", *args],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=env,
        )
    assert b"Traceback" not in p.stderr, p.stderr
    return p


async def _wait_for(cond: Callable[[], bool]) -> None:
    while not cond():
        await trio.sleep(0.02)


async def test_sigkill_after_exec_arrived_leaves_unknown_never_not_attempted(
    tmp_path: Path, ssh_keys: SshKeys, either_server: Sshd | HostileServer
) -> None:
    env = {**os.environ, KEY_ENV: ssh_keys.client_key.decode()}
    pidfile = tmp_path / "remote.pid"
    if isinstance(either_server, Sshd):
        sshd = either_server
        target = ssh_target(sshd.port, sshd.user, sshd.host_pin)
        # Written atomically by the remote shell, which then becomes `sleep 30`.
        command = f"echo $$ > {pidfile}.tmp && mv {pidfile}.tmp {pidfile}; exec sleep 30"

        def arrived() -> bool:
            return pidfile.exists()
    else:
        hostile = either_server
        target = ssh_target(hostile.port, "bob", hostile.pin)
        command = f"hang {uuid.uuid4().hex}"  # accepted, then never answered

        def arrived() -> bool:
            return command in hostile.exec_requests

    cfg = write_config(tmp_path, {"t": {**target, "timeout": {"connect": 5, "total": 60}}})
    action = tmp_path / "action.json"
    action.write_text(json.dumps({"target": "t", "command": command}))
    out, err = tmp_path / "cli.out", tmp_path / "cli.err"
    try:
        with out.open("wb") as fo, err.open("wb") as fe:
            proc = await trio.lowlevel.open_process(
                [sys.executable, "-m", "affidavit", "call", str(action), "--config", str(cfg)],
                env=env,
                stdout=fo,
                stderr=fe,
            )
        try:
            with trio.fail_after(LIMIT):
                await _wait_for(arrived)
                proc.send_signal(signal.SIGKILL)
                await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert proc.returncode == -signal.SIGKILL
        assert out.read_bytes() == b""  # killed before any envelope

        # What the disk says right after the crash (a separate read-only connection).
        on_disk = raw_kinds(tmp_path / "journal.db")
        assert "DISPATCH_STARTED" in on_disk
        assert "RESULT_COMMITTED" not in on_disk and "SETUP_FAILED" not in on_disk

        listed = await _cli("actions", "--json", "--config", str(cfg), env=env)
        assert listed.returncode == 0, listed.stderr
        (row,) = json.loads(listed.stdout)
        assert row["outcome"] == "unknown"
        iid = row["invocation_id"]

        shown = await _cli("record", iid, "--json", "--config", str(cfg), env=env)
        assert shown.returncode == 0, shown.stderr
        rec: dict[str, Any] = json.loads(shown.stdout)["record"]
        assert rec["outcome"] == "unknown"
        assert rec["phase"] == "remote_execution"
        assert rec["evidence"]["dispatch_started"] is True
        assert rec["protocol"] == "ssh"
        text = await _cli("record", iid, "--config", str(cfg), env=env)
        assert b"outcome unknown" in text.stdout
        assert b"not_attempted" not in text.stdout

        fetched = await _cli("result", iid, "--config", str(cfg), env=env)
        envelope = json.loads(fetched.stdout)
        assert envelope["evidence"]["outcome"] == "unknown"
        assert envelope["evidence"]["dispatch_started"] is True
        assert envelope.get("result") is None  # nothing is presented as a result

        journal = b"".join(p.read_bytes() for p in tmp_path.iterdir() if "journal" in p.name)
        for blob in (journal, err.read_bytes(), listed.stdout, shown.stdout, fetched.stdout):
            assert leaked(blob, ssh_keys.client_key) == []
    finally:
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
