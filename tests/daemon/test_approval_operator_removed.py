"""A grant does not outlive its operator (audit50d #2): the dispatch gate re-checks the uid
APPROVAL_GRANTED names against ``[service] operator_uids`` / ``operator_gids`` as they are
when it would send -- for the daemon's dispatcher (``dispatch_approved``) and for a same-key
call resuming the approved invocation alike.  The operator removed since, nothing is sent:
APPROVAL_STALE (validation, not_attempted) at field ``approval.operator``.

The request is made through a daemon that then stops, approved embedded by this test's user
(an operator), and the configuration edited to name another uid before anything sends it.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from affidavit.api.client import Client
from tests.http.hostile import HostileServer, Reply, scripts

from .kit import (
    DaemonProc,
    api_target,
    cli,
    embedded,
    running_daemon,
    start_daemon,
    stop,
    wait_until,
)

IDEM = {"header": "Idempotency-Key", "scope": "p", "retention": "1h"}
CHARGE = {
    "target": "api",
    "method": "POST",
    "path": "/v1/charges",
    "body": '{"amount": 5}',
    "idempotency_key": "k9",
}
OK = Reply(200, body=b'{"charged": true}')
OTHER = 4242
"""The operator the edited configuration names instead."""


@asynccontextmanager
async def _granted_then_operator_removed(
    tmp_path: Path, token: str, srv: HostileServer
) -> AsyncIterator[tuple[DaemonProc, str]]:
    me = os.geteuid()
    service = {"operator_uids": [me], "allow_self_approval": True}
    targets = api_target(srv.url, approval={"methods": ["POST"]}, idempotency=IDEM)
    async with running_daemon(tmp_path, targets, token=token, service=service) as daemon:
        asked = await cli(daemon, "call", "-", stdin=json.dumps(CHARGE).encode())
        assert asked.json()["error"]["code"] == "APPROVAL_PENDING", asked.stdout
        stop(daemon)
    iid = asked.json()["invocation_id"]
    config = daemon.config
    approved = await embedded("approvals", "approve", iid, "--note", "ok", "--config", str(config))
    assert approved.returncode == 0, approved.stderr
    assert approved.json()["operator"]["uid"] == me
    text = config.read_text()
    assert text.count(f"operator_uids = [{me}]") == 1
    config.write_text(text.replace(f"operator_uids = [{me}]", f"operator_uids = [{OTHER}]"))
    yield daemon, iid


def _refused(answer: dict[str, Any]) -> None:
    assert answer["state"] == "validation_failed", answer
    assert (answer["code"], answer["field"]) == ("APPROVAL_STALE", "approval.operator"), answer


async def test_the_daemon_does_not_send_a_grant_whose_operator_was_removed(
    tmp_path: Path, token: str
) -> None:
    async with (
        HostileServer.running(scripts.serve(OK)) as srv,
        _granted_then_operator_removed(tmp_path, token, srv) as (down, iid),
    ):
        daemon = await start_daemon(down.config, down.socket, down.log, token)
        try:
            async with Client.open(daemon.socket) as c:

                async def closed() -> dict[str, Any] | None:
                    record = await c.record(iid)
                    return record if record["state"] == "validation_failed" else None

                _refused(await wait_until(closed, "the dispatcher closes it", 10))
        finally:
            stop(daemon)
    assert srv.requests == []


async def test_a_same_key_call_does_not_send_a_grant_whose_operator_was_removed(
    tmp_path: Path, token: str
) -> None:
    async with (
        HostileServer.running(scripts.serve(OK)) as srv,
        _granted_then_operator_removed(tmp_path, token, srv) as (down, iid),
    ):
        again = await embedded(
            "call",
            "-",
            "--config",
            str(down.config),
            stdin=json.dumps(CHARGE).encode(),
            token=token,
        )
        envelope = again.json()
        assert envelope["invocation_id"] == iid
        error = envelope["error"]
        assert (error["code"], error["phase"], error["outcome"]) == (
            "APPROVAL_STALE",
            "validation",
            "not_attempted",
        ), envelope
        shown = await embedded("record", iid, "--json", "--config", str(down.config))
        _refused(shown.json()["record"])
    assert srv.requests == []
