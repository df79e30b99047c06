"""``affidavit approvals revoke ID --note`` and ``POST /v1/approvals/{id}/revoke`` (the
daemon's route, ``Client.revoke``): a grant taken back before anything sent it is never sent --
not by the daemon's dispatcher when it starts -- and the route refuses, with its stable code,
what it cannot revoke.  Real daemon, real loopback server."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio

from affidavit.api.client import Client
from affidavit.api.wire import ApiError
from tests.http.hostile import HostileServer, Reply, scripts

from .kit import api_target, cli, embedded, running_daemon, start_daemon, stop

CHARGE = {"target": "api", "method": "POST", "path": "/v1/charges", "body": '{"amount": 5}'}
OK = Reply(200, body=b'{"charged": true}')
SERVICE = {"operator_uids": [os.geteuid()], "allow_self_approval": True}
SWEEPS = 2.5
"""Seconds the restarted daemon is given: its start and two dispatcher sweeps."""


async def test_a_grant_revoked_while_the_daemon_was_down_is_not_sent_when_it_starts(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(OK)) as srv:
        targets = api_target(srv.url, approval="always")
        async with running_daemon(tmp_path, targets, token=token, service=SERVICE) as daemon:
            asked = await cli(daemon, "call", "-", stdin=json.dumps(CHARGE).encode())
            iid = asked.json()["invocation_id"]
            # The route refuses what it cannot revoke: one still waiting for a decision.
            async with Client.open(daemon.socket) as c:
                with pytest.raises(ApiError) as refused:
                    await c.revoke(iid, note="not yet decided")
            assert refused.value.code == "NOT_APPROVED", refused.value
            stop(daemon)
        config = str(daemon.config)
        approved = await embedded("approvals", "approve", iid, "--note", "ok", "--config", config)
        assert approved.returncode == 0, approved.stderr
        revoked = await embedded(
            "approvals", "revoke", iid, "--note", "wrong amount", "--config", config
        )
        assert revoked.returncode == 0, revoked.stderr
        assert (revoked.json()["approval"], revoked.json()["note"]) == ("revoked", "wrong amount")
        again = await start_daemon(daemon.config, daemon.socket, daemon.log, token)
        try:
            # Two sweeps of its dispatcher, which sends at start every approved request it finds.
            await trio.sleep(SWEEPS)
            async with Client.open(again.socket) as c:
                record = await c.record(iid)
                assert (record["state"], record["code"]) == ("approval_denied", "APPROVAL_DENIED")
        finally:
            stop(again)
    assert srv.requests == []
