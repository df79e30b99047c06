"""Audit 53c: a last line with no newline before the end of input is read as a line, never
dropped in silence (the SDK's reader takes it too); an id reused while the request it named,
cancelled by the client, is still settling is refused with the truth -- that request is never
answered (MCP forbids it), not "the first one runs on and is answered under the same id"."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.testing

from affidavit.mcp.transport import StdioTransport

WAIT = 10


async def _exchange(lines: list[bytes], close: bool, count: int) -> tuple[list[Any], list[Any]]:
    """Send ``lines`` (closing the input after, if ``close``); return what the server side read
    and the first ``count`` answers the transport wrote itself."""
    to_server, server_in = trio.testing.memory_stream_one_way_pair()
    server_out, from_server = trio.testing.memory_stream_one_way_pair()
    stdio = StdioTransport(server_in, server_out)
    seen: list[Any] = []
    data = b""
    async with stdio.streams() as (read, write), read, write, trio.open_nursery() as nursery:

        async def drain() -> None:
            async for message in read:
                seen.append(message)

        nursery.start_soon(drain)
        for line in lines:
            await to_server.send_all(line)
            await trio.testing.wait_all_tasks_blocked()
        if close:
            await to_server.aclose()
        with trio.fail_after(WAIT):
            while data.count(b"\n") < count:
                data += await from_server.receive_some(65536)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    return seen, [json.loads(line) for line in data.splitlines()]


async def test_a_last_line_without_newline_is_read() -> None:
    _seen, got = await _exchange([b'{"jsonrpc": "2.0", "id": 1, "method"'], close=True, count=1)
    assert [a["error"]["code"] for a in got] == [-32700]  # read, and answered as unparsable


async def test_a_last_request_without_newline_reaches_the_server() -> None:
    line = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "ping"}).encode()
    seen, _got = await _exchange([line], close=True, count=0)
    assert [m.message.id for m in seen] == [7]


async def test_a_reused_id_of_a_cancelled_request_is_told_it_is_never_answered() -> None:
    call = {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "x"}}
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 5}}
    again = {"jsonrpc": "2.0", "id": 5, "method": "ping"}
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}}
    lines = [json.dumps(m).encode() + b"\n" for m in (init, call, cancel, again)]
    _seen, got = await _exchange(lines, close=False, count=1)
    message = got[0]["error"]["message"]
    assert got[0]["id"] == 5
    assert "cancelled by the client" in message and "never answered" in message
    assert "runs on" not in message


@pytest.mark.parametrize(
    ("params", "shown"),
    [
        ({"name": 5, "arguments": {}}, "INVALID_FIELD at params.name: a number"),
        ({"arguments": {}}, "MISSING_FIELD at params.name"),
        (
            {"name": "list_targets", "arguments": {}, "_meta": {"progressToken": {"x": 1}}},
            "INVALID_FIELD at params._meta.progressToken: an object",
        ),
        (
            {"name": "list_targets", "_meta": {"progressToken": True}},
            "INVALID_FIELD at params._meta.progressToken: a boolean",
        ),
        ({"name": "list_targets", "_meta": [1]}, "INVALID_FIELD at params._meta: an array"),
        (
            {"name": "list_targets", "_meta": {"progressToken": None}},
            "INVALID_FIELD at params._meta.progressToken: null",
        ),
        (
            {"name": "list_targets", "_meta": {"progressToken": 5.5}},
            "INVALID_FIELD at params._meta.progressToken: a number",
        ),
    ],
    ids=[
        "name-number",
        "name-missing",
        "token-object",
        "token-boolean",
        "meta-array",
        "token-null",
        "token-fraction",
    ],
)
async def test_a_call_the_sdk_would_refuse_without_a_field_names_it(
    params: dict[str, Any], shown: str
) -> None:
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}}
    call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": params}
    lines = [json.dumps(m).encode() + b"\n" for m in (init, call)]
    _seen, got = await _exchange(lines, close=False, count=1)
    assert got[0]["id"] == 3 and got[0]["error"]["code"] == -32602
    assert got[0]["error"]["message"].startswith(shown)


@pytest.mark.parametrize("token", [5, 5.0, 1e2, "t"], ids=["int", "whole-float", "exp", "str"])
def test_a_progress_token_that_is_a_whole_number_or_a_string_passes(token: Any) -> None:
    """5.0 is an integer (JSON has one number type; the SDK takes it as 5), as F5's rule says
    of integer arguments: not refused (review 53c)."""
    from mcp_types import JSONRPCRequest

    from affidavit.mcp.transport import _arguments_fault

    params = {"name": "list_targets", "_meta": {"progressToken": token}}
    message = JSONRPCRequest(jsonrpc="2.0", id=3, method="tools/call", params=params)
    assert _arguments_fault(message) is None


async def test_a_request_the_sdk_settles_unanswered_is_not_marked_cancelled() -> None:
    """Only a ``notifications/cancelled`` marks a request cancelled; the SDK dropping its
    answer for another reason is not the client's cancel (review 53c: the log said so)."""
    from affidavit.mcp.transport import Outcome, _Request

    send, receive = trio.testing.memory_stream_pair()
    transport = StdioTransport(receive, send)
    request = _Request(10)
    request.outcome = Outcome()
    await transport._unanswered(7, request)
    assert not request.cancelled and not request.outcome.cancelled
