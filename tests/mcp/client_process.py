"""An MCP client as a process of its own, for the tests that kill it mid-call.

    python -m tests.mcp.client_process '{"args": [...], "log": PATH, "call": {...}}'

It spawns ``affidavit mcp ARGS`` with the real SDK client (the server's stderr to ``log``),
prints this connection's session (``list_targets``) as one JSON line, then makes the ``call``
(an ``http_request``) and waits for it -- until the test kills it.
"""

from __future__ import annotations

import json
import os
import sys

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.mcp.kit import structured


async def main(spec: dict[str, object]) -> None:
    args = [str(a) for a in spec["args"]]  # type: ignore[attr-defined]
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "affidavit", "mcp", *args], env=dict(os.environ)
    )
    with open(str(spec["log"]), "a", encoding="utf-8") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            targets = await session.call_tool("list_targets", {})
            session_id = structured(targets)["session"]  # its text checked, as every call's
            print(json.dumps({"session": session_id}), flush=True)
            call = dict(spec["call"])  # type: ignore[call-overload]
            await session.call_tool("http_request", call)
            print(json.dumps({"answered": True}), flush=True)


if __name__ == "__main__":
    anyio.run(main, json.loads(sys.argv[1]), backend="trio")
