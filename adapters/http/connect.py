"""Connection setup: DNS, TCP, the proxy's CONNECT tunnel, TLS -- everything before dispatch.

Seed, "Connection setup needs a precise end point": each stage runs under its own
``trio.fail_after(timeouts.connect)`` and names itself (``dns``, ``tcp_connect``,
``proxy_connect``, ``tls_handshake``), so a wrong host name is told apart from a rejected
certificate.  A failure fires ``setup_fail`` on the protocol machine and raises ``SetupError``
(first hop) or ``HopSetupFailed`` (a redirect hop, whose previous 3xx then stands as the result).
No application byte is written here.
"""

from __future__ import annotations

import array
import errno
import fcntl
import hashlib
import logging
import math
import os
import select
import ssl
import termios
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import h11
import trio

from affidavit.adapters.base import AttemptContext, SetupError
from affidavit.statemachine import Code

from .classify import header_value, parse_proxy_status
from .receive_buffer import client_connection
from .request import HttpRequest, Timeouts
from .trust import SYSTEM_STORE_EMPTY, Trust
from .urls import BadUrl, Url, loopback_host, parse_url

__all__ = [
    "LOOPBACK_OFF_MACHINE",
    "READ_SIZE",
    "Connection",
    "HopSetupFailed",
    "PoolKey",
    "check_trio_tls",
    "errno_name",
    "open_connection",
    "setup_failed",
    "step",
]

log = logging.getLogger("affidavit.adapters.http")

READ_SIZE = 65536

LOOPBACK_OFF_MACHINE = (
    "a loopback name resolved to an address off the machine: plain HTTP goes there only "
    "with trust_cleartext"
)

PoolKey = tuple[str, str, int, str | None, str | None]
"""(scheme, host, port, proxy, trust): connections are reused only under the same key.  The
trust is the ``sha256:`` of the CA file's bytes the TLS session was verified with (``Trust``),
None for the system store and for plain HTTP."""


def check_trio_tls(make_stream: Callable[..., object] = trio.SSLStream) -> None:
    """The TLS checks (``Connection.tls_buffered``, ``_tls_application_data``) read trio's
    private ``SSLStream._incoming`` (a ``MemoryBIO``) and ``_ssl_object`` (an ``SSLObject``):
    trio has no public accessor for what its TLS layer holds.  A trio that renamed them would
    make every HTTPS call refuse at the gate (unknown, nothing sent) -- safe but silent.  So
    this runs once, at import (0.15 ms, measured), on a stream never connected, and raises
    ``ImportError`` naming the trio version instead.  (``make_stream``: how a stream is
    made, ``trio.SSLStream`` but in tests.)"""
    probe = make_stream(
        cast("trio.abc.Stream", None),  # never used: nothing is sent or received
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT),
        server_hostname="probe.invalid",
    )
    found = (getattr(probe, "_incoming", None), getattr(probe, "_ssl_object", None))
    if not (isinstance(found[0], ssl.MemoryBIO) and isinstance(found[1], ssl.SSLObject)):
        raise ImportError(
            f"trio {trio.__version__} is not supported by affidavit's HTTP driver: its "
            "SSLStream lacks _incoming (ssl.MemoryBIO) or _ssl_object (ssl.SSLObject), "
            "which the driver reads to tell an unsolicited answer from session tickets "
            "(adapters/http/connect.py); install the trio version the tests pass with"
        )


check_trio_tls()


