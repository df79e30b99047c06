"""``affidavit call`` / ``affidavit result`` for an SSH target, as a caller sees them: real
subprocesses against the real sshd.  Exit 0 for exit-status 0, exit 1 with the committed
REMOTE_COMMAND_FAILED envelope for exit-status 23, and ``result`` is a read of the stored
envelope — the remote command runs once however often it is fetched.  Across success and
failure calls the private key appears in no CLI output and no journal file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import trio

from tests.broker.helpers import write_config
from tests.daemon.kit import AT_ONCE

from .brokerkit import KEY_ENV, OTHER_KEY_ENV, leaked, ssh_target
from .hostile import HostileServer
from .sshd import Sshd

LIMIT = 30


class _Cli:
    def __init__(self, tmp_path: Path, sshd: Sshd, hostile: HostileServer) -> None:
        self.tmp = tmp_path
        self.env = {
            **os.environ,
            KEY_ENV: sshd.client_key.decode(),
            OTHER_KEY_ENV: sshd.other_key.decode(),
        }
        self.cfg = write_config(
            tmp_path,
            {
                "box": ssh_target(sshd.port, sshd.user, sshd.host_pin),
                "badkey": ssh_target(sshd.port, sshd.user, sshd.host_pin, key_env=OTHER_KEY_ENV),
                "wrongpin": ssh_target(sshd.port, sshd.user, hostile.pin),
            },
        )
        self.outputs: list[bytes] = []

    async def run(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        with trio.fail_after(LIMIT):
            p = await trio.run_process(
                [sys.executable, "-m", "affidavit", *args, "--config", str(self.cfg)],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                env=self.env,
            )
        self.outputs += [p.stdout, p.stderr]
        assert b"Traceback" not in p.stderr, p.stderr
        return p

    async def call(self, target: str, command: str) -> tuple[int, dict[str, Any]]:
        action = self.tmp / "action.json"
        action.write_text(json.dumps({"target": target, "command": command}))
        p = await self.run("call", str(action))
        return p.returncode, _one_envelope(p.stdout)


def _one_envelope(out: bytes) -> dict[str, Any]:
    text = out.decode().strip()
    doc, end = json.JSONDecoder().raw_decode(text)
    assert text[end:].strip() == "", "more than one document on stdout"
    assert isinstance(doc, dict)
    return doc


async def test_call_exit_status_0_exits_0_and_result_reads_without_rerunning(
    tmp_path: Path, sshd: Sshd, hostile: HostileServer
) -> None:
    cli = _Cli(tmp_path, sshd, hostile)
    runs = tmp_path / "runs"
    rc, env = await cli.call("box", f"echo ran >> {runs}; echo hi")
    assert rc == 0
    assert "error" not in env
    assert env["result"]["stdout"] == "hi\n" and env["result"]["exit_status"] == 0
    assert env["evidence"]["outcome"] == "committed" and env["evidence"]["dispatch_started"]
    iid = env["invocation_id"]

    for _ in range(2):
        p = await cli.run("result", iid)
        assert p.returncode == 0, p.stderr
        fetched = _one_envelope(p.stdout)
        assert fetched["invocation_id"] == iid
        assert fetched["result"] == env["result"]
    assert runs.read_text() == "ran\n"  # one execution, two reads

    p = await cli.run("record", iid, "--json")
    assert p.returncode == 0, p.stderr
    rec = json.loads(p.stdout)["record"]
    assert (rec["outcome"], rec["code"], rec["protocol"]) == ("committed", None, "ssh")


async def test_call_exit_status_23_exits_1_with_committed_command_failed(
    tmp_path: Path, sshd: Sshd, hostile: HostileServer
) -> None:
    cli = _Cli(tmp_path, sshd, hostile)
    rc, env = await cli.call("box", "echo partial-work; exit 23")
    assert rc == 1
    err = env["error"]
    assert (err["code"], err["phase"], err["outcome"], err["retry"]) == (
        "REMOTE_COMMAND_FAILED",
        "remote_execution",
        "committed",
        "never",
    )
    assert env["result"]["exit_status"] == 23 and env["result"]["stdout"] == "partial-work\n"
    p = await cli.run("result", env["invocation_id"])
    assert p.returncode == 1
    fetched = _one_envelope(p.stdout)
    assert fetched["error"]["code"] == "REMOTE_COMMAND_FAILED"
    assert fetched["result"] == env["result"]


async def test_unknown_invocation_id_is_a_usage_error(
    tmp_path: Path, sshd: Sshd, hostile: HostileServer
) -> None:
    cli = _Cli(tmp_path, sshd, hostile)
    await cli.call("box", "true")  # creates the journal
    p = await cli.run("result", "act_00000000000000000000000000")
    assert p.returncode == 2 and p.stdout == b""
    assert b"no invocation act_00000000000000000000000000" in p.stderr


async def test_private_key_never_in_cli_output_or_journal_files(
    tmp_path: Path, sshd: Sshd, hostile: HostileServer
) -> None:
    cli = _Cli(tmp_path, sshd, hostile)
    # The remote prints the very key file the broker authenticates with: the broker must
    # redact it from the stored and returned stdout (whole value and each base64 line).
    rc, env = await cli.call("box", f"cat {sshd.client_key_path}; cat {sshd.client_key_path}")
    assert rc == 0
    assert "[REDACTED]" in env["result"]["stdout"]
    iids = [env["invocation_id"]]
    for target, command, code in [
        ("box", "echo fine", None),
        ("box", "exit 23", "REMOTE_COMMAND_FAILED"),
        ("badkey", "true", "REMOTE_AUTH_FAILED"),
        ("wrongpin", "true", "HOST_KEY_MISMATCH"),
    ]:
        rc, env = await cli.call(target, command)
        assert env.get("error", {}).get("code") == code
        iids.append(env["invocation_id"])
    # The reads are independent (every record is closed): a few at once, their start-ups overlap.
    limiter = trio.CapacityLimiter(AT_ONCE)

    async def read(*args: str) -> None:
        async with limiter:
            await cli.run(*args)

    async with trio.open_nursery() as nursery:
        for iid in iids:
            nursery.start_soon(read, "result", iid)
            nursery.start_soon(read, "record", iid, "--json")
    p = await cli.run("actions", "--json")
    assert len(json.loads(p.stdout)) == len(iids)

    journal = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("journal"))
    assert journal
    for pem in (sshd.client_key, sshd.other_key):
        for out in cli.outputs:
            assert leaked(out, pem) == []
        assert leaked(journal, pem) == []
