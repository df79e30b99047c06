"""A scripted, hostile HTTP/1.1 peer on 127.0.0.1 for driver, engine and broker tests.

Reusable API (the lead's engine/broker tests use it too)::

    from tests.http.hostile import HostileServer, Reply, scripts, make_tls

    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        srv.url            # "http://127.0.0.1:<port>" (https:// when started with tls=...)
        srv.origin         # "http://127.0.0.1:<port>"
        srv.requests       # [Received(method, target, headers, body, connection, complete)]
        srv.connections    # number of TCP connections accepted
        srv.tls_failures   # TLS handshakes that failed (e.g. the client rejected the cert)
        srv.event("name")  # a trio.Event shared by scripts and tests (created on first use)

* ``HostileServer.running(script, tls=None)`` — an async context manager; ``script`` is an
  ``async def script(peer: Peer) -> None`` run once per accepted connection (the connection is
  closed when it returns).  ``tls`` is a ``trustme.LeafCert`` (see ``make_tls``).
* ``Peer`` (one accepted connection): ``index`` (0-based connection number),
  ``await read_request()`` (a whole request or None at EOF; recorded in ``srv.requests``),
  ``await read_head()`` (head only — for ``Expect: 100-continue`` scripts; recorded with
  ``complete=False``), ``await respond(Reply)``, ``await send_raw(bytes)``, ``await close()``
  (FIN), ``await reset()`` (RST via SO_LINGER 0), ``await relay_forever(other_stream)``.
* ``Reply(status, headers=(), body=b"", chunked=False, delay=0.0, reason=b"")``.
* ``scripts``: ready-made hostile behaviours, each a function returning a script:
  ``serve(reply | fn(req) -> Reply)`` (keep-alive loop), ``apply_then_close()``,
  ``cut_mid_headers()``, ``cut_mid_body(chunked=False)``, ``close_delimited_cut()``,
  ``malformed()``, ``endless(framing, encoding=None, cap=32 MiB, moved=None)`` (a 200 whose
  body runs on: ``srv.body_sent`` counts it, ``srv.event("cut")`` is set once the client closed
  on it),
  ``continue_then_close()``, ``informational_then(statuses, final=None)``,
  ``stall_mid_body(partial)``,
  ``error_after_commit(status=500)``, ``slow(delay, reply)``,
  ``silent()`` (accepts, never reads nor writes), ``held(reply=None)`` (reads the request, sets
  ``srv.event("received")``, answers once ``srv.event("release")`` is set, or never),
  ``keep_alive_then_reset(trigger="reset")`` (serves one request, waits for
  ``srv.event(trigger)``, answers with RST and sets ``srv.event(trigger + ".done")``),
  ``keep_alive_then_close()`` (serves one request, closes the idle connection, sets
  ``srv.event("idle_closed")``), ``redirect(location, status=307)``,
  ``connect_proxy(refuse=None, proxy_status=None)`` (CONNECT tunnel; ``refuse=403`` answers
  that status instead), ``forward_proxy(error=None, proxy_status=None, relayed_marker=True)``
  (forwards absolute-form requests to the origin; ``error=502`` answers its own error).
* ``unresponsive_listener()`` — an async context manager yielding a port whose accept queue is
  full, so a TCP connect to it hangs (for connect timeouts).
* ``make_tls(tmp_path)`` -> ``TlsFixture(ca_file, good, wrong_host)``: a trustme CA written to
  ``ca_file`` and leaf certificates for 127.0.0.1 and for ``wrong.example``.

Every wait inside is bounded by the test's own ``trio.fail_after``; the server never touches
anything but loopback sockets.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import ssl
import struct
import urllib.parse
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h11
import trio
import trustme

__all__ = [
    "HostileServer",
    "Peer",
    "Received",
    "Reply",
    "TlsFixture",
    "make_tls",
    "scripts",
    "unresponsive_listener",
]


@dataclass
class Received:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes
    connection: int
    complete: bool = True

    def header(self, name: str) -> str | None:
        for n, v in self.headers:
            if n.lower() == name.lower():
                return v
        return None


@dataclass
class Reply:
    status: int = 200
    headers: Sequence[tuple[str, str]] = ()
    body: bytes = b""
    chunked: bool = False
    delay: float = 0.0
    reason: bytes = b""


Script = Callable[["Peer"], Awaitable[None]]


class Peer:
    """One accepted connection, seen from the hostile server."""

    def __init__(
        self, server: HostileServer, index: int, stream: trio.abc.Stream, sock: trio.SocketStream
    ):
        self.server = server
        self.index = index
        self.stream = stream
        self.sock = sock
        self.h11 = h11.Connection(h11.SERVER)

    async def _recv(self) -> bytes:
        try:
            return bytes(await self.stream.receive_some(65536))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return b""

    async def _next(self) -> Any:
        while True:
            ev = self.h11.next_event()
            if ev is h11.NEED_DATA:
                self.h11.receive_data(await self._recv())
                continue
            return ev

    async def read_head(self) -> Received | None:
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
        try:
            ev = await self._next()
        except h11.RemoteProtocolError:
            return None
        if not isinstance(ev, h11.Request):
            return None
        rec = Received(
            method=ev.method.decode(),
            target=ev.target.decode(),
            headers=[(n.decode("latin-1"), v.decode("latin-1")) for n, v in ev.headers.raw_items()],
            body=b"",
            connection=self.index,
            complete=False,
        )
        self.server.requests.append(rec)
        return rec

    async def read_body(self, rec: Received) -> Received:
        try:
            while True:
                ev = await self._next()
                if isinstance(ev, h11.Data):
                    rec.body += bytes(ev.data)
                elif isinstance(ev, h11.EndOfMessage):
                    rec.complete = True
                    return rec
                else:
                    return rec
        except h11.RemoteProtocolError:
            return rec

    async def read_request(self) -> Received | None:
        rec = await self.read_head()
        if rec is None:
            return None
        return await self.read_body(rec)

    async def respond(self, reply: Reply) -> None:
        if reply.delay:
            await trio.sleep(reply.delay)
        headers = list(reply.headers)
        names = {n.lower() for n, _ in headers}
        if reply.chunked:
            headers.append(("Transfer-Encoding", "chunked"))
        elif "content-length" not in names and reply.status >= 200:
            headers.append(("Content-Length", str(len(reply.body))))
        ev: Any
        if reply.status < 200:
            ev = h11.InformationalResponse(status_code=reply.status, headers=headers)
            await self.send_raw(self.h11.send(ev) or b"")
            return
        ev = h11.Response(status_code=reply.status, headers=headers, reason=reply.reason)
        out = self.h11.send(ev) or b""
        if reply.body:
            out += self.h11.send(h11.Data(data=reply.body)) or b""
        out += self.h11.send(h11.EndOfMessage()) or b""
        await self.send_raw(out)

    async def send_raw(self, data: bytes) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await self.stream.send_all(data)

    async def close(self) -> None:
        await trio.aclose_forcefully(self.stream)

    async def reset(self) -> None:
        """Abort with a TCP RST (SO_LINGER 0), so the client's next write or read fails."""
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.socket.close()

    async def relay_forever(self, other: trio.abc.Stream, pending: bytes = b"") -> None:
        """Splice this connection and ``other`` until either side closes."""

        async def pump(src: trio.abc.Stream, dst: trio.abc.Stream) -> None:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                while True:
                    data = await src.receive_some(65536)
                    if not data:
                        break
                    await dst.send_all(data)
            await trio.aclose_forcefully(dst)

        try:
            if pending:
                await other.send_all(pending)
            async with trio.open_nursery() as n:
                n.start_soon(pump, self.stream, other)
                n.start_soon(pump, other, self.stream)
        finally:
            await trio.aclose_forcefully(other)


