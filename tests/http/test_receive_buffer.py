"""h11's receive buffer that hands a body read over uncopied (adapters/http/receive_buffer.py):
the events a client connection yields are h11's own, byte for byte, however the response is
split into reads -- and a read taken whole is the buffer itself, not a copy (issue 15)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h11
from hypothesis import given, settings
from hypothesis import strategies as st

from affidavit.adapters.http import HTTP_TABLE, HttpExchange
from affidavit.adapters.http.receive_buffer import client_connection
from affidavit.statemachine import ProtocolMachine


def _client(conn: h11.Connection, method: bytes = b"GET") -> h11.Connection:
    conn.send(h11.Request(method=method, target="/", headers=[("Host", "a")]))
    conn.send(h11.EndOfMessage())
    return conn


def _events(conn: h11.Connection, reads: list[bytes]) -> list[Any]:
    """Every event (as comparable values) and the error that ended the stream, if any."""
    out: list[Any] = []
    for data in reads:
        try:
            conn.receive_data(data)
        except RuntimeError as e:
            out.append(("receive", str(e)))
            return out
        while True:
            try:
                ev = conn.next_event()
            except h11.RemoteProtocolError as e:
                out.append(("error", str(e)))
                return out
            if ev is h11.NEED_DATA or ev is h11.PAUSED:
                out.append(ev)
                break
            if type(ev) is h11.ConnectionClosed:
                out.append(ev)
                return out
            if type(ev) is h11.Data:
                out.append(("data", type(ev.data), bytes(ev.data)))
            else:
                out.append(ev)
            if type(ev) is h11.EndOfMessage and conn.their_state is h11.DONE:
                out.append(("trailing", bytes(conn.trailing_data[0])))
    return out


def _chunked(body: bytes, cuts: list[int]) -> bytes:
    out, pos = b"", 0
    for cut in sorted({c % (len(body) + 1) for c in cuts} | {len(body)}):
        if cut > pos:
            out += b"%x\r\n" % (cut - pos) + body[pos:cut] + b"\r\n"
            pos = cut
    return out + b"0\r\n\r\n"


@st.composite
def _responses(draw: st.DrawFn) -> tuple[bytes, list[bytes]]:
    body = draw(st.binary(max_size=600))
    framing = draw(st.sampled_from(["length", "short", "chunked", "close"]))
    if framing == "chunked":
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        wire = head + _chunked(body, draw(st.lists(st.integers(0, 600), max_size=5)))
    elif framing == "close":
        wire = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body
    else:
        declared = len(body) + (draw(st.integers(1, 50)) if framing == "short" else 0)
        wire = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % declared + body
    wire = draw(st.sampled_from([b"", b"HTTP/1.1 100 Continue\r\n\r\n"])) + wire
    wire += draw(st.sampled_from([b"", b"HTTP/1.1 204 No Content\r\n\r\n", b"junk\r\n"]))
    cuts = sorted(draw(st.lists(st.integers(0, len(wire)), max_size=12)))
    reads = [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True)]
    reads = [r for r in reads if r]
    if draw(st.booleans()):
        reads.append(b"")  # EOF
    return wire, reads


@settings(max_examples=400, deadline=None)
@given(_responses())
def test_the_events_are_h11s_own_however_the_response_is_read(
    resp: tuple[bytes, list[bytes]],
) -> None:
    _wire, reads = resp
    stock = _events(_client(h11.Connection(h11.CLIENT)), reads)
    taking = _events(_client(client_connection()), reads)
    assert taking == stock


def test_a_body_read_taken_whole_is_the_buffer_itself() -> None:
    conn = _client(client_connection())
    conn.receive_data(b"HTTP/1.1 200 OK\r\nContent-Length: 2000000\r\n\r\n")
    assert type(conn.next_event()) is h11.Response
    assert conn.next_event() is h11.NEED_DATA
    for _ in range(3):
        conn.receive_data(b"x" * 65536)
        held = conn._receive_buffer._data
        ev = conn.next_event()
        assert type(ev) is h11.Data and ev.data is held and len(held) == 65536
        assert not conn._receive_buffer and conn._receive_buffer._data is not held


def test_the_exchange_hands_a_body_read_on_uncopied() -> None:
    m = ProtocolMachine(HTTP_TABLE)
    ex = HttpExchange(m)
    ex.setup("resolve")
    ex.setup("connect")
    ex.start_request("GET", "/", [("Host", "a")], has_body=False)
    ex.body_written()
    obs = ex.receive(b"HTTP/1.1 200 OK\r\nContent-Length: 200000\r\n\r\n", piecewise=True)
    assert [o.step.event for o in obs] == ["response_headers"]
    body = b"".join(bytes([i]) * 1000 for i in range(200))
    got = b""
    for cut in (0, 65536, 131072):
        read = body[cut : cut + 65536]
        ex.conn.receive_data(read)
        held = ex.conn._receive_buffer._data
        (piece,) = ex._pull(True)
        assert piece.data is held and piece.data == read  # the buffer itself, not a copy
        got += bytes(piece.data)
    (piece,) = ex.receive(body[196608:], piecewise=True)
    got += bytes(piece.data)
    assert got == body and [o.step.event for o in ex.more()] == ["end"]
    assert m.complete


def test_the_connections_use_it() -> None:
    assert type(HttpExchange(ProtocolMachine(HTTP_TABLE)).conn._receive_buffer) is type(
        client_connection()._receive_buffer
    )
    assert type(client_connection()._receive_buffer) is not type(
        h11.Connection(h11.CLIENT)._receive_buffer
    )
    assert "h11=client_connection()" in (
        Path(__file__).resolve().parents[2] / "adapters" / "http" / "connect.py"
    ).read_text(encoding="utf-8")
