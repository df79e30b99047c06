"""What an approval that ended without a send shows, and what a first caller's hang-up does,
through a real daemon (audit50d #3, #4).

* An approval nobody decided within its window is recorded APPROVAL_EXPIRED by the daemon's
  dispatcher; ``approvals show`` (the API and the command line) says so from the record:
  ``"approval": "expired"``, ``"expired": true`` -- not ``pending`` and unexpired, which it
  said once the approval was no longer live.
* docs/approvals.md, "Who sends an approved request": the first caller killed while it waits
  for the decision withdraws nothing -- the request stays open, and once approved the daemon
  sends it and stores its result.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from affidavit.api.client import Client
from tests.http.hostile import HostileServer, Reply, scripts

from .kit import api_target, cli, running_daemon, start_caller, wait_until

CHARGE = {"target": "api", "method": "POST", "path": "/v1/charges", "body": '{"amount": 5}'}
OK = Reply(200, body=b'{"charged": true}')
SERVICE = {"operator_uids": [os.geteuid()], "allow_self_approval": True}


async def test_an_approval_that_ran_out_undecided_is_shown_expired(
    tmp_path: Path, token: str
) -> None:
    policy = {"methods": ["POST"], "ttl": "2s"}
    async with (
        HostileServer.running(scripts.serve(OK)) as srv,
        running_daemon(
            tmp_path, api_target(srv.url, approval=policy), token=token, service=SERVICE
        ) as daemon,
    ):
        asked = await cli(daemon, "call", "-", stdin=json.dumps(CHARGE).encode())
        iid = asked.json()["invocation_id"]
        async with Client.open(daemon.socket) as c:
            assert (await c.approval(iid))["approval"] == "pending"

            async def closed() -> dict[str, Any] | None:
                record = await c.record(iid)
                return record if record.get("code") == "APPROVAL_EXPIRED" else None

            await wait_until(closed, "the dispatcher records APPROVAL_EXPIRED", 10)
            view = await c.approval(iid)
        shown = await cli(daemon, "approvals", "show", iid)
        assert shown.returncode == 0, shown.stderr
        for answer in (view, shown.json()):
            assert (answer["approval"], answer["expired"]) == ("expired", True), answer
            assert (answer["state"], answer["code"]) == ("validation_failed", "APPROVAL_EXPIRED")
            assert answer["expires_in"] is None
    assert srv.requests == []


async def test_a_first_caller_killed_while_it_waits_for_the_decision_withdraws_nothing(
    tmp_path: Path, token: str
) -> None:
    policy = {"methods": ["POST"], "wait": "30s"}
    async with (
        HostileServer.running(scripts.serve(OK)) as srv,
        running_daemon(
            tmp_path, api_target(srv.url, approval=policy), token=token, service=SERVICE
        ) as daemon,
    ):
        caller = await start_caller(daemon, json.dumps(CHARGE).encode())
        async with Client.open(daemon.socket) as c:

            async def asked() -> list[Any]:
                return list(await c.approvals())

            iid = (await wait_until(asked, "the caller's request waits", 10))[0]["invocation_id"]
            caller.kill()
            await caller.wait()
            await c.approve(iid, note="after its caller was killed")

            async def stored() -> bool:
                return (await c.record(iid))["state"] == "stored_committed"

            await wait_until(stored, "the daemon sends it and stores the result", 10)
            kinds = [e["kind"] for e in await c.events(iid)]
        assert kinds.count("REQUEST_SENT") == 1
        assert "CALLER_CANCELLED" not in json.dumps(await _record(daemon.socket, iid))
    assert len(srv.requests) == 1


async def _record(socket: Path, iid: str) -> dict[str, Any]:
    async with Client.open(socket) as c:
        record: dict[str, Any] = await c.record(iid)
        return record
