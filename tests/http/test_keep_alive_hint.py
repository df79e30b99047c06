"""The server's ``Keep-Alive: timeout=N`` hint bounds how long a pooled connection is reused
(``pool.idle_limit``): reused near N, the request would race the server's own close."""

from __future__ import annotations

import pytest
import trio
from trio.testing import MockClock

from affidavit.adapters.http import HttpClient, HttpRequest, Timeouts
from affidavit.adapters.http.pool import idle_limit

from .fakes import FakeEngine
from .hostile import HostileServer, Reply, scripts

FAST = Timeouts(connect=2.0, write=2.0, read=2.0)


async def perform(client: HttpClient, url: str) -> FakeEngine:
    fe = FakeEngine()
    with trio.fail_after(10):
        await client.perform(HttpRequest("GET", url, [], b"", timeouts=FAST), fe.ctx)
    return fe


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("timeout=5", 4.0),
        ("timeout=5, max=100", 4.0),
        ("max=100, Timeout = 20", 18.0),
        ('timeout="10"', 9.0),
        ("timeout=1", None),
        ("timeout=0", None),
        ("timeout=600", 30.0),
        ("timeout=abc", 30.0),
        ("timeout=-3", 30.0),
        ("timeout=nan", 30.0),
        ("max=5", 30.0),
        ("timeout", 30.0),
    ],
    ids=lambda v: str(v),
)
def test_idle_limit_from_the_keep_alive_hint(value: str, expected: float | None) -> None:
    assert idle_limit([("Keep-Alive", value)], 30.0) == expected


def test_idle_limit_takes_the_smallest_hint_and_ignores_other_fields() -> None:
    headers = [
        ("keep-alive", "timeout=60"),
        ("X-Keep-Alive", "timeout=1"),
        ("Keep-Alive", "timeout=3"),
    ]
    assert idle_limit(headers, 30.0) == 2.0
    assert idle_limit([], 30.0) == 30.0


def test_default_idle_timeout_is_below_common_server_keep_alives() -> None:
    # Node and Apache close an idle connection after 5 s without a hint of it.
    assert idle_limit([], HttpClient()._pool._idle_timeout) == 4.0


async def test_hinted_connection_expires_before_the_server_closes_it(
    autojump_clock: MockClock,
) -> None:
    reply = Reply(200, headers=[("Keep-Alive", "timeout=5")], body=b"ok")
    async with (
        HostileServer.running(scripts.serve(reply)) as srv,
        HttpClient(idle_timeout=30.0) as client,
    ):
        await perform(client, srv.url + "/a")
        await trio.sleep(3.5)
        reused = await perform(client, srv.url + "/b")
        await trio.sleep(4.2)  # past 5 - max(1, 0.5) = 4 s, before the server's 5 s
        fresh = await perform(client, srv.url + "/c")
    assert reused.events[0] == "reuse"
    assert fresh.facts_of("stale_connection_discarded")[0]["reason"] == "idle_timeout"
    assert srv.connections == 2


async def test_hint_of_one_second_or_less_is_never_pooled(client: HttpClient) -> None:
    reply = Reply(200, headers=[("Keep-Alive", "timeout=1")], body=b"ok")
    async with HostileServer.running(scripts.serve(reply)) as srv:
        await perform(client, srv.url + "/a")
        assert client.idle_connections() == 0
        fe = await perform(client, srv.url + "/b")
    assert "reuse" not in fe.events and srv.connections == 2