@dataclass(eq=False)
class Connection:
    id: str
    key: PoolKey
    stream: trio.abc.Stream
    socket_stream: trio.SocketStream
    h11: h11.Connection
    peer: dict[str, Any] | None
    via_proxy: str | None
    forward_proxy: bool
    idle_since: float = 0.0
    idle_limit: float = math.inf
    """How long it may stay idle in the pool and be reused (``pool.idle_limit``)."""
    requests: int = 0
    read_cut: bool = False
    """A TLS read was cancelled (or failed) mid-way and no read has returned data since
    (``receive_some``).  OpenSSL may then hold part of a record in its own buffer, which neither
    ``tls_buffered`` nor the check before a request sees (it frames from a record boundary: an
    empty BIO reads as whole, and the request would be written) -- so such a connection is never
    pooled (``Pool.release``).  A later read that returns data ended that record (``SSL_read``
    returns only a whole record's plaintext; what it keeps of one is ``tls_buffered``'s), and a
    cut plain TCP read leaves nothing behind: neither marks it.  So the expect-continue wait,
    cut on purpose before the response is read whole, does not keep its connection out of the
    pool."""

    async def receive_some(self, size: int) -> bytes:
        """One read from the stream; a TLS one cut short marks the connection (``read_cut``)
        until a read returns data."""
        try:
            data = bytes(await self.stream.receive_some(size))
        except BaseException:  # trio.Cancelled among them
            if self.key[0] == "https":
                self.read_cut = True
            raise
        if data:
            self.read_cut = False
        return data

    def looks_stale(self) -> bool:
        """A pooled connection must be silent while idle.  Readable means EOF, a reset, or bytes
        nobody asked for — any of those makes the next request's fate ambiguous, so the socket is
        discarded *before* the boundary instead (zero-timeout poll, no blocking).  Over TLS the
        bytes may already be off the socket, in the TLS layer's buffers (``tls_buffered``)."""
        if self.tls_buffered():
            return True
        try:
            fd = self.socket_stream.socket.fileno()
            if fd < 0:
                return True
            readable, _w, _x = select.select([fd], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    async def unread_bytes(self, connect_timeout: float) -> bool:
        """Has the peer sent anything nobody asked for that would be read as an answer, or
        said it is done?  Plain TCP: bytes in the socket's receive queue (``FIONREAD``); unlike
        ``looks_stale`` an EOF or a reset is not counted (those end a request written after
        them as ``unknown``, but bytes would be read as its answer).  TLS: anything but a TLS
        1.3 server's session tickets (``_tls_application_data``), sent after the handshake
        (OpenSSL sends them at once) -- a close_notify or an alert included.  Over TLS the
        check decrypts what waits: a connection it answers True for must be dropped (the
        bytes it read are gone).

        A ticket caught half-arrived (the only thing wrong is one last application-data
        record not whole yet: a large stateless ticket, a TLS-terminating proxy merging
        writes) is waited for, up to ``TICKET_PATIENCE`` (never past ``connect_timeout``),
        and the records framed again once more bytes came; still partial then, or the peer
        closed mid-record, it is refused as before."""
        if type(self.stream) is trio.SocketStream or not isinstance(self.stream, trio.SSLStream):
            return self._queued() > 0
        verdict = self._tls_application_data(self.stream)
        if verdict is not _PARTIAL:
            return verdict is _UNREAD
        deadline = trio.current_time() + min(TICKET_PATIENCE, connect_timeout)
        while verdict is _PARTIAL:
            with trio.move_on_at(deadline) as waited:
                await trio.lowlevel.wait_readable(self.socket_stream.socket)
            if waited.cancelled_caught or not self._queued():
                return True  # still partial at the bound, or an EOF (a reset) mid-record
            verdict = self._tls_application_data(self.stream)
        return verdict is _UNREAD

    def _queued(self) -> int:
        """Bytes in the socket's receive queue (``FIONREAD``); 0 for a closed socket."""
        try:
            fd = self.socket_stream.socket.fileno()
            if fd < 0:
                return 0
            buf = array.array("i", [0])
            fcntl.ioctl(fd, termios.FIONREAD, buf, True)
        except (OSError, ValueError):
            return 0
        return buf[0]

    def _tls_application_data(self, stream: trio.SSLStream[trio.abc.Stream]) -> str:
        """Does anything but a TLS 1.3 server's session tickets wait?  The socket's queue is
        moved into trio's incoming BIO (what trio's own read does) and the TLS object asked,
        without blocking, for one byte; only whole records that give none (tickets, a key
        update: consumed there as a read would) let the request be written (``_CLEAN``).

        ``_PARTIAL``: whole application-data records but for the last, not whole yet -- left
        in the BIO unread by OpenSSL, to be framed again from the start once more arrived
        (``unread_bytes``).  Counted as unread (``_UNREAD``: refused, nothing written),
        besides application data:

        * a record not of the one outer type a record after a TLS 1.3 handshake has, or
          longer than one may be (``_framing``) -- its kind is unknown until it is whole, and
          OpenSSL moves a partial record's bytes out of the BIO into its own buffer (``pending``
          is 0 after the read), so the records are framed here before OpenSSL sees them.  TLS
          1.2 sends no tickets after the handshake (RFC 5077 §3.3: before the server's
          Finished): its renegotiation request (type 22) and alerts (21) are refused here, its
          application data by the read;
        * a close_notify (``b""``), an alert or a record that fails (``SSLError``): the peer is
          done -- a request written to it proves nothing, and a pooled connection whose
          keep-alive ran out during the gate is the common case;
        * a stream whose TLS layer cannot be inspected: dropped rather than maybe lied to.

        The records are framed from a record boundary: trio's handshake and reads leave
        OpenSSL at one (it takes a record's bytes only once it needs that record)."""
        try:
            incoming, tls = stream._incoming, stream._ssl_object  # trio's (``check_trio_tls``)
            data = incoming.read()
            queued = self._queued()
            if queued:
                data += os.read(self.socket_stream.socket.fileno(), queued)
            incoming.write(data)
            framing = _framing(data)
            if framing is not _CLEAN:
                return framing
            tls.read(1)  # b"" (close_notify) or a byte of application data
        except ssl.SSLWantReadError:
            return _CLEAN  # nothing pending, or only whole records without application data
        except (AttributeError, OSError, ValueError):  # ssl.SSLError among them
            return _UNREAD
        return _UNREAD

    def tls_buffered(self) -> bool:
        """Bytes the TLS layer holds that nobody has read: decrypted (``SSLObject.pending``) or
        still encrypted in trio's incoming memory BIO.  A read that took a response's last
        record off the socket may have taken the records behind it too (an unsolicited
        response, an alert); the socket's readability no longer shows them, and a reused
        connection would read them as the next request's answer.  A TLS stream whose buffers
        cannot be inspected counts as holding bytes: never reused rather than maybe lied to."""
        stream = self.stream
        # A plain TCP stream is no ``SSLStream``: said without the ABC's Python-level
        # ``__instancecheck__`` (three per call on a pooled connection; issue 15).
        if type(stream) is trio.SocketStream or not isinstance(stream, trio.SSLStream):
            return False
        try:
            incoming = stream._incoming  # trio's private MemoryBIO (``check_trio_tls``)
            return bool(stream.pending()) or bool(incoming.pending)
        except (AttributeError, ValueError, ssl.SSLError):
            return True


_CLEAN, _PARTIAL, _UNREAD = "clean", "partial", "unread"
"""What the TLS check finds waiting: only whole records without application data, those and
one last application-data record not whole yet, or something that refuses the request."""

TICKET_PATIENCE = 0.05
"""Seconds a record half-arrived at the check is waited for (``unread_bytes``): a ticket's
rest follows its first bytes at once on a loopback or a LAN; a peer that stops mid-record is
refused after this, as it was at once before."""

_MAX_RECORD = 2**14 + 256
"""RFC 8446 §5.2: a TLSCiphertext's length MUST NOT exceed 2^14 + 256 bytes."""


def _framing(data: bytes) -> str:
    """Is ``data`` a run of whole TLS records (no bytes are: ``_CLEAN``), each of the one outer
    type a TLS 1.3 record after the handshake has: application_data, 23 -- tickets and alerts
    included (RFC 8446 §5.2: a 5-byte header, its last two bytes the length)?  ``_PARTIAL``
    when the last one is of that type but not whole yet (its header cut short too);
    ``_UNREAD`` for any other type or a length no record may have."""
    at, end = 0, len(data)
    while at < end:
        if data[at] != 23:
            return _UNREAD
        if at + 5 <= end and int.from_bytes(data[at + 3 : at + 5], "big") > _MAX_RECORD:
            return _UNREAD
        at += 5 + int.from_bytes(data[at + 3 : at + 5], "big")
    return _CLEAN if at == end else _PARTIAL


class HopSetupFailed(Exception):
    """Setup of a redirect hop failed before its request was written."""

    def __init__(self, code: Code, stage: str) -> None:
        self.code, self.stage = code, stage
        super().__init__(f"{code.value} at {stage}")


def step(ctx: AttemptContext, event: str, facts: Mapping[str, Any]) -> None:
    """Fire ``event`` on the protocol machine and report the step to the observer."""
    fired = ctx.machine.fire(event)
    ctx.observe(fired, facts)


def setup_failed(
    ctx: AttemptContext,
    hop: int,
    code: Code,
    stage: str,
    detail: str = "",
    *,
    setting: str | None = None,
    **facts: Any,
) -> Exception:
    """``setting``: the target's config key to fix when its value is the cause
    (``SetupError.setting``)."""
    step(ctx, "setup_fail", {"hop": hop, "code": code.value, "stage": stage, **facts})
    log.debug("setup failed hop=%d stage=%s code=%s", hop, stage, code.value)
    if hop > 1:
        return HopSetupFailed(code, stage)
    # (annotated: mypy run over the source folders sees ``affidavit.*`` imports as Any)
    err: Exception = SetupError(code, stage, detail, setting=setting)
    return err


async def open_connection(
    request: HttpRequest,
    ctx: AttemptContext,
    hop: int,
    target: Url,
    key: PoolKey,
    *,
    trust: Callable[[str | None], Awaitable[Trust]],
    new_id: Callable[[], str],
) -> Connection:
    """A fresh connection to ``target`` (through ``request.proxy`` if set), set up to the point
    where the request may be written.  ``new_id`` names it once its socket is connected; its
    pool key is ``key`` with the trust its TLS session was verified with (``await
    trust(ca_file)``, resolved just before the TCP connect: the file may have changed since
    ``key`` was made)."""
    t = request.timeouts
    proxy: Url | None = None
    if request.proxy is not None:
        try:
            proxy = parse_url(request.proxy, schemes=frozenset({"http"}))
        except BadUrl as e:
            raise setup_failed(ctx, hop, Code.PROXY_FAILED, "proxy_url", str(e)) from None
    peer_host = proxy or target
    role = "proxy" if proxy else "origin"
    # -- dns
    try:
        with trio.fail_after(t.connect):
            infos = await trio.socket.getaddrinfo(
                peer_host.host, peer_host.port, type=trio.socket.SOCK_STREAM
            )
    except trio.TooSlowError:
        raise setup_failed(ctx, hop, Code.CONNECT_TIMEOUT, "dns", role=role) from None
    except OSError as e:
        raise setup_failed(
            ctx, hop, Code.DNS_FAILED, "dns", errno_name(e) or "", role=role
        ) from None
    if not infos:
        raise setup_failed(ctx, hop, Code.DNS_FAILED, "dns", "no addresses", role=role)
    if (
        target.scheme == "http"
        and not request.trust_cleartext
        and loopback_host(peer_host.host)
        and not all(loopback_host(str(info[4][0]).split("%", 1)[0]) for info in infos)
    ):
        # Plain HTTP without ``trust_cleartext`` rests on the first hop being loopback; a
        # name (``localhost``) is loopback only while the resolver says so -- one that
        # answers an address off the machine would take the credential there in clear.
        raise setup_failed(ctx, hop, Code.SETUP_FAILED, "dns", LOOPBACK_OFF_MACHINE, role=role)
    step(ctx, "resolve", {"hop": hop, "role": role, "addresses": len(infos)})
    used = await _trust(ctx, hop, request, trust) if target.scheme == "https" else None
    # -- tcp
    sock = None
    last: OSError | None = None
    try:
        with trio.fail_after(t.connect):
            for family, type_, proto, _canon, addr in infos:
                s = trio.socket.socket(family, type_, proto)
                try:
                    await s.connect(addr)
                except OSError as e:
                    s.close()
                    last = e
                    continue
                except BaseException:
                    s.close()
                    raise
                sock = s
                break
    except trio.TooSlowError:
        raise setup_failed(ctx, hop, Code.CONNECT_TIMEOUT, "tcp_connect", role=role) from None
    if sock is None:
        refused = isinstance(last, ConnectionRefusedError)
        code = Code.CONNECTION_REFUSED if refused else Code.SETUP_FAILED
        name = errno_name(last) if last else ""
        raise setup_failed(ctx, hop, code, "tcp_connect", name or "", role=role)
    sock_stream = trio.SocketStream(sock)
    stream: trio.abc.Stream = sock_stream
    conn_id = new_id()
    step(ctx, "connect", {"hop": hop, "role": role, "connection": conn_id})
    try:
        if proxy is not None and target.scheme == "https":
            await _tunnel(ctx, hop, stream, target, proxy, t)
        peer = None
        if target.scheme == "https":
            assert used is not None
            stream, peer = await _tls(ctx, hop, stream, target, request, used)
            key = (*key[:4], peer.get("ca_sha256"))
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    log.debug("opened connection %s to %s", conn_id, target.origin)
    return Connection(
        id=conn_id,
        key=key,
        stream=stream,
        socket_stream=sock_stream,
        h11=client_connection(),
        peer=peer,
        via_proxy=proxy.hostport if proxy else None,
        forward_proxy=proxy is not None and target.scheme == "http",
    )


async def _tunnel(
    ctx: AttemptContext,
    hop: int,
    stream: trio.abc.Stream,
    target: Url,
    proxy: Url,
    t: Timeouts,
) -> None:
    """RFC 9110 §9.3.6 CONNECT.  Still connection setup: no application byte is sent and the
    proxy's answer is about the tunnel only."""
    pconn = h11.Connection(h11.CLIENT)
    hostport = target.hostport
    status: int | None = None
    headers: list[tuple[str, str]] = []
    try:
        with trio.fail_after(t.connect):
            data = pconn.send(
                h11.Request(method="CONNECT", target=hostport, headers=[("Host", hostport)])
            )
            data = (data or b"") + (pconn.send(h11.EndOfMessage()) or b"")
            await stream.send_all(data)
            while status is None:
                ev = pconn.next_event()
                if ev is h11.NEED_DATA:
                    pconn.receive_data(bytes(await stream.receive_some(READ_SIZE)))
                elif isinstance(ev, h11.Response):
                    status = ev.status_code
                    headers = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in ev.headers]
                elif isinstance(ev, h11.InformationalResponse):
                    continue
                else:
                    break
    except trio.TooSlowError:
        raise setup_failed(ctx, hop, Code.CONNECT_TIMEOUT, "proxy_connect") from None
    except (h11.RemoteProtocolError, trio.BrokenResourceError, OSError) as e:
        raise setup_failed(
            ctx, hop, Code.PROXY_FAILED, "proxy_connect", errno_name(e) or ""
        ) from None
    ps = parse_proxy_status(header_value(headers, "proxy-status"))
    ok = status is not None and 200 <= status < 300
    leftover = pconn.trailing_data[0] if ok else b""
    if not ok or leftover:
        raise setup_failed(
            ctx,
            hop,
            Code.PROXY_FAILED,
            "proxy_connect",
            f"proxy answered {status}" if status else "proxy closed the tunnel",
            status=status,
            proxy_status=ps,
        )
    step(ctx, "tunnel", {"hop": hop, "proxy": proxy.hostport, "status": status})


