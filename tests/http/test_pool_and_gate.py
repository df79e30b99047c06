"""Connection reuse, the idle keep-alive close race, and the dispatch gate's authority."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from trio.testing import MockClock

from affidavit.adapters.base import SetupError
from affidavit.adapters.http import HttpClient, HttpRequest, Timeouts

from .fakes import FakeEngine
from .hostile import HostileServer, Reply, scripts

FAST = Timeouts(connect=2.0, write=2.0, read=2.0)


def req(url: str, method: str = "GET", body: bytes = b"") -> HttpRequest:
    return HttpRequest(method, url, [("Authorization", "Bearer tok-abcdef")], body, timeouts=FAST)


async def perform(client: HttpClient, request: HttpRequest, **kw: Any) -> FakeEngine:
    fe = FakeEngine(**kw)
    with trio.fail_after(10):
        await client.perform(request, fe.ctx)
    return fe


async def test_fresh_then_pooled_connection_reuse(client: HttpClient) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        first = await perform(client, req(srv.url + "/a"))
        second = await perform(client, req(srv.url + "/b", "POST", b"x"))
    assert first.events[:2] == ["resolve", "connect"]
    assert first.gates[0]["reused_connection"] is False
    assert second.events[0] == "reuse"
    assert second.gates[0]["reused_connection"] is True
    # The same verified connection carried both requests, and each hop was gated.
    assert second.gates[0]["connection"] == first.gates[0]["connection"]
    assert srv.connections == 1 and [r.target for r in srv.requests] == ["/a", "/b"]
    assert [r.connection for r in srv.requests] == [0, 0]


async def test_idle_connection_closed_by_server_is_discarded_before_the_boundary(
    client: HttpClient,
) -> None:
    async def script(peer: Any) -> None:
        if peer.index == 0:
            await scripts.keep_alive_then_close()(peer)
        else:
            await scripts.serve(Reply(200, body=b"fresh"))(peer)

    async with HostileServer.running(script) as srv:
        await perform(client, req(srv.url + "/one"))
        assert client.idle_connections() == 1
        with trio.fail_after(5):
            await srv.event("idle_closed").wait()
        await trio.sleep(0.05)  # let the FIN reach our socket
        fe = await perform(client, req(srv.url + "/two", "POST", b"x"))
    assert fe.events[:3] == ["stale_connection_discarded", "resolve", "connect"]
    assert fe.facts_of("stale_connection_discarded")[0]["reason"] == "readable_while_idle"
    assert fe.gates[0]["reused_connection"] is False
    assert srv.connections == 2 and srv.requests[1].connection == 1


async def test_idle_timeout_discards_old_connections(autojump_clock: MockClock) -> None:
    async with (
        HostileServer.running(scripts.serve(Reply(200))) as srv,
        HttpClient(idle_timeout=0.05) as client,
    ):
        await perform(client, req(srv.url + "/"))
        await trio.sleep(0.1)
        fe = await perform(client, req(srv.url + "/"))
    assert fe.facts_of("stale_connection_discarded")[0]["reason"] == "idle_timeout"
    assert srv.connections == 2


async def test_connection_close_response_is_not_pooled(client: HttpClient) -> None:
    reply = Reply(200, headers=[("Connection", "close")], body=b"bye")
    async with HostileServer.running(scripts.serve(reply)) as srv:
        await perform(client, req(srv.url + "/"))
        assert client.idle_connections() == 0
        fe = await perform(client, req(srv.url + "/"))
    assert "reuse" not in fe.events and srv.connections == 2


async def test_pool_keeps_at_most_max_per_origin_idle_connections() -> None:
    async with (
        HostileServer.running(scripts.slow(0.1, Reply(200))) as srv,
        HttpClient(max_per_origin=2) as client,
    ):
        async with trio.open_nursery() as n:
            for _ in range(4):
                n.start_soon(perform, client, req(srv.url + "/"))
        assert srv.connections == 4
        assert client.idle_connections() == 2


class GateRefused(Exception):
    pass


async def test_gate_refusal_writes_nothing_on_a_fresh_connection(client: HttpClient) -> None:
    async with HostileServer.running(scripts.serve(Reply(200))) as srv:
        fe = FakeEngine(gate_error=GateRefused("lease lost"))
        with trio.fail_after(10), pytest.raises(GateRefused):
            await client.perform(req(srv.url + "/pay", "POST", b"{}"), fe.ctx)
        await trio.sleep(0.05)
        assert srv.requests == []  # not one byte of the request reached the server
        assert not fe.machine.dispatched and fe.machine.state == "abandoned"
        # The untouched connection went back to the pool and still works.
        again = await perform(client, req(srv.url + "/pay", "POST", b"{}"))
    assert again.events[0] == "reuse"
    assert len(srv.requests) == 1 and srv.connections == 1


async def test_gate_refusal_on_a_pooled_connection_keeps_it_usable(client: HttpClient) -> None:
    async with HostileServer.running(scripts.serve(Reply(200))) as srv:
        await perform(client, req(srv.url + "/"))
        fe = FakeEngine(gate_error=GateRefused("config changed"))
        with trio.fail_after(10), pytest.raises(GateRefused):
            await client.perform(req(srv.url + "/x"), fe.ctx)
        assert fe.events == ["reuse", "gate_refused"]
        again = await perform(client, req(srv.url + "/y"))
    assert again.events[0] == "reuse"
    assert [r.target for r in srv.requests] == ["/", "/y"]


async def test_a_head_made_ahead_then_refused_closes_the_pooled_connection(
    client: HttpClient,
) -> None:
    """The gate ran ``meanwhile`` (h11 now holds the request head) and then failed (the
    barrier's COMMIT did): nothing is written, and the connection -- of no use to another
    request now -- is closed, never pooled.  The next request goes out on a new one."""
    async with HostileServer.running(scripts.serve(Reply(200))) as srv:
        await perform(client, req(srv.url + "/"))
        fe = FakeEngine(commit_error=GateRefused("commit failed"))
        with trio.fail_after(10), pytest.raises(GateRefused):
            await client.perform(req(srv.url + "/x", "POST", b"{}"), fe.ctx)
        assert fe.meanwhiles == 1 and fe.events == ["reuse", "gate_refused"]
        assert not fe.machine.dispatched
        assert client.idle_connections() == 0
        again = await perform(client, req(srv.url + "/y"))
    assert again.events[0] != "reuse"
    assert [r.target for r in srv.requests] == ["/", "/y"] and srv.connections == 2


async def test_closed_client_refuses_before_dispatch() -> None:
    client = HttpClient()
    await client.aclose()
    fe = FakeEngine()
    with pytest.raises(SetupError):
        await client.perform(req("http://127.0.0.1:9/"), fe.ctx)
    assert fe.gates == [] and not fe.machine.dispatched
