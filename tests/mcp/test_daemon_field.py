"""The MCP proxy passes on the ``field`` of the daemon's refusal.

The daemon's API-level refusals name the request's part to fix when there is one
(``{"api_error": {"code", "message", "field"}}``: a body at ``body.timeout``, a query
parameter); the proxy's tool answer is that ``api_error`` -- with its ``field``, or the agent
is told what is wrong and not where.  A stand-in daemon on a real Unix socket answers every
request 400 with a field; each of the proxy's ways to the daemon relays it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.mcp.backends import Daemon, Exchange

from .kit import WAIT

REFUSAL = {"code": "BAD_JSON", "message": "the body's timeout is not a duration", "field": "x.y"}


async def refuse_every_request(listener: trio.SocketListener, seen: list[bytes]) -> None:
    """Answer each request (read whole: head, then its Content-Length body) 400 with
    ``REFUSAL``, and close."""
    while True:
        stream = await listener.accept()
        async with stream:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    break
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    while len(body) < int(value):
                        body += await stream.receive_some(65536)
            seen.append(head.split(b"\r\n")[0])
            answer = json.dumps({"api_error": REFUSAL}).encode()
            await stream.send_all(
                b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
                + f"content-length: {len(answer)}\r\nconnection: close\r\n\r\n".encode()
                + answer
            )


ASKS: dict[str, Callable[[Daemon], Awaitable[dict[str, Any]]]] = {
    "call": lambda d: d.call({"target": "api", "method": "GET"}, Exchange()),
    "list_actions": lambda d: d.actions(None, None, 10),
    "get_record": lambda d: d.record("act_1"),
    "fetch_result": lambda d: d.fetch_result("act_1", None, None, Exchange()),
    "poll_operation": lambda d: d.poll_operation("op_1"),
}


@pytest.mark.parametrize("tool", sorted(ASKS))
async def test_a_daemon_refusal_s_field_reaches_the_agent(tmp_path: Path, tool: str) -> None:
    path = tmp_path / "affidavit.sock"
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await sock.bind(str(path))
    sock.listen(8)
    seen: list[bytes] = []
    async with trio.SocketListener(sock) as listener, trio.open_nursery() as nursery:
        nursery.start_soon(refuse_every_request, listener, seen)
        with trio.fail_after(WAIT):
            async with Daemon.open(str(path)) as backend:
                answer = await ASKS[tool](backend)
        nursery.cancel_scope.cancel()
    assert seen, "the daemon was not asked"
    assert answer == {"api_error": REFUSAL}, answer
