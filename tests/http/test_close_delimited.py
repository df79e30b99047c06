"""A response body delimited by the connection's close (RFC 9112 §6.3 item 8: no
Transfer-Encoding, no Content-Length) is complete only if the end of the stream is authentic.
TLS's ``close_notify`` is; a TCP FIN is not -- a crashed server or a middlebox cutting the
stream sends the same FIN -- so over plain TCP (and through a forward proxy) such a body is
``REMOTE_RESULT_INCOMPLETE``, as it already was over TLS without ``close_notify``."""

from __future__ import annotations

import h11
import pytest
import trio

from affidavit.adapters.base import AttemptInterrupted
from affidavit.adapters.http import HttpClient
from affidavit.adapters.http.machine import _body_framing
from affidavit.statemachine import Code

from .fakes import FakeEngine
from .hostile import HostileServer, Peer, Script, TlsFixture
from .test_tls_proxy_timeouts import req

CUT = b'{"items":[1,2,3]}'  # the peer meant '{"items":[1,2,3,4,5]}' and stopped


def _cut_after(head: bytes, *, close_notify: bool = False) -> Script:
    async def script(peer: Peer) -> None:
        await peer.read_request()
        await peer.send_raw(head + CUT)
        if close_notify:
            await peer.stream.aclose()  # an SSLStream's aclose sends close_notify
        else:
            await peer.close()  # a FIN (over TLS: no close_notify)

    return script


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n",
    ],
    ids=["http10", "http11-no-length"],
)
async def test_close_delimited_body_ended_by_a_fin_is_incomplete(
    client: HttpClient, head: bytes
) -> None:
    async with HostileServer.running(_cut_after(head)) as srv:
        fe = FakeEngine()
        with trio.fail_after(10), pytest.raises(AttemptInterrupted) as info:
            await client.perform(req(srv.url + "/a", "POST", b"x"), fe.ctx)
    err = info.value
    assert err.code is Code.REMOTE_RESULT_INCOMPLETE
    assert fe.machine.dispatched and not fe.machine.complete
    assert fe.machine.state == "closed_early" and fe.events[-1] == "peer_closed"
    # The bytes that came stay what they were: streamed chunks, never a result.
    assert fe.body == CUT and err.facts["body_bytes"] == len(CUT)
    assert client.idle_connections() == 0


async def test_close_delimited_body_through_a_forward_proxy_is_incomplete(
    client: HttpClient,
) -> None:
    """The forward proxy's FIN proves no more than the origin's would."""
    head = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n"
    async with HostileServer.running(_cut_after(head)) as proxy:
        fe = FakeEngine()
        with trio.fail_after(10), pytest.raises(AttemptInterrupted) as info:
            await client.perform(
                req("http://origin.invalid/a", "POST", b"x", proxy=proxy.url), fe.ctx
            )
    assert info.value.code is Code.REMOTE_RESULT_INCOMPLETE
    assert fe.machine.state == "closed_early" and fe.body == CUT


async def test_close_delimited_body_over_tls_without_close_notify_is_incomplete(
    client: HttpClient, tls: TlsFixture
) -> None:
    head = b"HTTP/1.0 200 OK\r\n\r\n"
    async with HostileServer.running(_cut_after(head), tls=tls.good) as srv:
        fe = FakeEngine()
        with trio.fail_after(10), pytest.raises(AttemptInterrupted) as info:
            await client.perform(req(srv.url + "/a", "POST", b"x", ca_file=tls.ca_file), fe.ctx)
    assert info.value.code is Code.REMOTE_RESULT_INCOMPLETE
    assert fe.machine.state == "closed_early" and fe.body == CUT


async def test_close_delimited_body_ended_by_close_notify_is_complete(
    client: HttpClient, tls: TlsFixture
) -> None:
    """TLS's authenticated close is the protocol-specific close that proves completion."""
    head = b"HTTP/1.0 200 OK\r\n\r\n"
    script = _cut_after(head, close_notify=True)
    async with HostileServer.running(script, tls=tls.good) as srv:
        fe = FakeEngine()
        with trio.fail_after(10):
            res = await client.perform(
                req(srv.url + "/a", "POST", b"x", ca_file=tls.ca_file), fe.ctx
            )
    assert fe.machine.complete and fe.machine.state == "framing_complete"
    assert res.facts["status"] == 200 and fe.body == CUT
    assert res.summary["http_version"] == "1.0"


async def test_the_reported_http_version_is_the_responses(client: HttpClient) -> None:
    async def script(peer: Peer) -> None:
        await peer.read_request()
        await peer.send_raw(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await peer.close()

    async with HostileServer.running(script) as srv:
        fe = FakeEngine()
        with trio.fail_after(10):
            res = await client.perform(req(srv.url + "/a"), fe.ctx)
    assert res.summary["http_version"] == "1.0" and fe.body == b"ok"


@pytest.mark.parametrize(
    ("headers", "method", "status", "want"),
    [
        ([("Content-Length", "3")], "GET", 200, "framed"),
        ([("CONTENT-LENGTH", "0")], "GET", 200, "framed"),
        ([("Transfer-Encoding", "chunked")], "GET", 200, "framed"),
        ([("Content-Type", "text/plain")], "GET", 200, "close"),
        ([], "GET", 200, "close"),
        ([], "HEAD", 200, "none"),
        ([], "GET", 204, "none"),
        ([], "CONNECT", 200, "none"),
        ([("transfer-encoding", "chunked"), ("Content-length", "2")], "GET", 200, "conflict"),
        # RFC 9112 §6.1: no Transfer-Encoding in a 204 -- complete, never pooled (``unpoolable``)
        ([("Transfer-Encoding", "chunked"), ("Content-Length", "2")], "HEAD", 200, "none_te"),
        ([("transfer-encoding", "chunked")], "GET", 204, "none_te"),
        ([("Transfer-Encoding", "chunked")], "GET", 304, "none_te"),
    ],
)
def test_body_framing_reads_framing_headers_in_any_case(
    headers: list[tuple[str, str]], method: str, status: int, want: str
) -> None:
    """The framing headers are found whatever case the peer wrote them in (the check reads
    h11's raw names and lower-cases them itself), as h11 frames the body."""
    ev = h11.Response(status_code=status, headers=headers)
    assert _body_framing(method, ev) == want


@pytest.mark.parametrize(
    ("headers", "want"),
    [
        ([("Transfer-Encoding", "chunked")], "te_in_1_0"),
        ([("Transfer-Encoding", "chunked"), ("Content-Length", "2")], "te_in_1_0"),
        ([("Content-Length", "2")], "framed"),
        ([], "close"),
    ],
)
def test_body_framing_of_an_http_1_0_response_with_transfer_encoding_is_faulty(
    headers: list[tuple[str, str]], want: str
) -> None:
    """RFC 9112 §6.1: "If a message is received with ... Transfer-Encoding ... [in] HTTP/1.0,
    the client MUST treat [the framing] as faulty", even with a Content-Length."""
    ev = h11.Response(status_code=200, headers=headers, http_version=b"1.0")
    assert _body_framing("GET", ev) == want
