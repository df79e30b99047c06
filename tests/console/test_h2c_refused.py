"""The console speaks HTTP/1.1 only (``server._H11Only``): hypercorn would otherwise switch a
connection to HTTP/2 in clear -- on the prior-knowledge preface or on ``Upgrade: h2c`` --
where the request-head limit (431 over ``CONSOLE_MAX_HEAD``) bounds no header block and one
connection, the unit of ``ConsoleCap``'s per-uid share, carries many requests at once.  Each
is answered 400 and closed, over a raw loopback socket, and the connection's place is free
again; an HTTP/1.1 request is still served (and one before the preface on its connection)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.broker.helpers import TOKEN_ENV
from tests.daemon.kit import wait_until

from .test_connections import daemon_with_console, to_the_end

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
