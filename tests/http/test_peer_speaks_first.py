"""A fresh connection's peer that speaks before the request is written gives no answer to it.

Bytes waiting when the first request byte is about to go were sent before the request existed
on the wire; read as its answer, a server that never parsed the request would pass for one that
committed it.  Over TLS only application data counts: a TLS 1.3 server's session tickets, sent
right after the handshake, are no answer and refuse nothing.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import h11
import pytest
import trio

from affidavit.adapters.base import SetupError
from affidavit.adapters.http import HttpClient
from affidavit.adapters.http.connect import Connection
from affidavit.statemachine import Outcome

from .fakes import FakeEngine
from .hostile import HostileServer, Peer, TlsFixture
from .test_tls_proxy_timeouts import req

UNSOLICITED = b'HTTP/1.1 201 Created\r\nContent-Length: 13\r\n\r\n{"id":"fake"}'


@pytest.mark.parametrize("over_tls", [False, True], ids=["plain", "tls"])
async def test_bytes_the_peer_sent_first_are_never_the_answer_and_nothing_is_written(
    client: HttpClient, tls: TlsFixture, over_tls: bool
) -> None:
    """The peer answers ``201 Created`` as soon as it accepts (after the handshake, over TLS)
    and would record a request if one came.  The gate waits until those bytes reached the
    client's socket: the request is not written, the connection is dropped -- a setup failure
    at stage ``peer_spoke_first``, the machine never dispatched."""

    async def script(peer: Peer) -> None:
        await peer.send_raw(UNSOLICITED)
        peer.server.event("sent").set()
        await peer.read_request()  # records a request if one were written
        await trio.sleep(1)

    ca = {"ca_file": tls.ca_file} if over_tls else {}
    async with HostileServer.running(script, tls=tls.good if over_tls else None) as srv:

        async def during_gate(facts: Mapping[str, Any]) -> None:
            await srv.event("sent").wait()
            await trio.sleep(0.1)  # let the bytes reach the client's socket

        fe = FakeEngine(on_gate=during_gate)
        with trio.fail_after(10), pytest.raises(SetupError) as info:
            await client.perform(req(srv.url + "/pay", "POST", b"x", **ca), fe.ctx)
        await trio.sleep(0.1)
    assert info.value.stage == "peer_spoke_first"
    assert fe.gates[0]["reused_connection"] is False
    assert not fe.machine.dispatched and fe.machine.state == "setup_failed"
    assert fe.body == b"" and srv.requests == [] and srv.connections == 1
    assert client.idle_connections() == 0


@contextlib.contextmanager
def ticketing_server(tls: TlsFixture) -> Iterator[tuple[int, threading.Event, list[int]]]:
    """A plain blocking stdlib TLS 1.3 server (one connection, every wait bounded): OpenSSL
    sends its session tickets right after the handshake, before the client writes anything
    (trio's own server holds them back until its first write).  Yields its port, an event set
    once the handshake is done and the number of tickets the server's context issues."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    tls.good.configure_cert(ctx)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)
    shaken = threading.Event()

    def serve() -> None:
        with contextlib.suppress(OSError):
            raw, _ = listener.accept()
            raw.settimeout(10)
            with ctx.wrap_socket(raw, server_side=True) as conn:
                shaken.set()
                h = h11.Connection(h11.SERVER)
                ev: Any = h11.NEED_DATA
                while type(ev) is not h11.EndOfMessage:
                    if ev is h11.NEED_DATA:
                        h.receive_data(conn.recv(65536))
                    elif type(ev) not in (h11.Request, h11.Data):
                        return  # the client closed without a whole request
                    ev = h.next_event()
                out = h.send(h11.Response(status_code=200, headers=[("Content-Length", "2")]))
                out = (out or b"") + (h.send(h11.Data(data=b"ok")) or b"")
                conn.sendall(out + (h.send(h11.EndOfMessage()) or b""))
                conn.recv(1)  # until the client closes (or the timeout)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], shaken, [ctx.num_tickets]
    finally:
        listener.close()
        thread.join(15)


async def test_tls13_session_tickets_after_the_handshake_refuse_nothing(
    client: HttpClient, tls: TlsFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tickets wait on the client's socket when the request is about to be written (the
    gate holds 0.2 s after the server's handshake ended; the bytes queued are recorded at the
    check): they are TLS handshake messages, not an answer, and the call completes as with any
    server."""
    queued: list[int] = []
    check = Connection.unread_bytes

    async def recorded(conn: Connection, connect_timeout: float) -> bool:
        queued.append(conn._queued())
        return await check(conn, connect_timeout)

    monkeypatch.setattr(Connection, "unread_bytes", recorded)
    with ticketing_server(tls) as (port, shaken, tickets):

        async def during_gate(facts: Mapping[str, Any]) -> None:
            await trio.to_thread.run_sync(shaken.wait, 10)
            await trio.sleep(0.2)

        fe = FakeEngine(on_gate=during_gate)
        url = f"https://127.0.0.1:{port}/ok"
        with trio.fail_after(10):
            res = await client.perform(req(url, "POST", b"x", ca_file=tls.ca_file), fe.ctx)
        await client.aclose()  # the server's last recv returns
    assert tickets[0] > 0 and len(queued) == 1 and queued[0] > 0  # really waiting at the check
    assert fe.gates[0]["peer"]["tls_version"] == "TLSv1.3"
    assert res.outcome is Outcome.COMMITTED and res.facts["status"] == 200 and fe.body == b"ok"
