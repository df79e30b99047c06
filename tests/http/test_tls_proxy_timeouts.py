"""Real TLS with a test CA, proxies on the success path, and per-phase timeouts."""

from __future__ import annotations

import hashlib
import ssl
from collections.abc import Iterable
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from affidavit.adapters.base import AttemptInterrupted, SetupError
from affidavit.adapters.http import HttpClient, HttpRequest, Timeouts
from affidavit.statemachine import Code, Outcome

from .fakes import FakeEngine
from .hostile import HostileServer, Peer, Reply, TlsFixture, scripts


def req(url: str, method: str = "GET", body: bytes = b"", **kw: Any) -> HttpRequest:
    kw.setdefault("timeouts", Timeouts(connect=2.0, write=2.0, read=2.0))
    return HttpRequest(method, url, [("Authorization", "Bearer tok-abcdef")], body, **kw)


def leaf_sha256(tls: TlsFixture) -> str:
    pem = tls.good.cert_chain_pems[0].bytes().decode()
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem)).hexdigest()


async def test_tls_with_test_ca_succeeds_and_binds_the_verified_peer(
    client: HttpClient, tls: TlsFixture
) -> None:
    async with HostileServer.running(
        scripts.serve(Reply(200, body=b"secure")), tls=tls.good
    ) as srv:
        fe = FakeEngine()
        with trio.fail_after(10):
            res = await client.perform(req(srv.url + "/", ca_file=tls.ca_file), fe.ctx)
        fe2 = FakeEngine()
        with trio.fail_after(10):
            await client.perform(req(srv.url + "/again", ca_file=tls.ca_file), fe2.ctx)
    assert res.outcome is Outcome.COMMITTED and fe.body == b"secure"
    assert fe.events[:3] == ["resolve", "connect", "tls"]
    peer = fe.gates[0]["peer"]
    assert peer["verified_hostname"] == "127.0.0.1" and peer["trust"] == "ca_file"
    assert peer["cert_sha256"] == leaf_sha256(tls)
    assert peer["tls_version"] in {"TLSv1.2", "TLSv1.3"} and peer["cipher"]
    assert res.facts["peer"] == peer
    # A pooled TLS connection carries its verified identity into the next action's evidence.
    assert fe2.gates[0]["reused_connection"] is True and fe2.gates[0]["peer"] == peer


async def test_https_through_connect_tunnel(client: HttpClient, tls: TlsFixture) -> None:
    async with (
        HostileServer.running(scripts.serve(Reply(200, body=b"tunnelled")), tls=tls.good) as origin,
        HostileServer.running(scripts.connect_proxy()) as proxy,
    ):
        fe = FakeEngine()
        with trio.fail_after(10):
            res = await client.perform(
                req(origin.url + "/t", ca_file=tls.ca_file, proxy=proxy.url), fe.ctx
            )
    assert res.outcome is Outcome.COMMITTED and fe.body == b"tunnelled"
    assert fe.events[:4] == ["resolve", "connect", "tunnel", "tls"]
    assert fe.gates[0]["via_proxy"] == proxy.hostport
    assert fe.gates[0]["origin"] == origin.origin
    assert [r.method for r in proxy.requests] == ["CONNECT"]
    assert proxy.requests[0].target == origin.hostport
    # Only the origin saw the request (and the credential), end-to-end inside TLS.
    assert origin.requests[0].header("authorization") == "Bearer tok-abcdef"


# -- per-phase timeouts ---------------------------------------------------------------------------
# On trio's fake clock: the deadlines are trio's and every peer is a task in this trio run.


class HangingResolver(trio.abc.HostnameResolver):
    async def getaddrinfo(
        self,
        host: bytes | None,
        port: bytes | str | int | None,
        family: int = 0,
        type: int = 0,
        proto: int = 0,
        flags: int = 0,
    ) -> list[Any]:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async def getnameinfo(self, sockaddr: tuple[Any, ...], flags: int) -> tuple[str, str]:
        raise NotImplementedError


async def test_dns_timeout_is_connect_timeout_at_dns(
    client: HttpClient, autojump_clock: MockClock
) -> None:
    trio.socket.set_custom_hostname_resolver(HangingResolver())
    try:
        fe = FakeEngine()
        with trio.fail_after(5), pytest.raises(SetupError) as info:
            await client.perform(
                req("http://slow-dns.example/", timeouts=Timeouts(connect=0.2)), fe.ctx
            )
    finally:
        trio.socket.set_custom_hostname_resolver(None)
    assert (info.value.code, info.value.stage) == (Code.CONNECT_TIMEOUT, "dns")
    assert fe.gates == []


async def test_tls_handshake_timeout_is_connect_timeout(
    client: HttpClient, tls: TlsFixture, autojump_clock: MockClock
) -> None:
    # The CA file is read in a worker thread before the connect: a clock jumping as soon as
    # every task waits would pass the test's own 5 s guard while that read runs.
    autojump_clock.autojump_threshold = 0.1
    async with HostileServer.running(scripts.silent()) as srv:
        fe = FakeEngine()
        with trio.fail_after(5), pytest.raises(SetupError) as info:
            await client.perform(
                req(
                    f"https://{srv.hostport}/", ca_file=tls.ca_file, timeouts=Timeouts(connect=0.2)
                ),
                fe.ctx,
            )
    assert (info.value.code, info.value.stage) == (Code.CONNECT_TIMEOUT, "tls_handshake")
    assert fe.gates == [] and not fe.machine.dispatched


