"""A result answered by reference (over the inline limit, 1 MiB) is delivered by a whole fetch
(no ``from_chunk``) alone: RESULT_DELIVERED channel ``fetch``, once.  Following the reference's
pointer (``fetch: {invocation_id, from_chunk: 0}``) pages it -- every byte, recording nothing,
the record stays ``stored_*`` -- on MCP (embedded and through the daemon) and on the daemon's
route (``Client.fetch_result``).  MCP's whole fetch is bounded (``WHOLE_FETCH_MOST``): past
it, ``WHOLE_FETCH_TOO_LARGE`` at ``from_chunk``, nothing recorded, the whole never read (review
53c: a 24 MiB body made a 25 MB JSON-RPC line) -- and the cap bounds the line, not the stored
bytes: a body of control characters just under it serializes under the transport's MAX_LINE."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
import trio
import trio.testing

from affidavit.api import Client
from affidavit.mcp import server, tools, transport
from affidavit.mcp.backends import Daemon, Embedded, Exchange
from affidavit.mcp.render import render
from tests.broker.helpers import TOKEN_ENV, http_target, write_config
from tests.daemon.kit import running_daemon
from tests.http.hostile import HostileServer, Reply, scripts

from .kit import Connected, connected, env_without_secrets, structured

BODY = b"y" * (1024 * 1024 + 7)
GET = {"target": "api", "method": "GET", "path": "/big"}
MODES = ["embedded", "daemon"]


def _delivered(events: list[dict[str, Any]]) -> list[Any]:
    return [
        (e.get("attrs") or {}).get("channel")
        for e in events
        if (e.get("kind") or e.get("event")) == "RESULT_DELIVERED"
    ]


def _kinds(events: list[dict[str, Any]]) -> list[Any]:
    return [e.get("kind") or e.get("event") for e in events]


@contextlib.asynccontextmanager
async def _mcp(mode: str, tmp: Path, url: str, token: str) -> AsyncIterator[Connected]:
    log = tmp / "mcp.log"
    if mode == "embedded":
        cfg = write_config(tmp, {"api": http_target(url)})
        env = env_without_secrets(**{TOKEN_ENV: token})
        async with connected(["--config", str(cfg)], env, log) as mcp:
            yield mcp
        return
    async with (
        running_daemon(tmp, {"api": http_target(url)}, token=token) as daemon,
        connected(["--socket", str(daemon.socket)], env_without_secrets(), log) as mcp,
    ):
        yield mcp


async def _record(mcp: Connected, iid: str) -> tuple[str, list[Any]]:
    got = structured(await mcp.call("get_record", {"invocation_id": iid}))
    return got["record"]["state"], _delivered(got["events"])


@pytest.mark.parametrize("mode", MODES)
async def test_mcp_pages_the_pointer_recording_nothing_and_a_whole_fetch_records_fetch(
    tmp_path: Path, token: str, mode: str
) -> None:
    async with (
        HostileServer.running(scripts.serve(Reply(200, body=BODY))) as srv,
        _mcp(mode, tmp_path, srv.url, token) as mcp,
    ):
        called = await mcp.call("http_request", GET)
        answer = structured(called)
        fetch = answer["result"]["by_reference"]["fetch"]
        iid = answer["invocation_id"]
        assert fetch == {"invocation_id": iid, "from_chunk": 0}
        text = called.content[0].text
        assert "a page records nothing" in text and "without from_chunk" in text, text
        page = structured(await mcp.call("fetch_result", fetch))  # the pointer: a page
        assert page["result"]["body"].encode() == BODY
        assert page["result"]["resume"]["next_chunk"] is None
        assert await _record(mcp, iid) == ("stored_committed", [])
        got = structured(await mcp.call("fetch_result", {"invocation_id": iid}))
        assert got["result"]["body"].encode() == BODY
        state, channels = await _record(mcp, iid)
        assert not state.startswith("stored_") and channels == ["fetch"], (state, channels)
        again = structured(await mcp.call("fetch_result", {"invocation_id": iid}))  # a read
        assert again["result"]["body"].encode() == BODY
        assert (await _record(mcp, iid))[1] == ["fetch"]


async def test_the_daemon_route_pages_the_pointer_recording_nothing(
    tmp_path: Path, token: str
) -> None:
    async with (
        HostileServer.running(scripts.serve(Reply(200, body=BODY))) as srv,
        running_daemon(tmp_path, {"api": http_target(srv.url)}, token=token) as daemon,
        Client.open(daemon.socket) as client,
    ):
        answer = await client.call(GET)
        iid = answer["invocation_id"]
        assert answer["result"]["by_reference"]["fetch"]["from_chunk"] == 0
        paged = await client.fetch_result(iid, from_chunk=0)  # every page, put together
        assert paged is not None and paged["result"]["body"].encode() == BODY
        assert _delivered(await client.events(iid)) == []
        got = await client.fetch_result(iid)
        assert got is not None and got["result"]["body"].encode() == BODY
        assert _delivered(await client.events(iid)) == ["fetch"]


@contextlib.asynccontextmanager
async def _backend(mode: str, tmp: Path, url: str, token: str) -> AsyncIterator[Any]:
    if mode == "embedded":
        cfg = write_config(tmp, {"api": http_target(url)})
        async with Embedded.open(str(cfg)) as backend:
            yield backend
        return
    async with (
        running_daemon(tmp, {"api": http_target(url)}, token=token) as daemon,
        Daemon.open(str(daemon.socket)) as backend,
    ):
        yield backend


@pytest.mark.parametrize("mode", MODES)
async def test_a_whole_fetch_over_the_cap_is_refused_unread_and_unrecorded(
    tmp_path: Path, token: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cap lowered to 1 MiB (the real one read the same way): the whole fetch of a
    1 MiB + 7 result, asked through the tool dispatch, is refused ``WHOLE_FETCH_TOO_LARGE``
    naming ``from_chunk`` -- only its one-chunk head was read."""
    monkeypatch.setenv(TOKEN_ENV, token)
    monkeypatch.setattr(server, "WHOLE_FETCH_MOST", 1024 * 1024)
    asked: list[tuple[Any, Any]] = []
    with trio.fail_after(60):
        async with (
            HostileServer.running(scripts.serve(Reply(200, body=BODY))) as srv,
            _backend(mode, tmp_path, srv.url, token) as backend,
        ):
            answer = await backend.call(GET, Exchange())
            iid = answer["invocation_id"]
            fetch = backend.fetch_result

            async def counted(i: str, at: Any, size: Any, ex: Exchange) -> dict[str, Any]:
                asked.append((at, size))
                return await fetch(i, at, size, ex)

            monkeypatch.setattr(backend, "fetch_result", counted)
            before = (await backend.record(iid))["record"]
            ours, _theirs = trio.testing.memory_stream_pair()
            session = server.McpSession(backend, transport.StdioTransport(ours, ours), "s1")
            async with trio.open_nursery() as nursery:
                session.nursery = nursery  # as serve() gives it one for the calls
                refused = await session.answer(1, "fetch_result", {"invocation_id": iid})
            after = await backend.record(iid)
    error = refused["error"]
    assert error["code"] == "WHOLE_FETCH_TOO_LARGE" and error["field"] == "from_chunk", refused
    assert error["retry"] == "after_correction", refused
    assert str(len(BODY)) in error["message"] and "chunks" in error["message"], refused
    assert asked == [(0, 1)]  # the head page alone: the whole never read, no line built
    assert after["record"] == before, after  # the record as it was: nothing recorded
    assert "RESULT_DELIVERED" not in _kinds(after["events"])  # nothing recorded


def test_a_whole_fetch_at_the_cap_of_control_characters_makes_a_line_under_max_line() -> None:
    """The cap bounds the JSON-RPC line, not the stored bytes: a body of ``WHOLE_FETCH_MOST``
    bytes of ``\\x01`` (each escaped ``\\u0001``, 6 bytes) answered as the server answers it --
    the text and the structured content -- is a line under the transport's own MAX_LINE.
    Review 53c round 3: at 16 MiB - 1 the line was 100,663,484 bytes."""
    assert tools.LINE_MOST == transport.MAX_LINE
    env = {
        "invocation_id": "x" * 64,
        "outcome": "committed",
        "result": {"status": 200, "headers": {"content-type": "text/plain"}, "body": ""},
    }
    env["result"]["body"] = "\x01" * tools.WHOLE_FETCH_MOST
    text = types.TextContent(type="text", text=render(env))
    called = types.CallToolResult(content=[text], structured_content=env)
    result = called.model_dump(by_alias=True, mode="json", exclude_none=True)
    line = types.JSONRPCResponse(jsonrpc="2.0", id=1, result=result).model_dump_json(
        by_alias=True, exclude_unset=True
    )
    assert 6 * tools.WHOLE_FETCH_MOST < len(line) < transport.MAX_LINE