class HostileServer:
    def __init__(self, script: Script, tls: trustme.LeafCert | None = None) -> None:
        self.script = script
        self.tls = tls
        self.requests: list[Received] = []
        self.connections = 0
        self.tls_failures = 0
        self.body_sent = 0
        """Body bytes ``scripts.endless`` handed to the socket, over every connection."""
        self.port = 0
        self._events: dict[str, trio.Event] = {}
        self._ssl: ssl.SSLContext | None = None
        if tls is not None:
            self._ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            tls.configure_cert(self._ssl)

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def origin(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return self.origin

    @property
    def hostport(self) -> str:
        return f"127.0.0.1:{self.port}"

    def event(self, name: str) -> trio.Event:
        if name not in self._events:
            self._events[name] = trio.Event()
        return self._events[name]

    @classmethod
    @contextlib.asynccontextmanager
    async def running(
        cls, script: Script, *, tls: trustme.LeafCert | None = None
    ) -> AsyncIterator[HostileServer]:
        srv = cls(script, tls)
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                functools.partial(trio.serve_tcp, srv._handle, 0, host="127.0.0.1")
            )
            srv.port = listeners[0].socket.getsockname()[1]
            try:
                yield srv
            finally:
                nursery.cancel_scope.cancel()

    async def _handle(self, sock: trio.SocketStream) -> None:
        index = self.connections
        self.connections += 1
        stream: trio.abc.Stream = sock
        try:
            if self._ssl is not None:
                tls = trio.SSLStream(sock, self._ssl, server_side=True)
                try:
                    await tls.do_handshake()
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self.tls_failures += 1
                    return
                stream = tls
            await self.script(Peer(self, index, stream, sock))
        finally:
            await trio.aclose_forcefully(stream)


