"""A ``tools/call`` whose ``arguments`` are no JSON object is answered by the transport with
the field at fault (``INVALID_FIELD at params.arguments``), never the SDK's -32602 that names
none, and the server never sees it.  ``null`` reads as no arguments (as the SDK reads it)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import trio
import trio.testing

from .kit import WAIT
from .test_protocol import line, next_line, transport_on_memory


def tools_call(request_id: int, arguments: Any) -> bytes:
    params = {"name": "list_targets", "arguments": arguments}
    return line({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params})


@pytest.mark.parametrize(
    ("arguments", "kind"),
    [("notadict", "a string"), ([1], "an array"), (5, "a number"), (True, "a boolean")],
)
async def test_arguments_that_are_no_object_are_refused_at_params_arguments(
    arguments: Any, kind: str
) -> None:
    async with transport_on_memory() as (client, client_reads, read, _, _transport):
        with trio.fail_after(WAIT):
            await client.send_all(tools_call(3, arguments))
            answer = await next_line(client_reads)
            await trio.testing.wait_all_tasks_blocked()
        assert answer["id"] == 3
        assert answer["error"] == {
            "code": -32602,
            "message": f"INVALID_FIELD at params.arguments: {kind}, not a JSON object",
        }
        with pytest.raises(anyio.WouldBlock):
            read.receive_nowait()  # the server never saw it


@pytest.mark.parametrize("arguments", [{}, None])
async def test_an_object_or_null_reaches_the_server(arguments: Any) -> None:
    async with transport_on_memory() as (client, _, read, _write, _transport):
        with trio.fail_after(WAIT):
            await client.send_all(tools_call(4, arguments))
            assert (await read.receive()).message.id == 4
