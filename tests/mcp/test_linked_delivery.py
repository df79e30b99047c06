"""A poll's result is delivered by the answer that carries it (seed: "Mark RESULT_DELIVERED only
after the protocol has confirmed complete transfer"): embedded ``affidavit mcp`` records the
poll's RESULT_DELIVERED (channel ``deliver``) once ``poll_operation``'s answer line was written
whole, and RESULT_DELIVERY_FAILED -- never RESULT_DELIVERED -- when the client hung up before it.
Before, the poll ran without the surface's ``deliver`` and was recorded delivered (channel
``return``) as soon as its envelope came back in-process, whether or not the answer was written.
The daemon's routes: tests/daemon/test_linked_delivery.py; a reconciliation query's:
tests/mcp/test_reconcile.py.  ``mcp()`` runs ``python -m affidavit mcp`` unless given another
``command`` (test_linked_answer_stop.py gives test_stop_bounded's ``MCP``: the same command with
the stop's fixed phases shortened)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import h11
import trio

from tests.broker.helpers import TOKEN_ENV, http_target, write_config
from tests.http.hostile import HostileServer, Peer, Reply

from .conftest import JOB, wait_for
from .kit import PYTHON, WAIT, env_without_secrets
from .test_protocol import INIT, Raw, call

OPERATIONS = {"status": "json:/state", "succeeded": ["done"], "failed": ["x"]}
DONE = Reply(200, body=json.dumps({"state": "done"}).encode())


async def held_polls(peer: Peer) -> None:
    """A job API: a POST is accepted (202, a status resource); a GET -- the poll -- sets
    ``polled`` and is answered once the test sets ``release``."""
    while True:
        req = await peer.read_request()
        if req is None:
            return
        if req.method == "GET":
            peer.server.event("polled").set()
            await peer.server.event("release").wait()
            await peer.respond(DONE)
        else:
            await peer.respond(JOB)
        if peer.h11.our_state is not h11.DONE or peer.h11.their_state is not h11.DONE:
            return


@asynccontextmanager
async def mcp(
    tmp: Path, cfg: Path, token: str, command: tuple[str, ...] = (PYTHON, "-m", "affidavit", "mcp")
) -> AsyncIterator[Raw]:
    """An embedded ``affidavit mcp`` spoken to in raw lines, initialized; killed on leaving if
    it has not exited.  ``command``: what runs ``affidavit mcp`` (its arguments follow)."""
    with (tmp / "mcp.log").open("ab") as log:
        proc = await trio.lowlevel.open_process(
            [*command, "--config", str(cfg)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env=env_without_secrets(**{TOKEN_ENV: token}),
        )
    raw = Raw(proc, tmp / "mcp.log")
    try:
        await raw.send(INIT)
        await raw.answer(0)
        await raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        yield raw
    finally:
        if proc.returncode is None:
            proc.kill()
        with trio.fail_after(WAIT):
            await proc.wait()
        for stream in (proc.stdin, proc.stdout):
            assert stream is not None
            await stream.aclose()


async def tool(raw: Raw, request_id: int, name: str, args: dict[str, Any]) -> dict[str, Any]:
    await raw.send(call(request_id, name, args))
    found: dict[str, Any] = (await raw.answer(request_id))["result"]["structuredContent"]
    return found


async def submitted(raw: Raw) -> tuple[str, str]:
    """The job submitted: its invocation and operation ids."""
    action = {"target": "jobs", "method": "POST", "path": "/jobs", "body": "{}"}
    envelope = await tool(raw, 1, "http_request", action)
    return envelope["invocation_id"], envelope["operation"]["id"]


async def poll_deliveries(raw: Raw, submission: str) -> list[tuple[str, Any]]:
    """The delivery events of the submission's poll, once one is on record (bounded)."""
    with trio.fail_after(WAIT):
        while True:
            events = (await tool(raw, 90, "get_record", {"invocation_id": submission}))["events"]
            polls = [e["attrs"].get("poll_invocation") for e in events]
            polls = [p for p in polls if p is not None]
            if polls:
                found = await tool(raw, 91, "get_record", {"invocation_id": polls[-1]})
                kinds = [(e["kind"], e["attrs"].get("channel")) for e in found["events"]]
                delivery = [k for k in kinds if k[0].startswith("RESULT_DELIVER")]
                if delivery:
                    return delivery
            await trio.sleep(0.05)


async def test_a_poll_whose_client_hung_up_before_its_answer_is_not_delivered(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(held_polls) as srv:
        cfg = write_config(tmp_path, {"jobs": http_target(srv.url + "/v1", operations=OPERATIONS)})
        async with mcp(tmp_path, cfg, token) as raw:
            submission, op = await submitted(raw)
            await raw.send(call(2, "poll_operation", {"operation_id": op}))
            await wait_for(srv.event("polled"))
            assert raw.proc.stdin is not None
            await raw.proc.stdin.aclose()  # the client is gone before the poll's answer
            srv.event("release").set()
            assert await raw.exits() == 0
        async with mcp(tmp_path, cfg, token) as raw:
            assert await poll_deliveries(raw, submission) == [("RESULT_DELIVERY_FAILED", "deliver")]
        assert [r.method for r in srv.requests] == ["POST", "GET"]  # polled once, never again
    assert "the answer to request 2 was not written" in (tmp_path / "mcp.log").read_text()


async def test_a_poll_whose_answer_was_read_is_delivered_once(tmp_path: Path, token: str) -> None:
    async with HostileServer.running(held_polls) as srv:
        srv.event("release").set()
        cfg = write_config(tmp_path, {"jobs": http_target(srv.url + "/v1", operations=OPERATIONS)})
        async with mcp(tmp_path, cfg, token) as raw:
            submission, op = await submitted(raw)
            polled = await tool(raw, 2, "poll_operation", {"operation_id": op})
            assert polled["operation"]["state"] == "succeeded"
            assert await poll_deliveries(raw, submission) == [("RESULT_DELIVERED", "deliver")]
