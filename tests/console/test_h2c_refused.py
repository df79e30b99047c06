"""The console speaks HTTP/1.1 only (``server._H11Only``): hypercorn would otherwise switch a
connection to HTTP/2 in clear -- on the prior-knowledge preface or on ``Upgrade: h2c`` --
where the request-head limit (431 over ``CONSOLE_MAX_HEAD``) bounds no header block and one
connection, the unit of ``ConsoleCap``'s per-uid share, carries many requests at once.  Each
is answered 400 and closed, over a raw loopback socket, and the connection's place is free
again; an HTTP/1.1 request is still served (and one before the preface on its connection)."""

from __future__ import annotations

import contextlib
import logging
import ssl
from pathlib import Path
from typing import Any

import pytest
import trio
import trustme

from tests.broker.helpers import TOKEN_ENV
from tests.daemon.kit import wait_until

from .test_connections import PROMPTLY, daemon_with_console, to_the_end

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # an empty SETTINGS frame (RFC 9113 §6.5)
# Three streams' HEADERS would follow; the refusal comes before any frame is read.


def _upgrade(port: int, method: bytes = b"GET", body: bytes = b"") -> bytes:
    length = b"Content-Length: %d\r\n" % len(body) if body else b""
    return (
        b"%s /login HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: Upgrade, HTTP2-Settings\r\n"
        b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n%s\r\n%s"
        % (method, port, length, body)
    )


@pytest.mark.parametrize(
    "opening",
    [
        "preface",
        "preface after a request",
        "upgrade",
        "upgrade with a body",
    ],
)
async def test_the_console_refuses_http2_in_clear(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, opening: str
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)
    async with daemon_with_console(tmp_path, monkeypatch) as (_, cap, port):
        plain = b"GET /login HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % port
        sent = {
            "preface": PREFACE + SETTINGS,
            "preface after a request": plain + PREFACE + SETTINGS,
            "upgrade": _upgrade(port),
            "upgrade with a body": _upgrade(port, b"POST", b"token=abc"),
        }[opening]
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(sent)
        answer = await to_the_end(stream)
        await stream.aclose()
        if opening == "preface after a request":  # the first is served, then the refusal
            first, _, answer = answer.partition(b"</html>")
            assert first.startswith(b"HTTP/1.1 200 "), first[:200]
        assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
        assert b"101 Switching" not in answer and b"upgrade: h2c" not in answer.lower()
        assert answer.endswith(b"\r\n\r\n")  # nothing after the 400's head: no HTTP/2 frame
        await wait_until(lambda: cap.open == 0, "its place is free")
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(plain.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
        assert (await to_the_end(stream)).startswith(b"HTTP/1.1 200 ")
        await stream.aclose()


async def test_a_connection_that_chose_http2_in_tls_is_closed_never_answered_in_http1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The console is served over plain TCP (TLS is its proxy's).  Were a stream with TLS ever
    handed to it, and the client chose h2 in ALPN, hypercorn's HTTP/2 has sent its SETTINGS
    before the first byte is read: the connection is closed and the mistake logged, never
    answered with an HTTP/1.1 400 after an HTTP/2 frame."""
    from hypercorn.trio.worker_context import WorkerContext

    from affidavit.console import Console, TokenStore
    from affidavit.daemon.server import console_http_config, serve_console_stream
    from tests.broker.helpers import http_target, open_broker

    from .kit import operator_config

    ca = trustme.CA()
    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_side)
    server_side.set_alpn_protocols(["h2", "http/1.1"])
    client_side = ssl.create_default_context()
    ca.configure_trust(client_side)
    client_side.set_alpn_protocols(["h2"])
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    async with open_broker(path) as b, trio.open_nursery() as nursery:
        [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listener.socket.getsockname()[1]
        origin = f"http://127.0.0.1:{port}"

        async def read(view: Any) -> Any:
            return view(b.journal)

        console = Console(b, read, TokenStore(tmp_path / "tokens"), origin=origin)
        config, context = console_http_config(), WorkerContext(None)

        async def connection(stream: trio.SocketStream) -> None:
            tls = trio.SSLStream(stream, server_side, server_side=True)
            await serve_console_stream(console, config, context, tls)

        await nursery.start(trio.serve_listeners, connection, [listener])
        with caplog.at_level(logging.ERROR, logger="affidavit.daemon"):
            client = await trio.open_ssl_over_tcp_stream("127.0.0.1", port, ssl_context=client_side)
            await client.do_handshake()
            assert client.selected_alpn_protocol() == "h2"
            await client.send_all(PREFACE + SETTINGS)
            data = b""
            with trio.move_on_after(PROMPTLY) as waited:
                with contextlib.suppress(trio.BrokenResourceError):
                    while chunk := await client.receive_some(1 << 16):
                        data += chunk
            await trio.aclose_forcefully(client)
        nursery.cancel_scope.cancel()
    assert b"HTTP/1.1" not in data, data[:200]
    assert not waited.cancelled_caught, "the connection was not closed"
    assert any("not HTTP/1.1" in r.getMessage() for r in caplog.records), caplog.text
