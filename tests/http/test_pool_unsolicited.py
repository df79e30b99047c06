"""A pooled connection is one the peer left silent: nothing read past its last response."""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import Any

import pytest
import trio

from affidavit.adapters.base import SetupError
from affidavit.adapters.http import HttpClient

from .fakes import FakeEngine
from .hostile import HostileServer, Peer, Reply, TlsFixture
from .test_tls_proxy_timeouts import req


async def test_bytes_after_a_response_keep_the_connection_out_of_the_pool(
    client: HttpClient,
) -> None:
    """Bytes the peer sent after a complete response, taken off the socket by the same read,
    sit in h11's buffer where ``looks_stale``'s poll of the socket cannot see them: pooled,
    they would be parsed as the next request's "response" -- sent before it was written."""
    first = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst"
    unsolicited = b"HTTP/1.1 201 Created\r\nContent-Length: 4\r\n\r\nfake"

    async def script(peer: Peer) -> None:
        await peer.read_request()
        await peer.send_raw(first + unsolicited)  # one write: one read takes both
        if await peer.stream.receive_some(65536):  # a request on the reused connection
            await peer.send_raw(b"HTTP/1.1 202 Accepted\r\nContent-Length: 4\r\n\r\nreal")
        await trio.sleep(1)

    async with HostileServer.running(script) as srv:
        with trio.fail_after(10):
            fe1 = FakeEngine()
            await client.perform(req(srv.url + "/a", "POST", b"x"), fe1.ctx)
            fe2 = FakeEngine()
            res = await client.perform(req(srv.url + "/b", "POST", b"y"), fe2.ctx)
    assert fe1.body == b"first"
    # The second request's answer is never the one sent before it was written.
    # A fresh connection (the first was not pooled), answered by the script from its start.
    assert fe2.facts_of("reuse") == [] and srv.connections == 2
    assert res.facts["status"] == 200 and fe2.body == b"first"


async def test_tls_records_after_a_response_keep_the_connection_out_of_the_pool(
    client: HttpClient, tls: TlsFixture
) -> None:
    """Over TLS the unsolicited response's record may come off the socket with the last record
    of the real one: it then sits in the TLS layer (decrypted, or still in trio's incoming BIO),
    invisible both to h11's buffer and to ``looks_stale``'s poll of the socket."""
    first = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst"
    unsolicited = b"HTTP/1.1 201 Created\r\nContent-Length: 4\r\n\r\nfake"

    async def script(peer: Peer) -> None:
        await peer.read_request()
        s = peer.sock.socket
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)  # both records in one segment
        await peer.send_raw(first)
        await peer.send_raw(unsolicited)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)
        if await peer._recv():  # a request on the reused connection
            await peer.send_raw(b"HTTP/1.1 202 Accepted\r\nContent-Length: 4\r\n\r\nreal")
        await trio.sleep(1)

    async with HostileServer.running(script, tls=tls.good) as srv:
        with trio.fail_after(10):
            fe1 = FakeEngine()
            await client.perform(req(srv.url + "/a", "POST", b"x", ca_file=tls.ca_file), fe1.ctx)
            assert fe1.body == b"first"
            # Not pooled at all: the stored record would have answered the next request.
            assert client.idle_connections() == 0
            await trio.sleep(0.1)
            fe2 = FakeEngine()
            res = await client.perform(
                req(srv.url + "/b", "POST", b"y", ca_file=tls.ca_file), fe2.ctx
            )
    assert fe2.facts_of("reuse") == [] and srv.connections == 2
    assert res.facts["status"] == 200 and fe2.body == b"first"


@pytest.mark.parametrize("over_tls", [False, True], ids=["plain", "tls"])
async def test_bytes_arriving_during_the_gate_are_never_the_reused_requests_answer(
    client: HttpClient, tls: TlsFixture, over_tls: bool
) -> None:
    """The pool found the connection silent, then the gate (a durable journal write) took its
    time and the peer sent a response meanwhile: it was sent before the request, so the request
    is not written at all; nothing written is a setup failure (the engine, holding its own
    DISPATCH_STARTED, still answers ``unknown``)."""
    unsolicited = b"HTTP/1.1 201 Created\r\nContent-Length: 4\r\n\r\nfake"

    async def script(peer: Peer) -> None:
        await peer.read_request()
        await peer.respond(Reply(200, body=b"first"))
        await peer.server.event("gate").wait()
        await peer.send_raw(unsolicited)
        peer.server.event("sent").set()
        await peer.read_request()  # records a request if one were written
        await trio.sleep(1)

    ca = {"ca_file": tls.ca_file} if over_tls else {}
    async with HostileServer.running(script, tls=tls.good if over_tls else None) as srv:

        async def during_gate(facts: Mapping[str, Any]) -> None:
            srv.event("gate").set()
            await srv.event("sent").wait()
            await trio.sleep(0.1)  # let the bytes reach the client's socket

        with trio.fail_after(10):
            fe1 = FakeEngine()
            await client.perform(req(srv.url + "/a", "POST", b"x", **ca), fe1.ctx)
            fe2 = FakeEngine(on_gate=during_gate)
            with pytest.raises(SetupError) as info:
                await client.perform(req(srv.url + "/b", "POST", b"y", **ca), fe2.ctx)
            await trio.sleep(0.1)
    assert info.value.stage == "reused_connection"
    assert fe2.gates[0]["reused_connection"] is True
    assert not fe2.machine.dispatched and fe2.machine.state == "setup_failed"
    assert fe2.body == b"" and [r.target for r in srv.requests] == ["/a"]
    assert client.idle_connections() == 0
