"""A result answered by reference (over the inline limit, 1 MiB) is delivered by a whole fetch
(no ``from_chunk``) alone: RESULT_DELIVERED channel ``fetch``, once.  Following the reference's
pointer (``fetch: {invocation_id, from_chunk: 0}``) pages it -- every byte, recording nothing,
the record stays ``stored_*`` -- on MCP (embedded and through the daemon) and on the daemon's
route (``Client.fetch_result``).  MCP's whole fetch is bounded (``WHOLE_FETCH_MOST``): past
it, ``ANSWER_TOO_LARGE`` at ``from_chunk``, nothing recorded, the whole never read (review 53c:
a 24 MiB body made a 25 MB JSON-RPC line)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api import Client
from affidavit.mcp import server
from affidavit.mcp.backends import Daemon, Embedded, Exchange
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
    """The cap lowered to 1 MiB (the 16 MiB one read the same way): the whole fetch of a
    1 MiB + 7 result is refused naming ``from_chunk`` -- only its one-chunk head was read."""
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
            refused = await server._whole(backend, iid, Exchange())
            after = await backend.record(iid)
    error = refused["error"]
    assert error["code"] == "ANSWER_TOO_LARGE" and error["field"] == "from_chunk", refused
    assert str(len(BODY)) in error["message"] and "chunks" in error["message"], refused
    assert asked == [(0, 1)]  # the head page alone: the whole never read, no line built
    assert after["record"] == before, after  # the record as it was: nothing recorded
    assert "RESULT_DELIVERED" not in _kinds(after["events"])  # nothing recorded
