"""The daemon's ``POST /v1/operations/{id}/poll``: the poll's result is delivered by the answer
that carries it -- RESULT_DELIVERED (channel ``deliver``) once that answer went into the socket
whole, RESULT_DELIVERY_FAILED and never RESULT_DELIVERED when the caller hung up before it
(docs/contract.md: the daemon's answers are ``deliver``, "written whole").  Before, the poll was
recorded delivered (channel ``return``) when its envelope came back in-process, before the
answer was written.  Embedded MCP: tests/mcp/test_linked_delivery.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from affidavit.api.client import Client
from tests.mcp.test_linked_delivery import OPERATIONS, held_polls

from .kit import serving, wait_until


async def _submitted(client: Client) -> tuple[str, str]:
    envelope = await client.call({"target": "api", "method": "POST", "path": "/jobs", "body": "{}"})
    return envelope["invocation_id"], envelope["operation"]["id"]


async def _deliveries(client: Client, submission: str) -> list[tuple[str, Any]]:
    """The delivery events of the submission's poll, once one is on record (bounded)."""

    async def found() -> list[tuple[str, Any]]:
        polls = [
            e["attrs"]["poll_invocation"]
            for e in await client.events(submission)
            if "poll_invocation" in e["attrs"]
        ]
        if not polls:
            return []
        kinds = [(e["kind"], e["attrs"].get("channel")) for e in await client.events(polls[-1])]
        return [k for k in kinds if k[0].startswith("RESULT_DELIVER")]

    delivery: list[tuple[str, Any]] = await wait_until(found, "the poll's delivery on record")
    return delivery


async def test_a_poll_whose_caller_hung_up_before_its_answer_is_not_delivered(
    tmp_path: Path, token: str
) -> None:
    async with (
        serving(tmp_path, held_polls, token=token, overrides={"operations": OPERATIONS}) as (
            srv,
            daemon,
        ),
        Client.open(daemon.socket) as client,
    ):
        submission, op = await _submitted(client)
        stream = await trio.open_unix_socket(str(daemon.socket))
        request = f"POST /v1/operations/{op}/poll HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n"
        await stream.send_all(request.encode())
        with trio.fail_after(20):
            await srv.event("polled").wait()
        await stream.aclose()  # the caller is gone before the poll's answer
        srv.event("release").set()
        assert await _deliveries(client, submission) == [("RESULT_DELIVERY_FAILED", "deliver")]
    assert [r.method for r in srv.requests] == ["POST", "GET"]  # polled once, never again


async def test_a_poll_whose_answer_was_written_is_delivered_once(
    tmp_path: Path, token: str
) -> None:
    async with (
        serving(tmp_path, held_polls, token=token, overrides={"operations": OPERATIONS}) as (
            srv,
            daemon,
        ),
        Client.open(daemon.socket) as client,
    ):
        srv.event("release").set()
        submission, op = await _submitted(client)
        polled = await client.poll_operation(op)
        assert polled["operation"]["state"] == "succeeded"
        assert await _deliveries(client, submission) == [("RESULT_DELIVERED", "deliver")]