# -- ready-made scripts ---------------------------------------------------------------------------


class scripts:
    @staticmethod
    def serve(reply: Reply | Callable[[Received], Reply]) -> Script:
        """Answer every request on the connection (keep-alive) until the client closes."""

        async def script(peer: Peer) -> None:
            while True:
                req = await peer.read_request()
                if req is None:
                    return
                await peer.respond(reply(req) if callable(reply) else reply)
                if peer.h11.our_state is not h11.DONE or peer.h11.their_state is not h11.DONE:
                    return

        return script

    @staticmethod
    def apply_then_close() -> Script:
        """Read the whole request (the 'effect' is applied), then close without answering."""

        async def script(peer: Peer) -> None:
            if await peer.read_request() is not None:
                peer.server.event("applied").set()
            await peer.close()

        return script

    @staticmethod
    def endless(
        framing: str = "chunked",
        *,
        encoding: str | None = None,
        cap: int = 32 << 20,
        moved: str | None = None,
        location: str | None = None,
    ) -> Script:
        """Answer the first request with a 200 whose body runs past any limit: ``framing``
        ``"length"`` (a Content-Length of 1 TiB), ``"chunked"`` (chunks without end) or
        ``"close"`` (HTTP/1.0, no length: the body runs to the close).  ``encoding``: its
        Content-Encoding; ``"gzip"`` sends a gzip stream of barely compressible text, any other
        name the text as it is.  At most ``cap`` bytes of body are sent, then
        the script waits (a bounded server even against a broker without a limit); a send that
        fails -- the client closed the connection -- sets ``srv.event("cut")``.  ``moved``: a
        request for another target is first answered 307 to ``moved`` (keep-alive).
        ``location``: the endless answer is a 307 to it, not a 200."""
        assert framing in ("length", "chunked", "close")

        async def script(peer: Peer) -> None:
            while True:
                req = await peer.read_request()
                if req is None:
                    return
                if moved is None or req.target == moved:
                    break
                await peer.respond(Reply(307, headers=[("Location", moved)], body=b"moved"))
            version = b"HTTP/1.0" if framing == "close" else b"HTTP/1.1"
            head = version + b" 200 OK\r\nContent-Type: text/plain\r\n"
            if location is not None:
                head = version + b" 307 Moved\r\nLocation: %s\r\n" % location.encode()
            if framing == "length":
                head += b"Content-Length: %d\r\n" % (1 << 40)
            elif framing == "chunked":
                head += b"Transfer-Encoding: chunked\r\n"
            if encoding is not None:
                head += b"Content-Encoding: %s\r\n" % encoding.encode()
            coder = zlib.compressobj(wbits=31) if encoding == "gzip" else None
            text = b"".join(b"%08d %s\n" % (i, bytes(range(97, 123))) for i in range(1900))
            try:
                await peer.stream.send_all(head + b"\r\n")
                while peer.server.body_sent < cap:
                    body = text
                    if coder is not None:
                        # Hex of random bytes: gzip gets it to about half.
                        body = coder.compress(os.urandom(len(text) // 2).hex().encode())
                        body += coder.flush(zlib.Z_SYNC_FLUSH)
                    wire = b"%x\r\n%s\r\n" % (len(body), body) if framing == "chunked" else body
                    await peer.stream.send_all(wire)
                    peer.server.body_sent += len(body)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                peer.server.event("cut").set()
                return
            await peer.server.event("release").wait()

        return script

    @staticmethod
    def cut_mid_headers() -> Script:
        async def script(peer: Peer) -> None:
            await peer.read_request()
            await peer.send_raw(b"HTTP/1.1 200 OK\r\nContent-Type: text/pl")
            await peer.close()

        return script

    @staticmethod
    def cut_mid_body(*, chunked: bool = False) -> Script:
        async def script(peer: Peer) -> None:
            await peer.read_request()
            if chunked:
                await peer.send_raw(
                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n8\r\npart"
                )
            else:
                await peer.send_raw(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"partial":')
            await peer.close()

        return script

    @staticmethod
    def close_delimited_cut() -> Script:
        """An HTTP/1.0 answer with no Content-Length (its body runs to the close), cut by a FIN:
        over plain TCP nothing tells it from a complete one."""

        async def script(peer: Peer) -> None:
            await peer.read_request()
            await peer.send_raw(
                b'HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{"items":[1,2'
            )
            await peer.close()

        return script

    @staticmethod
    def malformed() -> Script:
        async def script(peer: Peer) -> None:
            await peer.read_request()
            await peer.send_raw(b"HTTP/1.1 200 OK\r\nContent-Length: twelve\r\n\r\nhello")
            await trio.sleep_forever()

        return script

    @staticmethod
    def continue_then_close() -> Script:
        async def script(peer: Peer) -> None:
            await peer.read_head()
            await peer.respond(Reply(100))
            await peer.close()

        return script

    @staticmethod
    def informational_then(statuses: tuple[int, ...], final: Reply | None = None) -> Script:
        """Read the whole request, send the interim ``statuses`` (1xx, e.g. 102, 103), then
        ``final`` -- or, without one, close: no final response ever comes."""

        async def script(peer: Peer) -> None:
            if await peer.read_request() is None:
                return
            for status in statuses:
                await peer.respond(Reply(status, headers=[("Link", "</a.css>; rel=preload")]))
            if final is None:
                await peer.close()
            else:
                await peer.respond(final)

        return script

    @staticmethod
    def stall_mid_body(partial: bytes = b'{"id":"pay_') -> Script:
        """Read the request, send a 200's head promising 1000 bytes and ``partial`` of them,
        then stall with the connection open (the caller's deadline is what ends the call)."""

        async def script(peer: Peer) -> None:
            if await peer.read_request() is None:
                return
            await peer.send_raw(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + partial)
            await trio.sleep_forever()

        return script

    @staticmethod
    def error_after_commit(status: int = 500) -> Script:
        async def script(peer: Peer) -> None:
            if await peer.read_request() is not None:
                peer.server.event("applied").set()
                await peer.respond(Reply(status, body=b'{"error":"after commit"}'))

        return script

    @staticmethod
    def slow(delay: float, reply: Reply | None = None) -> Script:
        async def script(peer: Peer) -> None:
            if await peer.read_request() is not None:
                await trio.sleep(delay)
                await peer.respond(reply or Reply(200, body=b"late"))

        return script

    @staticmethod
    def held(reply: Reply | None = None) -> Script:
        """Read the whole request, set ``srv.event("received")``, then answer ``reply`` once the
        test sets ``srv.event("release")`` -- or never, when ``reply`` is None."""

        async def script(peer: Peer) -> None:
            if await peer.read_request() is None:
                return
            peer.server.event("received").set()
            if reply is None:
                await trio.sleep_forever()
            await peer.server.event("release").wait()
            await peer.respond(reply)

        return script

    @staticmethod
    def silent() -> Script:
        async def script(peer: Peer) -> None:
            await trio.sleep_forever()

        return script

    @staticmethod
    def keep_alive_then_close() -> Script:
        async def script(peer: Peer) -> None:
            if await peer.read_request() is not None:
                await peer.respond(Reply(200, body=b"first"))
            await peer.close()
            peer.server.event("idle_closed").set()

        return script

    @staticmethod
    def keep_alive_then_reset(trigger: str = "reset") -> Script:
        """First connection: answer one request with keep-alive, then wait for ``trigger`` and
        reset the idle connection.  Later connections: plain ``serve``."""

        async def script(peer: Peer) -> None:
            if peer.index > 0:
                await scripts.serve(Reply(200, body=b"fresh"))(peer)
                return
            if await peer.read_request() is not None:
                await peer.respond(Reply(200, body=b"first"))
            await peer.server.event(trigger).wait()
            await peer.reset()
            peer.server.event(trigger + ".done").set()

        return script

    @staticmethod
    def redirect(location: str, status: int = 307, *, body: bytes = b"moved") -> Script:
        return scripts.serve(Reply(status, headers=[("Location", location)], body=body))

    @staticmethod
    def connect_proxy(*, refuse: int | None = None, proxy_status: str | None = None) -> Script:
        async def script(peer: Peer) -> None:
            req = await peer.read_request()
            if req is None:
                return
            extra = [("Proxy-Status", proxy_status)] if proxy_status else []
            if refuse is not None or req.method != "CONNECT":
                await peer.respond(Reply(refuse or 405, headers=extra, body=b"no tunnel"))
                return
            host, _, port = req.target.rpartition(":")
            upstream = await trio.open_tcp_stream(host.strip("[]"), int(port))
            out = peer.h11.send(h11.Response(status_code=200, headers=[])) or b""
            await peer.send_raw(out)
            pending, _closed = peer.h11.trailing_data
            await peer.relay_forever(upstream, bytes(pending))

        return script

    @staticmethod
    def forward_proxy(
        *, error: int | None = None, proxy_status: str | None = None, relayed_marker: bool = True
    ) -> Script:
        """An HTTP forward proxy.  ``error``: answer that status itself (with ``proxy_status`` as
        its Proxy-Status, if given).  Otherwise forward to the origin and relay its complete
        response, adding ``Proxy-Status: hostile; received-status=N`` when ``relayed_marker``."""

        async def script(peer: Peer) -> None:
            while True:
                req = await peer.read_request()
                if req is None:
                    return
                if error is not None:
                    extra = [("Proxy-Status", proxy_status)] if proxy_status else []
                    await peer.respond(Reply(error, headers=extra, body=b"proxy error"))
                    continue
                u = urllib.parse.urlsplit(req.target)
                assert u.hostname and u.port
                async with await trio.open_tcp_stream(u.hostname, u.port) as up:
                    status, rh, body = await _forward(up, req, u)
                if relayed_marker:
                    rh.append(("Proxy-Status", f"hostile; received-status={status}"))
                await peer.respond(Reply(status, headers=rh, body=body))

        return script


async def _forward(
    up: trio.SocketStream, req: Received, u: urllib.parse.SplitResult
) -> tuple[int, list[tuple[str, str]], bytes]:
    c = h11.Connection(h11.CLIENT)
    pq = u.path + (f"?{u.query}" if u.query else "")
    hdrs = [(n, v) for n, v in req.headers if n.lower() != "content-length"]
    if req.body or req.method in {"POST", "PUT", "PATCH"}:
        hdrs.append(("Content-Length", str(len(req.body))))
    out = c.send(h11.Request(method=req.method, target=pq, headers=hdrs)) or b""
    if req.body:
        out += c.send(h11.Data(data=req.body)) or b""
    out += c.send(h11.EndOfMessage()) or b""
    await up.send_all(out)
    status, rh, body = 0, [], b""
    while True:
        ev = c.next_event()
        if ev is h11.NEED_DATA:
            c.receive_data(bytes(await up.receive_some(65536)))
        elif isinstance(ev, h11.Response):
            status = ev.status_code
            rh = [
                (n.decode(), v.decode())
                for n, v in ev.headers
                if n.lower() not in (b"content-length", b"transfer-encoding")
            ]
        elif isinstance(ev, h11.Data):
            body += bytes(ev.data)
        else:
            break
    return status, rh, body


@contextlib.asynccontextmanager
async def unresponsive_listener() -> AsyncIterator[int]:
    """A listening port whose accept queue is full: further SYNs are dropped, connects hang."""
    lsock = socket.socket()
    filler = socket.socket()
    try:
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(0)
        port = lsock.getsockname()[1]
        filler.connect(("127.0.0.1", port))
        yield port
    finally:
        filler.close()
        lsock.close()


@dataclass
class TlsFixture:
    ca: trustme.CA
    ca_file: str
    good: trustme.LeafCert
    wrong_host: trustme.LeafCert
    extra: dict[str, Any] = field(default_factory=dict)


def make_tls(tmp_path: Path) -> TlsFixture:
    ca = trustme.CA()
    ca_file = tmp_path / "test-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    return TlsFixture(
        ca=ca,
        ca_file=str(ca_file),
        good=ca.issue_cert("127.0.0.1"),
        wrong_host=ca.issue_cert("wrong.example"),
    )
