"""Responses an HTTP/1.1 exchange cannot complete from: the peer switched protocols (a 2xx to
CONNECT, a 101 to an Upgrade), or framed its body faultily (Transfer-Encoding beside
Content-Length, RFC 9112 §6.3 item 3; Transfer-Encoding in HTTP/1.0, §6.1).  Each ends
``malformed`` -> ``closed_early`` at its head: dispatched, so ``unknown``, never a result, and
the connection is never pooled.  A HEAD, 204 or 304 answer carrying Transfer-Encoding completes
but is not pooled either.

Audit 48b #4: h11 answers ``PAUSED`` after a switch and never an end of message; the driver
read on, on a socket its peer had closed (each read ``b""`` at once) -- 100% CPU until the
deadline.  The driver's read count is the bound checked here, not time.  Audit 48b #5: h11 lets
chunked win over Content-Length, and the response was committed whole.

The broker-level rows (the journal's record of each) are in
tests/broker/test_http_framing_refused.py."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from affidavit.adapters.base import AttemptInterrupted
from affidavit.adapters.http import HTTP_TABLE, FramingError, HttpClient, HttpExchange
from affidavit.adapters.http.connect import Connection
from affidavit.statemachine import Code, ProtocolMachine

from .fakes import FakeEngine
from .hostile import HostileServer, Peer, Reply
from .test_rows import req

TE_CL = (
    b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"2\r\nok\r\n0\r\n\r\n"
)


def _sent(method: str, headers: list[tuple[str, str]] | None = None) -> HttpExchange:
    ex = HttpExchange(ProtocolMachine(HTTP_TABLE))
    ex.setup("resolve")
    ex.setup("connect")
    ex.start_request(method, "/x", [("Host", "example"), *(headers or [])], has_body=False)
    ex.body_bytes(b"")
    ex.body_written()
    return ex


# -- the sans-IO core --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "headers", "answer", "fired"),
    [
        ("CONNECT", [], b"HTTP/1.1 200 Connection Established\r\n\r\n", "response_headers"),
        ("CONNECT", [], b"HTTP/1.1 204 No Content\r\n\r\ntunnel bytes", "response_headers"),
        (
            "GET",
            [("Connection", "upgrade"), ("Upgrade", "websocket")],
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n",
            "informational",
        ),
        # Not asked to upgrade: h11 itself refuses the 101 (RemoteProtocolError).
        ("GET", [], b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n", None),
    ],
    ids=["2xx-to-connect", "2xx-to-connect-then-tunnel-bytes", "101-to-an-upgrade", "101-unasked"],
)
def test_a_switch_of_protocols_ends_the_exchange_malformed_at_its_head(
    method: str, headers: list[tuple[str, str]], answer: bytes, fired: str | None
) -> None:
    """No HTTP/1.1 end of message can follow a switch: the read that brought it ends the
    exchange -- with the stream still open too (a peer holding the tunnel would otherwise keep
    the read loop, and h11's buffer, going until the deadline)."""
    ex = _sent(method, headers)
    with pytest.raises(FramingError) as info:
        ex.receive(answer)
    events = [o.step.event for o in info.value.observations]
    assert events == ([fired] if fired else []) + ["malformed"]
    assert ex.machine.state == "closed_early" and ex.machine.dispatched
    assert not ex.machine.complete and not ex.reusable
    reason = answer.split(b"\r\n")[0].split(b" ", 2)[2].decode()
    assert reason not in str(info.value)  # names the problem, not the peer's words


def test_an_end_of_stream_the_core_did_not_end_on_is_malformed_not_more_to_come(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bound under the switch rule: were a paused parser let through (the rule taken out
    here), the read that returns the end of stream still ends the exchange -- no byte can come
    after it, so a driver reading again would spin."""
    monkeypatch.setattr(HttpExchange, "_refuse_paused", lambda self, out: None)
    ex = _sent("CONNECT")
    assert [o.step.event for o in ex.receive(b"HTTP/1.1 200 OK\r\n\r\n")] == ["response_headers"]
    with pytest.raises(FramingError) as info:
        ex.receive(b"")
    assert [o.step.event for o in info.value.observations] == ["malformed"]
    assert ex.machine.state == "closed_early" and str(info.value) == (
        "end of stream with the response unfinished"
    )


TE_CL_MESSAGE = "response framed by both Transfer-Encoding and Content-Length"
TE_1_0_MESSAGE = "HTTP/1.0 response framed by Transfer-Encoding"


@pytest.mark.parametrize(
    ("head", "message"),
    [
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n",
            TE_CL_MESSAGE,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTRANSFER-ENCODING: chunked\r\ncontent-length: 2\r\n\r\n",
            TE_CL_MESSAGE,
        ),
        (
            b"HTTP/1.1 500 X\r\nTransfer-Encoding: chunked\r\nContent-Length: 0\r\n\r\n",
            TE_CL_MESSAGE,
        ),
        # RFC 9112 §6.1: Transfer-Encoding in an HTTP/1.0 message is faulty framing, with or
        # without a Content-Length (h11 reads it chunked).
        (b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", TE_1_0_MESSAGE),
        (
            b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n",
            TE_1_0_MESSAGE,
        ),
    ],
    ids=["cl-then-te", "te-then-cl-any-case", "an-error-status", "te-in-1.0", "te-cl-in-1.0"],
)
def test_faulty_framing_is_malformed_once_the_driver_has_seen_the_head(
    head: bytes, message: str
) -> None:
    """RFC 9112 §6.3 item 3: such a message "ought to be handled as an error" (h11 lets chunked
    win).  The head is returned and recorded -- its field names show why -- nothing past it
    (the driver decides on the head first: a refusal at it wins); ``faulty_framing`` then ends
    the exchange ``malformed``; the chunked body after the head, however whole, is never read
    as a result."""
    ex = _sent("POST")
    [head_obs] = ex.receive(head + b"2\r\nok\r\n0\r\n\r\n")
    assert head_obs.step.event == "response_headers"
    assert "transfer-encoding" in set(head_obs.facts["header_names"])
    assert ex.framing_fault == message
    with pytest.raises(FramingError) as info:
        ex.faulty_framing()
    [abort] = info.value.observations
    assert str(info.value) == message
    assert abort.step.event == "malformed" and ex.machine.state == "closed_early"
    assert ex.response_started and not ex.reusable and ex.body_bytes_received == 0


def test_a_well_framed_head_leaves_nothing_for_faulty_framing() -> None:
    ex = _sent("GET")
    ex.receive(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    assert ex.framing_fault is None
    ex.faulty_framing()  # returns
    assert ex.machine.complete and ex.reusable


@pytest.mark.parametrize(
    ("method", "status", "fields"),
    [
        ("HEAD", 200, "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n"),
        ("GET", 304, "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n"),
        ("GET", 204, "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n"),
        ("HEAD", 200, "Transfer-Encoding: chunked\r\n"),
        ("GET", 204, "Transfer-Encoding: chunked\r\n"),
    ],
    ids=["head", "304", "204", "head-te", "204-te"],
)
def test_transfer_encoding_on_a_response_without_a_body_completes_but_is_not_pooled(
    method: str, status: int, fields: str
) -> None:
    """§6.3's item 1 comes first: a HEAD response, a 204 or a 304 ends at its head whatever its
    fields say, so they frame nothing and are no conflict (a HEAD answer carries the fields its
    GET would): complete.  But §6.1 forbids Transfer-Encoding in a 204 (a 304's or a HEAD
    answer's names the coding its GET would have had): a peer sending it there may frame what
    follows otherwise than h11 reads it, so the connection is not pooled."""
    ex = _sent(method)
    head = f"HTTP/1.1 {status} X\r\n{fields}\r\n"
    assert [o.step.event for o in ex.receive(head.encode())][-1] == "end"
    assert ex.machine.complete and ex.unpoolable and not ex.reusable


@pytest.mark.parametrize(
    ("method", "status"), [("HEAD", 200), ("GET", 304), ("GET", 204)], ids=["head", "304", "204"]
)
def test_a_response_without_a_body_or_transfer_encoding_is_pooled(method: str, status: int) -> None:
    ex = _sent(method)
    assert [o.step.event for o in ex.receive(f"HTTP/1.1 {status} X\r\n\r\n".encode())][-1] == (
        "end"
    )
    assert ex.machine.complete and ex.reusable


# -- the driver: reads counted -----------------------------------------------------------------


def _counting_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    reads: list[int] = []
    original = Connection.receive_some

    async def counted(self: Connection, size: int) -> bytes:
        data = await original(self, size)
        reads.append(len(data))
        return data

    monkeypatch.setattr(Connection, "receive_some", counted)
    return reads


def _answers(raw: bytes, *, then: str) -> Any:
    async def script(peer: Peer) -> None:
        await peer.read_request()
        await peer.send_raw(raw)
        if then == "hold":
            await trio.sleep(30)  # the client closes first; the server stops it at the end
        await peer.close()

    return script


@pytest.mark.parametrize(
    ("raw", "then"),
    [
        (b"HTTP/1.1 200 Connection Established\r\n\r\n", "close"),
        (b"HTTP/1.1 200 Connection Established\r\n\r\nraw tunnel bytes", "hold"),
    ],
    ids=["peer-closes", "peer-holds-the-tunnel"],
)
async def test_a_2xx_to_connect_ends_the_hop_without_reading_on(
    client: HttpClient, monkeypatch: pytest.MonkeyPatch, raw: bytes, then: str
) -> None:
    """Before: the read loop took h11's ``PAUSED`` for "more to come" and read the closed
    socket again and again (~1e5 reads a second) until the read timeout, or, with the tunnel
    held, waited for it.  Now the head's read ends the hop: ``unknown``, the result
    incomplete."""
    reads = _counting_reads(monkeypatch)
    async with HostileServer.running(_answers(raw, then=then)) as srv:
        fe = FakeEngine()
        with trio.fail_after(10), pytest.raises(AttemptInterrupted) as info:
            await client.perform(req(srv.url + "/x", "CONNECT"), fe.ctx)
    assert fe.events[-2:] == ["response_headers", "malformed"]
    assert fe.machine.state == "closed_early" and fe.machine.dispatched
    assert info.value.code is Code.REMOTE_RESULT_INCOMPLETE
    assert len(reads) == 1, reads  # the head's read alone: not one more


TE_1_0 = b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"


@pytest.mark.parametrize("raw", [TE_CL, TE_1_0], ids=["te-and-cl", "te-in-1.0"])
async def test_a_chunked_body_beside_a_content_length_is_never_a_result(
    client: HttpClient, raw: bytes
) -> None:
    async def script(peer: Peer) -> None:
        while await peer.read_request() is not None:
            await peer.send_raw(raw)

    async with HostileServer.running(script) as srv:
        for _ in range(2):
            fe = FakeEngine()
            with trio.fail_after(10), pytest.raises(AttemptInterrupted) as info:
                await client.perform(req(srv.url + "/x", "POST", b"{}"), fe.ctx)
            assert info.value.code is Code.REMOTE_RESULT_INCOMPLETE
            assert fe.events[-1] == "malformed" and fe.body == b""
    # The connection it came on is closed, never pooled: the second call opened its own.
    assert srv.connections == 2


@pytest.mark.parametrize(
    ("method", "raw"),
    [
        ("GET", b"HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n"),
        ("HEAD", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 9\r\n\r\n"),
        ("GET", None),
    ],
    ids=["204-te", "head-te-cl", "204-plain"],
)
async def test_an_answer_without_a_body_carrying_transfer_encoding_completes_unpooled(
    client: HttpClient, method: str, raw: bytes | None
) -> None:
    """The answer is the result (RFC 9112 §6.3 item 1: it ends at its head), but its peer sent
    a field §6.1 forbids there: the next call opens a connection of its own.  A plain 204 is
    pooled (the control row: the server's h11 writes it, and reads the next request)."""

    async def script(peer: Peer) -> None:
        while await peer.read_request() is not None:
            if raw is None:
                await peer.respond(Reply(204))
            else:
                await peer.send_raw(raw)

    async with HostileServer.running(script) as srv:
        for _ in range(2):
            fe = FakeEngine()
            with trio.fail_after(10):
                await client.perform(req(srv.url + "/x", method), fe.ctx)
            assert fe.machine.complete and fe.events[-1] == "end"
    assert srv.connections == (1 if raw is None else 2)