async def test_read_timeout_before_response_is_unknown(
    client: HttpClient, autojump_clock: MockClock
) -> None:
    async with HostileServer.running(scripts.slow(3.0)) as srv:
        fe = FakeEngine()
        with trio.fail_after(5), pytest.raises(AttemptInterrupted) as info:
            await client.perform(
                req(srv.url + "/", "POST", b"x", timeouts=Timeouts(read=0.2)), fe.ctx
            )
    assert info.value.code is Code.REMOTE_OUTCOME_UNKNOWN
    assert info.value.facts["during"] == "read"
    assert fe.events[-1] == "timed_out" and fe.machine.dispatched


async def test_read_timeout_mid_body_is_incomplete(
    client: HttpClient, autojump_clock: MockClock
) -> None:
    async def stall(peer: Peer) -> None:
        await peer.read_request()
        await peer.send_raw(b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\npartial")
        await trio.sleep_forever()

    async with HostileServer.running(stall) as srv:
        fe = FakeEngine()
        with trio.fail_after(5), pytest.raises(AttemptInterrupted) as info:
            await client.perform(req(srv.url + "/", timeouts=Timeouts(read=0.2)), fe.ctx)
    assert info.value.code is Code.REMOTE_RESULT_INCOMPLETE
    assert info.value.facts["body_bytes"] == 7


async def test_write_timeout_after_dispatch_is_unknown(
    client: HttpClient, autojump_clock: MockClock
) -> None:
    body = b"x" * (32 * 1024 * 1024)  # more than loopback socket buffers hold
    async with HostileServer.running(scripts.silent()) as srv:
        fe = FakeEngine()
        with trio.fail_after(10), pytest.raises(AttemptInterrupted) as info:
            await client.perform(
                req(srv.url + "/", "PUT", body, timeouts=Timeouts(write=0.3)), fe.ctx
            )
    assert info.value.code is Code.REMOTE_OUTCOME_UNKNOWN
    assert info.value.facts["during"] == "write"
    assert "send_body" not in fe.events and fe.events[-1] == "timed_out"


async def test_expect_continue_sends_body_after_100(client: HttpClient) -> None:
    async def cont(peer: Peer) -> None:
        rec = await peer.read_head()
        assert rec is not None
        await peer.respond(Reply(100))
        await peer.read_body(rec)
        await peer.respond(Reply(201, body=b"made"))

    async with HostileServer.running(cont) as srv:
        fe = FakeEngine()
        with trio.fail_after(5):
            res = await client.perform(
                req(srv.url + "/", "PUT", b"payload", expect_continue=True), fe.ctx
            )
    assert res.facts["status"] == 201 and srv.requests[0].body == b"payload"
    assert _order(fe.events, ["send_headers", "informational", "send_body", "response_headers"])


async def test_expect_continue_early_final_response_skips_the_body(client: HttpClient) -> None:
    async def refuse(peer: Peer) -> None:
        await peer.read_head()
        await peer.respond(Reply(401, body=b"no"))

    async with HostileServer.running(refuse) as srv:
        fe = FakeEngine()
        with trio.fail_after(5):
            res = await client.perform(
                req(srv.url + "/", "PUT", b"payload", expect_continue=True), fe.ctx
            )
    assert res.outcome is Outcome.REJECTED and "send_body" not in fe.events
    assert client.idle_connections() == 0  # h11 still owes a body: not reusable


def _order(events: Iterable[str], wanted: list[str]) -> bool:
    it = iter(events)
    return all(any(e == w for e in it) for w in wanted)


async def test_expect_continue_wait_never_cancels_the_sink(client: HttpClient) -> None:
    """The bounded wait for ``100 Continue`` bounds the *peer's* silence only: a final response
    read inside it is handed to the sink outside that timer.  A sink that blocks past it (the
    journal's back-pressure) must get every byte, or the attempt must fail -- never a complete
    result whose body the sink was cancelled out of."""
    body = b"result-bytes-" * 100

    async def answer_at_once(peer: Peer) -> None:
        await peer.read_head()
        await peer.respond(Reply(200, body=body))

    class SlowSink(FakeEngine):
        async def _sink(self, stream: str, data: bytes) -> None:
            await trio.sleep(1.5)  # longer than EXPECT_CONTINUE_WAIT
            await super()._sink(stream, data)

    async with HostileServer.running(answer_at_once) as srv:
        fe = SlowSink()
        with trio.fail_after(10):
            res = await client.perform(
                req(srv.url + "/", "PUT", b"payload", expect_continue=True), fe.ctx
            )
    assert res.outcome is Outcome.COMMITTED and res.facts["body_bytes"] == len(body)
    assert fe.body == body
    assert fe.body == body
    assert fe.events[-1] == "end"
