"""A reconciliation query or an operation's poll asked through the daemon is requested by the
socket peer, never by the daemon (rvC finding 5): the approval it waits for names the agent's
uid, so that the agent cannot approve its own query -- and an operator running the daemon's
uid is not refused as if it had asked.  Dropping ``requester=req.peer.uid`` (daemon/operators.py,
daemon/app.py) recorded the daemon's own uid: these fail then.  The agent is ``nobody``, as in
test_approvals.py (root only: ``as_user``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.broker.approvalkit import PaymentsApi, reconcile_target
from tests.broker.test_operations import JOBS, SUBMIT, job_api
from tests.http.hostile import HostileServer, scripts

from .kit import NOBODY, as_user, cli, client_env, run, running_daemon
from .test_approvals import as_nobody

GETS = {"methods": ["GET"], "wait": "0s"}
POLL = """
import json, sys, trio
from affidavit.api.client import Client
async def main():
    async with Client.open(sys.argv[1]) as client:
        print(json.dumps(await client.poll_operation(sys.argv[2])))
trio.run(main)
"""


def _service() -> dict[str, object]:
    return {"allow_gids": [NOBODY], "operator_uids": [os.geteuid()]}


async def _requesters(daemon: object) -> dict[str, int]:
    listed = await cli(daemon, "approvals", "--json")  # type: ignore[arg-type]
    assert listed.returncode == 0, listed.stderr
    return {w["invocation_id"]: w["requester"]["uid"] for w in listed.json()}


async def test_a_query_through_the_daemon_is_the_peer_s_request(
    tmp_path: Path, token: str, shared_socket_dir: Path
) -> None:
    async with (
        HostileServer.running(PaymentsApi().script) as srv,
        running_daemon(
            tmp_path,
            reconcile_target(srv.url, approval=GETS),
            token=token,
            service=_service(),
            socket_dir=shared_socket_dir,
        ) as daemon,
    ):
        charge = {"target": "api", "method": "POST", "path": "/v1/charges"}
        charge |= {"body": json.dumps({"drop": True}), "idempotency_key": "k1"}
        sent = await as_nobody(daemon, "call", "-", stdin=json.dumps(charge).encode())
        iid = sent.json()["invocation_id"]
        asked = await as_nobody(daemon, "reconcile", iid, "--query")
        assert asked.returncode == 1, asked.stderr
        query_id = asked.json()["query"]["invocation_id"]
        assert (await _requesters(daemon)) == {query_id: NOBODY}
    assert [r.method for r in srv.requests] == ["POST"]


async def test_a_poll_through_the_daemon_is_the_peer_s_request(
    tmp_path: Path, token: str, shared_socket_dir: Path
) -> None:
    async with (
        HostileServer.running(scripts.serve(job_api(["done"]))) as srv,
        running_daemon(
            tmp_path,
            {"jobs": _jobs_target(srv.url)},
            token=token,
            service=_service(),
            socket_dir=shared_socket_dir,
        ) as daemon,
    ):
        sent = await as_nobody(daemon, "call", "-", stdin=json.dumps(SUBMIT).encode())
        op_id = sent.json()["operation"]["id"]
        # No command line polls through the daemon: the client library, run as nobody.
        env = client_env(daemon.socket)
        env["HOME"] = "/nonexistent"
        polled = await run(as_user(NOBODY, "-c", POLL, str(daemon.socket), op_id), env=env)
        assert polled.returncode == 0, polled.stderr
        poll_id = polled.json()["poll"]["invocation_id"]
        assert (await _requesters(daemon)) == {poll_id: NOBODY}
    assert [r.method for r in srv.requests] == ["POST"]


def _jobs_target(url: str) -> dict[str, object]:
    from tests.broker.helpers import http_target

    return http_target(url + "/v1", **JOBS, approval=GETS)