_CA_FILE_STAGE = "ca_file"
"""The stage of a call refused over its CA file as it is now (unusable, or not the bytes the
call's account recorded): after DNS, before the TCP connect -- no handshake was made, so never
``tls_handshake``; a stage of its own, as the empty system store's (``system_trust_store``)."""


async def _trust(
    ctx: AttemptContext,
    hop: int,
    request: HttpRequest,
    trust: Callable[[str | None], Awaitable[Trust]],
) -> Trust:
    """What the handshake will trust, resolved before the TCP connect (``TrustStore.resolve``:
    a CA file read in a file thread, never on the loop) -- or the call refused, no byte sent
    and no handshake made.  The read is part of connection setup and bounded as its other
    steps are, by the connect timeout: a CA file on a hung mount is ``CONNECT_TIMEOUT`` at
    stage ``ca_file`` (the target's ``timeout.connect``), not a wait to the call's deadline."""
    ca_file = request.ca_file
    try:
        with trio.fail_after(request.timeouts.connect):
            used = await trust(ca_file)
    except trio.TooSlowError:
        raise setup_failed(ctx, hop, Code.CONNECT_TIMEOUT, _CA_FILE_STAGE) from None
    except (OSError, ssl.SSLError) as e:
        raise setup_failed(
            ctx,
            hop,
            Code.CERTIFICATE_INVALID,
            _CA_FILE_STAGE,
            "CA file unusable",
            # The operator's file (deleted, unreadable or not PEM since the config was loaded):
            # no server and no retry can fix it, only ``ca_file``.  Its path stays out.
            setting="ca_file",
            error=errno_name(e),
        ) from None
    if request.ca_sha256 is not None and used.ca_sha256 != request.ca_sha256:
        # The file was edited between the call's validation (whose account recorded
        # ``request.ca_sha256``) and this connection: trusting the new bytes would make the
        # record name one trust and the connection use another.  Refused before any handshake
        # and any byte of the request: the configuration changed between validation and
        # dispatch (CONFIG_CHANGED, the engine's refusal); a new invocation records and uses
        # the new content.
        raise setup_failed(
            ctx,
            hop,
            Code.CONFIG_CHANGED,
            _CA_FILE_STAGE,
            "CA file changed since the call was validated",
            setting="ca_file",
            error="ca_file_changed",
        ) from None
    if used.empty:
        # The broker's own store, not the peer: no certificate could have passed.  A stage of
        # its own: no handshake was made.
        raise setup_failed(
            ctx,
            hop,
            Code.CERTIFICATE_INVALID,
            "system_trust_store",
            SYSTEM_STORE_EMPTY,
            setting="ca_file",
            error="system_store_empty",
        ) from None
    return used


