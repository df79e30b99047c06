"""The daemon's ``POST /v1/operations/{id}/poll`` and ``POST /v1/invocations/{id}/reconcile``
(a query): the poll's or the query's result is delivered by the answer that carries it --
RESULT_DELIVERED (channel ``deliver``) once that answer went into the socket whole,
RESULT_DELIVERY_FAILED and never RESULT_DELIVERED when the caller hung up before it
(docs/contract.md: the daemon's answers are ``deliver``, "written whole").  Before, it was
recorded delivered (channel ``return``) when its envelope came back in-process, before the
answer was written.  A query whose answer is read: tests/mcp/test_reconcile.py; embedded MCP:
tests/mcp/test_linked_delivery.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from affidavit.api.client import Client
from affidavit.journal import JournalReader
from tests.broker.approvalkit import reconcile_target
from tests.http.hostile import HostileServer, Peer, Reply
from tests.mcp.test_linked_delivery import OPERATIONS, held_polls

from .kit import running_daemon, serving, wait_until


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
        poll = polled["poll"]["invocation_id"]
    # Once the daemon stopped (every queued write settled): exactly one delivery row, not the
    # first of several.
    with JournalReader.open(daemon.journal, key_file=Path(f"{daemon.journal}.key")) as r:
        rows = [e.kind.value for e in r.events(poll) if e.kind.value.startswith("RESULT_DELIVER")]
    assert rows == ["RESULT_DELIVERED"]


async def held_queries(peer: Peer) -> None:
    """A payments API: a POST is applied and closed unanswered (an unknown outcome); a GET --
    the reconciliation query -- sets ``queried`` and finds it applied once ``release`` is set."""
    while True:
        req = await peer.read_request()
        if req is None:
            return
        if req.method == "POST":
            await peer.close()
            return
        peer.server.event("queried").set()
        await peer.server.event("release").wait()
        # The key echoed: the query's committed_if reads it (tests/broker/approvalkit.py).
        await peer.respond(Reply(200, body=b'{"id": "ch_1", "key": "k1"}'))


async def test_a_query_whose_caller_hung_up_before_its_answer_is_not_delivered(
    tmp_path: Path, token: str
) -> None:
    """``POST /v1/invocations/{id}/reconcile {"query": true}``: the query's result is carried by
    ``{reconciled, envelope, query}`` -- its caller gone first, RESULT_DELIVERY_FAILED."""
    async with (
        HostileServer.running(held_queries) as srv,
        running_daemon(tmp_path, reconcile_target(srv.url), token=token) as daemon,
        Client.open(daemon.socket) as client,
    ):
        action = {"target": "api", "method": "POST", "path": "/v1/charges", "body": "{}"}
        sent = await client.call({**action, "idempotency_key": "k1"})
        assert sent["error"]["outcome"] == "unknown"
        iid = sent["invocation_id"]
        stream = await trio.open_unix_socket(str(daemon.socket))
        body = b'{"query": true}'
        head = f"POST /v1/invocations/{iid}/reconcile HTTP/1.1\r\nhost: x\r\n"
        head += f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        await stream.send_all(head.encode() + body)
        with trio.fail_after(20):
            await srv.event("queried").wait()
        await stream.aclose()  # the caller is gone before the query's answer
        srv.event("release").set()

        async def found() -> list[tuple[str, Any]]:
            queries = [
                e["attrs"]["query_invocation"]
                for e in await client.events(iid)
                if e["kind"] == "RECONCILED"
            ]
            if not queries:
                return []
            kinds = [
                (e["kind"], e["attrs"].get("channel")) for e in await client.events(queries[0])
            ]
            return [k for k in kinds if k[0].startswith("RESULT_DELIVER")]

        delivery = await wait_until(found, "the query's delivery on record")
        assert delivery == [("RESULT_DELIVERY_FAILED", "deliver")]
