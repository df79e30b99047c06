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
from affidavit.engine import delivery
from tests.broker.approvalkit import reconcile_target
from tests.broker.helpers import TOKEN_ENV
from tests.daemon.kit import in_process, running_daemon, wait_until
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


HELD = 3.0  # the delivery held after the commit: past the joiner's deadline


async def test_a_result_committed_by_the_deadline_is_the_answer(
    tmp_path: Path, token: str, monkeypatch: Any
) -> None:
    """The deadline passes after RESULT_COMMITTED, before the delivery: the record is final,
    so the joiner is answered its result by that delivery, not IN_PROGRESS (the window forced
    in process: ``delivery._deliver`` held ``HELD`` s)."""
    service = {"operator_uids": [os.geteuid()], "allow_self_approval": True}
    held = delivery._deliver

    async def late(*args: Any) -> Any:
        await trio.sleep(HELD)
        return await held(*args)

    monkeypatch.setattr(delivery, "_deliver", late)
    monkeypatch.setenv(TOKEN_ENV, token)
    settings = reconcile_target("http://unused", approval={"wait": "15s"})["api"]
    settings = {k: v for k, v in settings.items() if k not in ("url", "kind")}
    script = scripts.serve(Reply(200, body=b'{"ok":1}'))
    async with in_process(tmp_path, script, service=service, overrides=settings) as (srv, sock):
        with trio.fail_after(30):
            async with Client.open(sock) as op:
                async with Client.open(sock) as first:
                    pending = await first.call(CHARGE, timeout=0.5)
                assert pending["error"]["code"] == "APPROVAL_PENDING"
                iid = pending["invocation_id"]
                got: dict[str, Any] = {}

                async def joiner() -> None:
                    async with Client.open(sock) as b:
                        got["env"] = await b.call(CHARGE, timeout=1.5)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(joiner)
                    await trio.sleep(0.5)
                    await op.approve(iid, note="go")
                env = got["env"]
                assert env["invocation_id"] == iid
                assert "error" not in env, env["error"]
                assert env["result"]["status"] == 200
                kinds = [e["kind"] for e in await op.events(iid)]
                assert kinds[-1] == "RESULT_DELIVERED"
                assert len(srv.requests) == 1