async def _tls(
    ctx: AttemptContext,
    hop: int,
    stream: trio.abc.Stream,
    target: Url,
    request: HttpRequest,
    used: Trust,
) -> tuple[trio.SSLStream[trio.abc.Stream], dict[str, Any]]:
    ca_file, t = request.ca_file, request.timeouts
    # https_compatible=False on purpose: a TCP FIN without TLS close_notify must not pass
    # for the end of a close-delimited body (seed: never declare a result complete without
    # "a protocol-specific close that proves completion").
    tls = trio.SSLStream(stream, used.context, server_hostname=target.host, https_compatible=False)
    try:
        with trio.fail_after(t.connect):
            await tls.do_handshake()
    except trio.TooSlowError:
        raise setup_failed(ctx, hop, Code.CONNECT_TIMEOUT, "tls_handshake") from None
    except (trio.BrokenResourceError, OSError) as e:
        cause = e.__cause__ if e.__cause__ is not None else e
        if isinstance(cause, ssl.SSLCertVerificationError):
            raise setup_failed(
                ctx,
                hop,
                Code.CERTIFICATE_INVALID,
                "tls_handshake",
                cause.verify_message or "certificate rejected",
                verify_code=cause.verify_code,
            ) from None
        raise setup_failed(
            ctx,
            hop,
            Code.TLS_FAILED,
            "tls_handshake",
            errno_name(e) or "",
            error=errno_name(e),
        ) from None
    der = tls.getpeercert(binary_form=True)
    cipher = tls.cipher()
    peer = {
        "tls_version": tls.version(),
        "cipher": cipher[0] if cipher else None,
        "cert_sha256": hashlib.sha256(der).hexdigest() if der else None,
        "verified_hostname": target.host,
        "trust": "ca_file" if ca_file else "system",
    }
    if used.ca_sha256 is not None:
        peer["ca_sha256"] = used.ca_sha256  # the bytes verified with, as the account records
    step(ctx, "tls", {"hop": hop, "peer": peer})
    return tls, peer


def errno_name(e: BaseException) -> str | None:
    """The OS error's errno name (or ``SSL:reason``) somewhere in ``e``'s chain, else its type's
    name: the only detail of a transport error the driver keeps (its text could echo bytes)."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ssl.SSLError):
            return f"SSL:{cur.reason}" if cur.reason else "SSL"
        if isinstance(cur, OSError) and cur.errno is not None:
            return errno.errorcode.get(cur.errno, str(cur.errno))
        cur = cur.__cause__ or cur.__context__
    return type(e).__name__
