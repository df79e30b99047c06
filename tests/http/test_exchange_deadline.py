"""The exchange's single deadline scope keeps the per-phase timeout semantics of ``Timeouts``
(adapters/http/exchange.py, ``_Hop.transfer``): ``read`` is an inactivity limit per wait for
response bytes -- not a limit on the whole response -- and the time the engine's sink spends
journaling received bytes is not counted as the peer's silence.

Time is the subject here, so it runs on trio's fake clock (``autojump_clock``): the client's
deadlines and the scripted peer's pauses are both trio's clock, the peer is a task in the same
run, so the gaps are exact and nothing waits in real time."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from trio.testing import MockClock

from affidavit.adapters.base import AttemptInterrupted
from affidavit.adapters.http import HttpClient, HttpRequest, Timeouts
from affidavit.statemachine import Code, Outcome

from .fakes import FakeEngine
from .hostile import HostileServer, Peer, Reply, scripts

PIECES = 5
GAP = 0.1
READ = 0.3  # each gap is well under it; all the gaps together are over it


def req(url: str, **kw: Any) -> HttpRequest:
    return HttpRequest(
        "GET",
        url,
        [("Authorization", "Bearer tok-abcdef")],
        timeouts=Timeouts(connect=2.0, write=2.0, read=READ),
        **kw,
    )


async def test_a_slow_but_steady_body_is_not_a_read_timeout(
    client: HttpClient, autojump_clock: MockClock
) -> None:
    async def drip(peer: Peer) -> None:
        await peer.read_request()
        await peer.send_raw(f"HTTP/1.1 200 OK\r\nContent-Length: {PIECES}\r\n\r\n".encode())
        for _ in range(PIECES):
            await trio.sleep(GAP)
            await peer.send_raw(b"x")

    async with HostileServer.running(drip) as srv:
        fe = FakeEngine()
        with trio.fail_after(5):
            started = trio.current_time()
            res = await client.perform(req(srv.url + "/"), fe.ctx)
            took = trio.current_time() - started
    assert res.outcome is Outcome.COMMITTED and fe.body == b"x" * PIECES
    assert took > READ  # the whole response took longer than one read's limit


async def test_a_stall_after_steady_bytes_still_times_out_per_read(
    client: HttpClient, autojump_clock: MockClock
) -> None:
    async def drip_then_stall(peer: Peer) -> None:
        await peer.read_request()
        await peer.send_raw(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
        for _ in range(PIECES):
            await trio.sleep(GAP)
            await peer.send_raw(b"x")
        await trio.sleep_forever()

    async with HostileServer.running(drip_then_stall) as srv:
        fe = FakeEngine()
        with trio.fail_after(5), pytest.raises(AttemptInterrupted) as info:
            await client.perform(req(srv.url + "/"), fe.ctx)
    assert info.value.code is Code.REMOTE_RESULT_INCOMPLETE
    assert info.value.facts["during"] == "read" and info.value.facts["body_bytes"] == PIECES
    assert fe.events[-1] == "timed_out"


async def test_time_spent_in_the_sink_is_not_the_peers_silence(
    client: HttpClient, autojump_clock: MockClock
) -> None:
    body = b"y" * 10

    class SlowSink(FakeEngine):
        async def _sink(self, stream: str, data: bytes) -> None:
            await trio.sleep(READ * 2)  # e.g. a journal write waiting for its transaction
            await super()._sink(stream, data)

    async with HostileServer.running(scripts.serve(Reply(200, body=body))) as srv:
        fe = SlowSink()
        with trio.fail_after(5):
            res = await client.perform(req(srv.url + "/"), fe.ctx)
    assert res.outcome is Outcome.COMMITTED and fe.body == body
    assert "timed_out" not in fe.events


async def test_a_callers_cancellation_is_not_reported_as_a_timeout(
    client: HttpClient, autojump_clock: MockClock
) -> None:
    async with HostileServer.running(scripts.silent()) as srv:
        fe = FakeEngine()
        with trio.move_on_after(READ / 3) as outer:
            await client.perform(req(srv.url + "/"), fe.ctx)
    assert outer.cancelled_caught
    assert fe.events[-1] == "cancelled" and fe.machine.dispatched


async def test_a_request_head_the_peer_never_reads_times_out_as_a_write(
    client: HttpClient, autojump_clock: MockClock
) -> None:
    """The scope is made armed with the write's limit (``transfer``): the head's own write is
    bounded too, not only the body's -- a head larger than the socket buffers, to a peer that
    reads nothing, ends as a write timeout after dispatch."""
    big = "h" * (16 * 1024 * 1024)  # more than loopback socket buffers hold
    async with HostileServer.running(scripts.silent()) as srv:
        fe = FakeEngine()
        request = HttpRequest(
            "GET",
            srv.url + "/",
            [("Authorization", "Bearer tok-abcdef"), ("X-Big", big)],
            timeouts=Timeouts(connect=2.0, write=0.3, read=READ),
        )
        with trio.fail_after(10), pytest.raises(AttemptInterrupted) as info:
            await client.perform(request, fe.ctx)
    assert info.value.code is Code.REMOTE_OUTCOME_UNKNOWN
    assert info.value.facts["during"] == "write"
    assert fe.machine.dispatched and fe.events[-1] == "timed_out"
