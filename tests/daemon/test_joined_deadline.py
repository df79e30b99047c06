"""A same-key caller that joined a call awaiting approval and dispatches it once approved sends
under the target's own timeout -- not its deadline -- so it is answered at that deadline as a
caller that ran out of time: IN_PROGRESS, fetch the result (``CallControl.answer_by``).  Before,
it was answered only when the send ended, past the client's bound (ANSWER_LOST)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import trio

from affidavit.api.client import Client
from tests.broker.approvalkit import reconcile_target
from tests.daemon.kit import running_daemon, wait_until
from tests.http.hostile import HostileServer, Reply, scripts

DELAY = 6.0  # the remote's answer: longer than the joiner's deadline
CHARGE = {
    "target": "api",
    "method": "POST",
    "path": "/v1/charges",
    "body": '{"amount": 5}',
    "idempotency_key": "k-joined-deadline",
}


async def test_joined_call_answered_in_progress_at_its_deadline(tmp_path: Path, token: str) -> None:
    service = {"operator_uids": [os.geteuid()], "allow_self_approval": True}
    async with HostileServer.running(
        scripts.serve(Reply(200, body=b'{"ok":1}', delay=DELAY))
    ) as srv:
        target = reconcile_target(
            srv.url, approval={"wait": "15s"}, timeout={"connect": 2, "total": DELAY + 10}
        )
        async with (
            running_daemon(tmp_path, target, token=token, service=service) as daemon,
            Client.open(daemon.socket) as op,
        ):
            async with Client.open(daemon.socket) as first:
                pending = await first.call(CHARGE, timeout=0.5)
            assert pending["error"]["code"] == "APPROVAL_PENDING"
            iid = pending["invocation_id"]
            got: dict[str, Any] = {}

            async def joiner() -> None:
                async with Client.open(daemon.socket) as b:
                    got["env"] = await b.call(CHARGE, timeout=2)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(joiner)
                await trio.sleep(0.5)
                await op.approve(iid, note="go")
            env = got["env"]
            assert env["invocation_id"] == iid
            assert env["error"]["code"] == "IN_PROGRESS", env["error"]
            assert env["error"]["retry"] == "fetch_result"
            assert "result" not in env

            async def ended() -> dict[str, Any] | None:
                record = await op.record(iid)
                return record if record and record.get("outcome") == "committed" else None

            await wait_until(ended, "the joined dispatch ran on to its end")
            kinds = [e["kind"] for e in await op.events(iid)]
            assert kinds.count("DISPATCH_STARTED") == 1
            assert kinds[-1] == "RESULT_DELIVERY_FAILED"  # its answer was not the result
            fetched = await op.fetch_result(iid)
            assert fetched["result"]["status"] == 200
            assert len(srv.requests) == 1  # sent once
