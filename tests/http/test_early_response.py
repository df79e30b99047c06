"""A final response read while the request body is still being written (RFC 9112 §9.5,
``early.py``): a complete one decides the hop, anything less leaves it as it was."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from affidavit.adapters.base import AttemptInterrupted, RemoteResult
from affidavit.adapters.http import HttpClient, HttpRequest, Timeouts
from affidavit.adapters.http import exchange as exchange_module
from affidavit.statemachine import Code, Outcome

from .fakes import FakeEngine
from .hostile import HostileServer, Peer, Reply, TlsFixture

BIG = b"x" * (8 * 1024 * 1024)  # far past the loopback socket buffers
TOO_LARGE = Reply(413, headers=[("Connection", "close")], body=b"too large")


def req(url: str, *, write: float = 2.0, **kw: Any) -> HttpRequest:
    timeouts = Timeouts(connect=2.0, write=write, read=2.0)
    return HttpRequest(
        "POST", url, [("Authorization", "Bearer tok-abcdef")], BIG, timeouts=timeouts, **kw
    )


async def perform(client: HttpClient, request: HttpRequest) -> tuple[FakeEngine, RemoteResult]:
    fe = FakeEngine()
    with trio.fail_after(10):
        res = await client.perform(request, fe.ctx)
    return fe, res


async def interrupted(client: HttpClient, request: HttpRequest) -> tuple[FakeEngine, Any]:
    fe = FakeEngine()
    with trio.fail_after(10), pytest.raises(AttemptInterrupted) as info:
        await client.perform(request, fe.ctx)
    return fe, info.value


def answer_at_head(reply: Reply, then: str = "wait") -> Any:
    """Read the request head only, send ``reply`` (or raw bytes), then ``then``: wait without
    reading the body, close, or reset."""

    async def script(peer: Peer) -> None:
        if await peer.read_head() is None:
            return
        if isinstance(reply, bytes):
            await peer.send_raw(reply)
        else:
            await peer.respond(reply)
        if then == "reset":
            await peer.reset()
        elif then == "close":
            await peer.close()
        else:
            await trio.sleep_forever()

    return script


def assert_rejected_413(fe: FakeEngine, res: RemoteResult, client: HttpClient) -> None:
    assert res.outcome is Outcome.REJECTED and res.code is Code.REMOTE_REJECTED
    assert res.facts["status"] == 413 and fe.body == b"too large"
    # The body was never written whole: no send_body, and the connection is not pooled.
    assert fe.events[-4:] == ["send_headers", "response_headers", "body", "end"]
    assert fe.facts_of("response_headers")[0]["request_body_cut"] is True
    assert fe.machine.state == "framing_complete"
    assert client.idle_connections() == 0


async def test_plain_origin_answering_413_at_the_head_is_rejected(client: HttpClient) -> None:
    async with HostileServer.running(answer_at_head(TOO_LARGE)) as srv:
        fe, res = await perform(client, req(srv.url + "/upload"))
    assert_rejected_413(fe, res, client)
    assert srv.requests[0].complete is False


async def test_tls_origin_answering_413_at_the_head_is_rejected(
    client: HttpClient, tls: TlsFixture
) -> None:
    async with HostileServer.running(answer_at_head(TOO_LARGE), tls=tls.good) as srv:
        fe, res = await perform(client, req(srv.url + "/upload", ca_file=tls.ca_file))
    assert_rejected_413(fe, res, client)


async def test_unwatched_write_failing_drains_the_complete_answer(
    client: HttpClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No reader beside the write: the answer is found by the drain after the write broke (the
    # origin reset after answering).  A short body's write timing out under the hop's own
    # deadline is drained too (tests/http/test_early_refusal_written_whole.py).
    monkeypatch.setattr(exchange_module, "WATCH_FROM", len(BIG) + 1024)
    async with HostileServer.running(answer_at_head(TOO_LARGE, "reset")) as srv:
        fe, res = await perform(client, req(srv.url + "/upload", write=0.5))
    assert_rejected_413(fe, res, client)


@pytest.mark.parametrize("then", ["close", "wait"])
async def test_partial_head_then_nothing_stays_unknown(client: HttpClient, then: str) -> None:
    script = answer_at_head(b"HTTP/1.1 413 Payload Too", then)  # type: ignore[arg-type]
    async with HostileServer.running(script) as srv:
        fe, exc = await interrupted(client, req(srv.url + "/upload", write=0.5))
    assert exc.code is Code.REMOTE_OUTCOME_UNKNOWN and exc.facts["during"] == "write"
    assert fe.events[-2:] == ["send_headers", "timed_out" if then == "wait" else "transport_error"]
    assert exc.facts["response_bytes"] == 0


@pytest.mark.parametrize(
    "reply",
    [Reply(200, body=b"accepted"), Reply(307, headers=[("Location", "/elsewhere")], body=b"")],
    ids=["200", "307"],
)
async def test_complete_2xx_3xx_at_the_head_keeps_writing_the_body(
    client: HttpClient, reply: Reply
) -> None:
    # RFC 9112 §9.5 is about an answer showing the body is not wanted: a complete 2xx/3xx at
    # the head stops the reader, not the write (an origin may answer first and read on).
    async def script(peer: Peer) -> None:
        rec = await peer.read_head()
        assert rec is not None
        await peer.respond(reply)
        await peer.read_body(rec)  # keeps reading the body to its end
        peer.server.event("read").set()
        await trio.sleep_forever()

    async with HostileServer.running(script) as srv:
        fe, res = await perform(client, req(srv.url + "/upload", follow_redirects=False))
        with trio.fail_after(10):
            await srv.event("read").wait()
    assert srv.requests[0].complete is True and len(srv.requests[0].body) == len(BIG)
    assert res.facts["status"] == reply.status
    ev = fe.events
    assert ev.index("send_headers") + 1 == ev.index("send_body") < ev.index("response_headers")
    assert ev[-1] == "end" and "request_body_cut" not in fe.facts_of("response_headers")[0]


async def test_complete_200_then_a_broken_write_is_concluded_from_the_answer(
    client: HttpClient,
) -> None:
    # The 200 was complete before the write broke: it answers the hop (as the drain does),
    # and the response head says the body was cut.
    async with HostileServer.running(answer_at_head(Reply(200, body=b"ok"), "reset")) as srv:
        fe, res = await perform(client, req(srv.url + "/upload"))
    assert res.outcome is Outcome.COMMITTED and fe.body == b"ok"
    assert fe.events[-4:] == ["send_headers", "response_headers", "body", "end"]
    assert fe.facts_of("response_headers")[0]["request_body_cut"] is True
    assert client.idle_connections() == 0


async def test_100_continue_during_the_write_changes_nothing(client: HttpClient) -> None:
    async def script(peer: Peer) -> None:
        rec = await peer.read_head()
        assert rec is not None
        await peer.respond(Reply(100))
        await peer.read_body(rec)
        peer.server.event("read").set()
        await peer.close()  # never a final response

    async with HostileServer.running(script) as srv:
        fe, exc = await interrupted(client, req(srv.url + "/upload"))
    assert srv.requests[0].complete is True and len(srv.requests[0].body) == len(BIG)
    assert exc.code is Code.REMOTE_OUTCOME_UNKNOWN
    assert fe.events[-4:] == ["send_headers", "send_body", "informational", "peer_closed"]


async def test_cancelled_during_the_watched_write_is_named_as_a_cancellation(
    client: HttpClient,
) -> None:
    async def script(peer: Peer) -> None:
        await peer.read_head()
        await trio.sleep_forever()  # reads nothing: the write stalls

    fe = FakeEngine()
    async with HostileServer.running(script) as srv:
        with trio.move_on_after(0.3) as scope:
            await client.perform(req(srv.url + "/upload", write=5.0), fe.ctx)
    assert scope.cancelled_caught
    assert fe.events[-2:] == ["send_headers", "cancelled"]
    assert fe.facts_of("cancelled")[0]["local_error"] == "Cancelled"
