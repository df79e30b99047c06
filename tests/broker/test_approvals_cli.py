"""``affidavit approvals`` and ``affidavit reconcile`` run embedded: the operator is this
process's user and the journal is written here (issue 12).  The caller is another process that
waits for the decision; the scripted server's log says what was sent."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import trio

from tests.http.hostile import HostileServer, Reply, scripts

from .approvalkit import PaymentsApi, approval_config, reconcile_target
from .helpers import affidavit_cli, write_config

CHARGE = {"target": "api", "method": "POST", "path": "/v1/charges", "body": '{"amount": 5}'}
SELF = {"operator_gids": [os.getgid()], "allow_self_approval": True}
"""This process's user decides on its own requests here (the daemon tests keep them apart)."""


async def test_an_embedded_caller_waits_and_an_operator_approves_from_another_process(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(201, body=b"{}"))) as srv:
        cfg = str(approval_config(tmp_path, srv.url, approval={"wait": "30s"}, service=SELF))
        got: dict[str, Any] = {}

        async def caller() -> None:
            got["run"] = await _call(cfg, CHARGE)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(caller)
            with trio.fail_after(30):
                while True:
                    listed = await affidavit_cli("approvals", "--json", "--config", cfg)
                    if listed.returncode == 0 and json.loads(listed.stdout):
                        break  # (exit 2 until the caller has created the journal)
                    await trio.sleep(0.1)
            table = await affidavit_cli("approvals", "--config", cfg)
            assert b"env:AFFIDAVIT_TEST_TOKEN" in table.stdout and b"POST http" in table.stdout
            _lined_up(table.stdout, "TARGET", " api ")
            assert token.encode() not in table.stdout + listed.stdout
            iid = json.loads(listed.stdout)[0]["invocation_id"]
            approved = await affidavit_cli("approvals", "approve", iid, "--config", cfg)
            assert approved.returncode == 0, approved.stderr
        done = got["run"]
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["result"]["status"] == 201
        shown = await affidavit_cli("approvals", "show", iid, "--config", cfg)
        assert json.loads(shown.stdout)["approval"] == "granted"
        again = await affidavit_cli("approvals", "deny", iid, "--config", cfg)
        assert again.returncode == 2 and b"NOT_PENDING" in again.stderr
        _lined_up((await affidavit_cli("actions", "--config", cfg)).stdout, "SESSION", " - ")
    assert len(srv.requests) == 1


async def test_embedded_reconcile_exit_statuses(tmp_path: Path, token: str) -> None:
    api = PaymentsApi()
    async with HostileServer.running(api.script) as srv:
        cfg_path = write_config(tmp_path, reconcile_target(srv.url))
        with cfg_path.open("a") as f:
            f.write(f"[service]\noperator_gids = [{os.getgid()}]\n")
        cfg = str(cfg_path)
        ids = []
        for key in ("applied", "boom", "manual"):
            action = {**CHARGE, "body": '{"drop": true}', "idempotency_key": key}
            asked = await _call(cfg, action)
            ids.append(json.loads(asked.stdout)["invocation_id"])
        settled = await affidavit_cli("reconcile", ids[0], "--query", "--config", cfg)
        assert settled.returncode == 0, settled.stderr
        assert json.loads(settled.stdout)["envelope"]["evidence"]["outcome"] == "committed"
        nothing = await affidavit_cli("reconcile", ids[1], "--query", "--config", cfg)
        assert nothing.returncode == 1
        assert json.loads(nothing.stdout)["envelope"]["error"]["outcome"] == "unknown"
        no_note = await affidavit_cli("reconcile", ids[2], "--attest", "committed", "--config", cfg)
        assert no_note.returncode == 2 and b"--note" in no_note.stderr
        attested = await affidavit_cli(
            "reconcile", ids[2], "--attest", "committed", "--note", "seen", "--config", cfg
        )
        assert attested.returncode == 0, attested.stderr
        verified = await affidavit_cli("journal", "verify", "--config", cfg)
        assert verified.returncode == 0, verified.stdout
        twice = await affidavit_cli("reconcile", ids[0], "--query", "--config", cfg)
        assert twice.returncode == 2 and b"NOT_UNKNOWN" in twice.stderr


def _python() -> list[str]:
    return [sys.executable, "-m", "affidavit"]


async def _call(cfg: str, action: dict[str, Any], **kw: Any) -> Any:
    """``affidavit call -`` with ``action`` on stdin, embedded."""
    return await trio.run_process(
        [*_python(), "call", "-", "--config", cfg],
        stdin=json.dumps(action).encode(),
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        **kw,
    )


def _lined_up(table: bytes, column: str, value: str) -> None:
    """The table's second column starts under its heading: an invocation id is 30 characters
    (``act_`` and a 26-character ULID), and a 28-wide first column pushed every row two right."""
    header, row = table.decode().splitlines()[:2]
    assert row.startswith("act_") and row.index(value) + 1 == header.index(column), table
