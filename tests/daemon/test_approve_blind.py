"""Approving a request whose sealed content cannot be read here is approving blind: through the
daemon's socket (the API and ``affidavit approvals approve --socket``) it is refused 409
``REQUEST_UNREADABLE`` naming the field ``blind`` -- nothing granted, nothing sent -- unless the
operator says ``blind``; then the grant records it (``blind``, and the fixed words of why) and
the request, the one ACTION_ACCEPTED sealed and the fingerprint names, is sent once.  A real
SQLite journal, its APPROVAL_REQUESTED row altered in place and re-chained."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import trio

from affidavit.api.wire import blocking_request
from affidavit.approvals.service import ALTERED
from tests.http.hostile import HostileServer, Reply, scripts

from .kit import WAIT, api_target, cli, start_daemon, stop, wait_until, write_daemon_config
from .test_approval_unplaced import CHARGE, _alter_sealed_request


async def _ask(
    socket: Path, method: str, target: str, body: bytes | None = None
) -> tuple[int, Any]:
    answer = await trio.to_thread.run_sync(blocking_request, str(socket), method, target, body)
    return answer.status, json.loads(bytes(answer.body))


async def test_an_unreadable_request_is_approved_only_blind_and_the_grant_says_so(
    tmp_path: Path, token: str
) -> None:
    db, key, signing = tmp_path / "j.db", tmp_path / "broker.key", tmp_path / "signing.key"
    journal = {"path": str(db), "key_file": str(key), "signing_key": str(signing)}
    socket, log = tmp_path / "affidavit.sock", tmp_path / "daemon.log"
    service = {"operator_uids": [os.getuid()], "allow_self_approval": True}
    async with HostileServer.running(scripts.serve(Reply(200, body=b"{}"))) as srv:
        targets = api_target(srv.url, approval="always")
        config = write_daemon_config(
            tmp_path, targets, socket=socket, service=service, journal=journal
        )
        daemon = await start_daemon(config, socket, log, token)
        try:
            with trio.fail_after(WAIT):
                _, env = await _ask(socket, "POST", "/v1/calls", json.dumps(CHARGE).encode())
                assert env["error"]["code"] == "APPROVAL_PENDING", env
                iid = env["invocation_id"]
        finally:
            stop(daemon)
        _alter_sealed_request(db, iid, signing)
        daemon = await start_daemon(config, socket, log, token)
        try:
            with trio.fail_after(WAIT):
                approve = f"/v1/approvals/{iid}/approve"
                status, answer = await _ask(socket, "POST", approve, b"{}")
                error = answer["api_error"]
                assert (status, error["code"], error["field"]) == (
                    409, "REQUEST_UNREADABLE", "blind"
                ), answer  # fmt: skip
                assert ALTERED in error["message"], error
                for bad, verb in (({"blind": "yes"}, "approve"), ({"blind": True}, "deny")):
                    path = f"/v1/approvals/{iid}/{verb}"
                    status, answer = await _ask(socket, "POST", path, json.dumps(bad).encode())
                    assert status == 400 and answer["api_error"]["field"] == "blind", answer
                refused = await cli(daemon, "approvals", "approve", iid)
                assert refused.returncode == 2, refused
                # The daemon's code and field, as embedded prints them (tests/daemon/
                # test_cli_refusals.py): not the message alone -- the field as the command
                # line spells it, where the socket's words name no option of it.
                assert "--blind" not in error["message"], error
                head = b"affidavit: REQUEST_UNREADABLE: --blind: the request of "
                assert refused.stderr.startswith(head), refused
                assert ALTERED.encode() in refused.stderr, refused
                _, view = await _ask(socket, "GET", f"/v1/approvals/{iid}")
                assert view["approval"] == "pending" and "blind" not in view, view
                await trio.sleep(0.3)  # a dispatcher sweep would have sent a grant by now
                assert srv.requests == []

                done = await cli(daemon, "approvals", "approve", iid, "--blind", "--note", "ok")
                assert done.returncode == 0, done.stderr
                granted = done.json()
                assert granted["approval"] == "granted" and granted["blind"] is True, granted
                assert granted["unreadable"] == ALTERED, granted
                assert granted["request"] is None, granted
                await wait_until(lambda: srv.requests, "the blind-approved request is sent")
                _, view = await _ask(socket, "GET", f"/v1/approvals/{iid}")
                assert view["blind"] is True and view["state"] != "approved", view
        finally:
            stop(daemon)
    assert len(srv.requests) == 1
    assert srv.requests[0].body == CHARGE["body"].encode()  # the request accepted, as sealed
