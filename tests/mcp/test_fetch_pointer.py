"""A result answered by reference (over the inline limit, 1 MiB) is delivered by a whole fetch
-- and following the reference's own pointer (``fetch: {invocation_id, from_chunk: 0}``)
literally is one: RESULT_DELIVERED channel ``fetch``, once, on MCP (embedded and through the
daemon) and on the daemon's route (``Client.fetch_result``).  Audit 53c: a caller doing what
the reference said got every byte and the record stayed ``stored_committed`` for ever."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from affidavit.api import Client
from tests.broker.helpers import TOKEN_ENV, http_target, write_config
from tests.daemon.kit import running_daemon
from tests.http.hostile import HostileServer, Reply, scripts

from .kit import Connected, connected, env_without_secrets, structured

BODY = b"y" * (1024 * 1024 + 7)
GET = {"target": "api", "method": "GET", "path": "/big"}


def _delivered(events: list[dict[str, Any]]) -> list[Any]:
    return [
        (e.get("attrs") or {}).get("channel")
        for e in events
        if (e.get("kind") or e.get("event")) == "RESULT_DELIVERED"
    ]


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


@pytest.mark.parametrize("mode", ["embedded", "daemon"])
@pytest.mark.parametrize("pointer", [True, False], ids=["pointer", "whole"])
async def test_mcp_following_the_pointer_records_a_fetch_delivery(
    tmp_path: Path, token: str, mode: str, pointer: bool
) -> None:
    async with (
        HostileServer.running(scripts.serve(Reply(200, body=BODY))) as srv,
        _mcp(mode, tmp_path, srv.url, token) as mcp,
    ):
        answer = structured(await mcp.call("http_request", GET))
        fetch = answer["result"]["by_reference"]["fetch"]
        iid = answer["invocation_id"]
        assert fetch == {"invocation_id": iid, "from_chunk": 0}
        assert await _record(mcp, iid) == ("stored_committed", [])
        asked = fetch if pointer else {"invocation_id": iid}
        got = structured(await mcp.call("fetch_result", asked))
        assert got["result"]["body"].encode() == BODY
        state, channels = await _record(mcp, iid)
        assert not state.startswith("stored_") and channels == ["fetch"], (state, channels)
        again = structured(await mcp.call("fetch_result", fetch))  # a read: nothing more
        assert again["result"]["body"].encode() == BODY
        assert (await _record(mcp, iid))[1] == ["fetch"]


@pytest.mark.parametrize("from_chunk", [0, None], ids=["pointer", "whole"])
async def test_the_daemon_route_records_a_fetch_delivery_of_the_pointer(
    tmp_path: Path, token: str, from_chunk: int | None
) -> None:
    async with (
        HostileServer.running(scripts.serve(Reply(200, body=BODY))) as srv,
        running_daemon(tmp_path, {"api": http_target(srv.url)}, token=token) as daemon,
        Client.open(daemon.socket) as client,
    ):
        answer = await client.call(GET)
        iid = answer["invocation_id"]
        assert answer["result"]["by_reference"]["fetch"]["from_chunk"] == 0
        page = await client.fetch_result(iid, from_chunk=0, chunks=1)  # a page: nothing
        assert page is not None and page["result"]["resume"]["next_chunk"] == 1
        assert _delivered(await client.events(iid)) == []
        got = await client.fetch_result(iid, from_chunk=from_chunk)
        assert got is not None and got["result"]["body"].encode() == BODY
        if from_chunk == 0:
            assert got["result"]["resume"]["from_chunk"] == 0
        assert _delivered(await client.events(iid)) == ["fetch"]
