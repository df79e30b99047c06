"""The real MCP SDK client talking to ``affidavit mcp`` over stdio, for the MCP tests.

    async with connected(["--config", str(cfg)], env) as mcp:
        tools = await mcp.session.list_tools()
        result = await mcp.call("http_request", {...})     # a CallToolResult
        mcp.wire                                          # every JSON-RPC message, both ways
        mcp.stderr()                                      # the server's log

``stdio_client`` spawns the server (``python -m affidavit mcp ...``) with exactly ``env``; a
tap between the transport and ``ClientSession`` keeps every message that crossed stdio.  Every
wait is bounded (``WAIT``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import trio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.message import SessionMessage

from affidavit.mcp.render import render
from tests.broker.helpers import TOKEN_ENV

__all__ = ["PYTHON", "WAIT", "Connected", "connected", "env_without_secrets", "structured"]

WAIT = 30.0
PYTHON = sys.executable


def env_without_secrets(**extra: str) -> dict[str, str]:
    """The environment of a process that holds no credential (the proxy's, a client's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AFFIDAVIT_")}
    env.pop(TOKEN_ENV, None)
    env.update(extra)
    return env


@dataclass
class Connected:
    session: ClientSession
    log: Path
    wire: list[str] = field(default_factory=list)

    async def call(self, name: str, arguments: Mapping[str, Any] | None = None) -> Any:
        with trio.fail_after(WAIT):
            return await self.session.call_tool(name, dict(arguments or {}))

    def stderr(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")


def structured(result: Any) -> dict[str, Any]:
    """The result's structured content, checked to be what its text block renders from: every
    end-to-end call checks the text an agent reads (``affidavit/mcp/render.py``)."""
    content = result.structured_content
    assert isinstance(content, dict), result
    assert result.content and result.content[0].type == "text", result
    assert result.content[0].text == render(content), (result.content[0].text, content)
    return content


def _dump(item: SessionMessage | Exception) -> str:
    if isinstance(item, Exception):
        return repr(item)
    return item.message.model_dump_json(by_alias=True, exclude_unset=True)


@contextlib.asynccontextmanager
async def connected(
    args: Sequence[str], env: Mapping[str, str], log: Path, python: Sequence[str] = ()
) -> AsyncIterator[Connected]:
    """``python [PYTHON_ARGS] -m affidavit mcp ARGS``, its stderr appended to ``log``."""
    params = StdioServerParameters(
        command=PYTHON, args=[*python, "-m", "affidavit", "mcp", *args], env=dict(env)
    )
    with log.open("a", encoding="utf-8") as errlog, trio.fail_after(WAIT * 4):
        async with stdio_client(params, errlog=errlog) as (read, write):
            to_session, session_reads = anyio.create_memory_object_stream[
                SessionMessage | Exception
            ](0)
            session_writes, from_session = anyio.create_memory_object_stream[SessionMessage](0)
            conn = Connected(ClientSession(session_reads, session_writes), log)

            async def inbound() -> None:
                async with to_session:
                    async for item in read:
                        conn.wire.append(_dump(item))
                        await to_session.send(item)

            async def outbound() -> None:
                async with from_session:
                    async for item in from_session:
                        conn.wire.append(_dump(item))
                        await write.send(item)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(inbound)
                nursery.start_soon(outbound)
                async with conn.session:
                    with trio.fail_after(WAIT):
                        await conn.session.initialize()
                    yield conn
                nursery.cancel_scope.cancel()


def config_text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def wire_json(conn: Connected) -> list[Any]:
    return [json.loads(m) for m in conn.wire if m.startswith("{")]
