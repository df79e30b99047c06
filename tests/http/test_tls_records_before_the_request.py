"""TLS records a peer sends after the handshake and before the request: only whole records that
carry no application data (a TLS 1.3 server's session tickets) let the request be written.

Bytes that arrived before the request's first byte can never be its answer.  Over TLS the
unread-bytes check after the gate (``Connection.unread_bytes``) decrypts what waits; here a peer
driven record by record (a server-side ``ssl.SSLObject`` over memory BIOs, its bytes written to a
loopback socket as each row says) sends, before the check:

* the first bytes of an application-data record -- the rest follows once a request arrives, so
  a client that wrote it would read ``201 Created {"id":"fake"}`` as the answer;
* a close_notify, or a fatal alert (the peer is done: writing to it proves nothing);
* anything at all under TLS 1.2 (no post-handshake tickets there: its tickets come before
  the server's Finished);
* only its session tickets (TLS 1.3): no answer, the call completes -- also when the last
  ticket record is caught half-arrived and its rest follows within ``TICKET_PATIENCE``; one
  whose rest never comes is refused.

Refused means a setup failure at stage ``peer_spoke_first`` and not one byte written after the
handshake (the peer counts every byte it receives).
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio

from affidavit.adapters.base import AttemptInterrupted, SetupError
from affidavit.adapters.http import HttpClient, connect
from affidavit.statemachine import Outcome

from .fakes import FakeEngine
from .hostile import TlsFixture
from .test_tls_proxy_timeouts import req

UNSOLICITED = b'HTTP/1.1 201 Created\r\nContent-Length: 13\r\n\r\n{"id":"fake"}'
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


Sent = tuple[bytes, bytes | None]
Before = Callable[[ssl.SSLObject, ssl.MemoryBIO, ssl.MemoryBIO], Sent]
"""A row: given the server's TLS object and its BIOs (in, out) once the handshake is done,
the bytes to send before the check and those to send once a whole request arrived (None: an
``OK`` answer)."""


@dataclass
class RecordPeer:
    """One connection's TLS server, record by record, on a loopback listener."""

    ctx: ssl.SSLContext
    before: Before
    sent: trio.Event = field(default_factory=trio.Event)
    after_handshake: int = 0
    """Bytes received from the client after the server's handshake ended."""
    request: bytes = b""
    keep_alive_ends: trio.Event | None = None
    """Set: after its answer the peer waits for it, then sends close_notify (its keep-alive ran
    out) and sets ``closed``; ``after_close`` counts the bytes it receives after that."""
    closed: trio.Event = field(default_factory=trio.Event)
    after_close: int = 0
    held: list[bytes] = field(default_factory=list)
    """Bytes a row keeps back: sent ``pause`` seconds after ``release`` is set (None: never)."""
    release: trio.Event | None = None
    pause: float = 0.0
    eof_after_held: bool = False
    client_closed: trio.Event = field(default_factory=trio.Event)
    """Set when the client's side ended (EOF or reset) while the peer waited for a request."""
    """Set: the peer shuts its side down once ``held`` is sent (an EOF mid-record)."""

    async def serve(self, listener: trio.SocketListener) -> None:
        """Accept one connection and play the row; every wait bounded (10 s in all)."""
        with trio.move_on_after(10):
            stream = await listener.accept()
            async with stream:
                await self._play(stream)

    async def _play(self, stream: trio.SocketStream) -> None:
        si, so = ssl.MemoryBIO(), ssl.MemoryBIO()
        obj = self.ctx.wrap_bio(si, so, server_side=True)
        while True:
            try:
                obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                if so.pending:
                    await stream.send_all(so.read())
                data = bytes(await stream.receive_some(65536))
                if not data:
                    return  # the client gave up on the handshake
                si.write(data)
        now, rest = self.before(obj, si, so)
        await stream.send_all(now)
        self.sent.set()
        if self.release is not None:
            await self.release.wait()
            await trio.sleep(self.pause)
            await stream.send_all(b"".join(self.held))
            if self.eof_after_held:
                await stream.send_eof()
        # a client that closes with the tickets unread resets the connection
        with trio.move_on_after(3), contextlib.suppress(trio.BrokenResourceError):
            await self._answer(stream, obj, si, so, rest)

    async def _answer(
        self,
        stream: trio.SocketStream,
        obj: ssl.SSLObject,
        si: ssl.MemoryBIO,
        so: ssl.MemoryBIO,
        rest: bytes | None,
    ) -> None:
        """Read until a whole request arrives (or EOF): answer it as the row says."""
        while not _whole_request(self.request):
            try:
                data = bytes(await stream.receive_some(65536))
            except trio.BrokenResourceError:
                data = b""
            if not data:
                self.client_closed.set()
                return
            self.after_handshake += len(data)
            si.write(data)
            try:
                while chunk := obj.read(65536):
                    self.request += chunk
            except ssl.SSLError:  # SSLWantReadError among them: all read for now
                pass
        if rest is None:
            try:
                obj.write(OK)
            except ssl.SSLError:  # after its own close_notify or alert: nothing to say
                return
            rest = so.read()
        await stream.send_all(rest)
        if self.keep_alive_ends is None:
            await trio.sleep(1)  # the client reads its answer and closes
            return
        await self.keep_alive_ends.wait()
        with contextlib.suppress(ssl.SSLWantReadError):
            obj.unwrap()
        await stream.send_all(so.read())
        self.closed.set()
        while data := bytes(await stream.receive_some(65536)):
            self.after_close += len(data)


def _whole_request(data: bytes) -> bool:
    """A head and as many body bytes as its Content-Length says (the client's requests here)."""
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return True


def server_context(tls: TlsFixture, version: ssl.TLSVersion) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ctx.maximum_version = version
    tls.good.configure_cert(ctx)
    return ctx


def tickets_only(obj: ssl.SSLObject, si: ssl.MemoryBIO, so: ssl.MemoryBIO) -> Sent:
    return so.read(), None


def split_ticket(peer: RecordPeer) -> Before:
    """The tickets but the last record's last 10 bytes, kept back in ``peer.held``."""

    def row(obj: ssl.SSLObject, si: ssl.MemoryBIO, so: ssl.MemoryBIO) -> Sent:
        tickets = so.read()
        assert connect._framing(tickets) == "clean"  # whole ticket records: cut the last
        peer.held.append(tickets[-10:])
        return tickets[:-10], None

    return row


def partial_record(obj: ssl.SSLObject, si: ssl.MemoryBIO, so: ssl.MemoryBIO) -> Sent:
    """The first 10 bytes of the record carrying ``UNSOLICITED``: its header and 5 more."""
    first = so.read()
    obj.write(UNSOLICITED)
    record = so.read()
    return first + record[:10], record[10:]


def whole_record(obj: ssl.SSLObject, si: ssl.MemoryBIO, so: ssl.MemoryBIO) -> Sent:
    first = so.read()
    obj.write(UNSOLICITED)
    return first + so.read(), None


def close_notify(obj: ssl.SSLObject, si: ssl.MemoryBIO, so: ssl.MemoryBIO) -> Sent:
    first = so.read()
    with contextlib.suppress(ssl.SSLWantReadError):
        obj.unwrap()  # writes close_notify, then waits for the client's
    return first + so.read(), None


def handshake_record(obj: ssl.SSLObject, si: ssl.MemoryBIO, so: ssl.MemoryBIO) -> Sent:
    """A whole record of type 22 (handshake) after the handshake: TLS 1.2's HelloRequest
    asking to renegotiate has that outer type; under TLS 1.3 no record after the handshake
    may (RFC 8446 §5.2).  Its type alone refuses it, before OpenSSL sees it."""
    return so.read() + b"\x16\x03\x03\x00\x20" + bytes(32), None


def clear_alert(obj: ssl.SSLObject, si: ssl.MemoryBIO, so: ssl.MemoryBIO) -> Sent:
    """A whole record of type 21 (alert) in the clear: a warning-level close_notify."""
    return so.read() + b"\x15\x03\x03\x00\x02\x01\x00", None


def fatal_alert(obj: ssl.SSLObject, si: ssl.MemoryBIO, so: ssl.MemoryBIO) -> Sent:
    """A record that fails to decrypt makes the server's OpenSSL send a fatal alert
    (bad_record_mac), encrypted as every record after the handshake."""
    first = so.read()
    si.write(b"\x17\x03\x03\x00\x20" + bytes(32))
    with pytest.raises(ssl.SSLError):
        obj.read(1)
    return first + so.read(), None


V13, V12 = ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_2

REFUSED = [
    pytest.param(V13, partial_record, id="tls13-partial-record"),
    pytest.param(V13, None, id="tls13-ticket-never-whole"),
    pytest.param(V13, whole_record, id="tls13-whole-record"),
    pytest.param(V13, close_notify, id="tls13-close-notify"),
    pytest.param(V13, fatal_alert, id="tls13-fatal-alert"),
    pytest.param(V12, partial_record, id="tls12-partial-record"),
    pytest.param(V12, close_notify, id="tls12-close-notify"),
    pytest.param(V13, handshake_record, id="tls13-type-22"),
    pytest.param(V12, handshake_record, id="tls12-type-22"),
    pytest.param(V13, clear_alert, id="tls13-type-21"),
    pytest.param(V12, clear_alert, id="tls12-type-21"),
]


async def _call(
    client: HttpClient,
    tls: TlsFixture,
    version: ssl.TLSVersion,
    before: Before,
    peer: RecordPeer | None = None,
) -> tuple[RecordPeer, Any, Any]:
    """One POST to a ``RecordPeer``; the gate holds until the peer's bytes reached the
    client's socket, then sets the peer's ``release`` (if any) as it ends.  Returns the peer,
    the result (or None) and the error (or None)."""
    peer = peer or RecordPeer(server_context(tls, version), before)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]

    async def during_gate(facts: Mapping[str, Any]) -> None:
        await peer.sent.wait()
        await trio.sleep(0.2)  # let the bytes reach the client's socket
        if peer.release is not None:
            peer.release.set()

    fe = FakeEngine(on_gate=during_gate)
    res = err = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(peer.serve, listeners[0])
        url = f"https://127.0.0.1:{port}/pay"
        with trio.fail_after(10):
            try:
                res = await client.perform(req(url, "POST", b"x", ca_file=tls.ca_file), fe.ctx)
            except (SetupError, AttemptInterrupted) as e:
                err = e
        await client.aclose()
    await listeners[0].aclose()
    assert fe.gates[0]["peer"]["tls_version"] == ("TLSv1.3" if version is V13 else "TLSv1.2")
    return peer, res, err


@pytest.mark.parametrize(("version", "before"), REFUSED)
async def test_records_other_than_tickets_before_the_request_refuse_it_unwritten(
    client: HttpClient, tls: TlsFixture, version: ssl.TLSVersion, before: Before | None
) -> None:
    """(None: a ticket record whose last 10 bytes never come.)"""
    peer = RecordPeer(server_context(tls, version), lambda *_: (b"", None))
    peer.before = before or split_ticket(peer)
    peer, res, err = await _call(client, tls, version, peer.before, peer)
    assert res is None, f"the request was written and answered: {res}"
    assert isinstance(err, SetupError) and err.stage == "peer_spoke_first", err
    assert peer.after_handshake == 0 and peer.request == b""


async def test_a_close_notify_during_a_pooled_connection_s_gate_refuses_the_request_unwritten(
    client: HttpClient, tls: TlsFixture
) -> None:
    """The common race: the server's keep-alive runs out (close_notify) while the next call's
    gate holds, after the pool checked the connection.  The request is not written to a peer
    that is done: a setup failure at stage ``reused_connection``."""
    ends = trio.Event()
    peer = RecordPeer(server_context(tls, V13), tickets_only, keep_alive_ends=ends)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]

    async def during_gate(facts: Mapping[str, Any]) -> None:
        ends.set()
        await peer.closed.wait()
        await trio.sleep(0.2)  # let the close_notify reach the client's socket

    first, second = FakeEngine(), FakeEngine(on_gate=during_gate)
    url = f"https://127.0.0.1:{port}/pay"
    async with trio.open_nursery() as nursery:
        nursery.start_soon(peer.serve, listeners[0])
        with trio.fail_after(10):
            res = await client.perform(req(url, "POST", b"x", ca_file=tls.ca_file), first.ctx)
            with pytest.raises(SetupError) as info:
                await client.perform(req(url, "POST", b"y", ca_file=tls.ca_file), second.ctx)
        await client.aclose()
    await listeners[0].aclose()
    assert res.outcome is Outcome.COMMITTED
    assert second.gates[0]["reused_connection"] is True
    assert info.value.stage == "reused_connection" and peer.after_close == 0


@pytest.mark.parametrize("version", [V13, V12], ids=["tls13", "tls12"])
async def test_tickets_alone_before_the_request_refuse_nothing(
    client: HttpClient, tls: TlsFixture, version: ssl.TLSVersion, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TLS 1.3: the server's session tickets (whole records, no application data) wait at the
    check (the bytes queued there are recorded); TLS 1.2: nothing does (its tickets came before
    its Finished).  The call completes."""
    queued: list[int] = []
    check = connect.Connection._tls_application_data

    def recorded(conn: connect.Connection, stream: Any) -> str:
        queued.append(conn._queued())
        return check(conn, stream)

    monkeypatch.setattr(connect.Connection, "_tls_application_data", recorded)
    peer, res, err = await _call(client, tls, version, tickets_only)
    assert len(queued) == 1 and (queued[0] > 0) is (version is V13)  # really waiting, or not
    assert err is None and res is not None
    assert res.outcome is Outcome.COMMITTED and res.facts["status"] == 200
    assert peer.request.startswith(b"POST /pay HTTP/1.1\r\n")


@pytest.mark.parametrize(
    ("data", "framing"),
    [
        (b"", "clean"),
        (b"\x17\x03\x03\x00\x02ab", "clean"),
        (b"\x17\x03\x03\x00\x02ab\x17\x03\x03\x00\x00", "clean"),
        (b"\x17\x03\x03\x00\x02a", "partial"),  # a record cut short
        (b"\x17\x03\x03\x00\x02ab\x17\x03", "partial"),  # a header cut short
        (b"\x17", "partial"),
        (b"\x17\x03\x03\x41\x00", "partial"),  # 2^14 + 256 bytes: the most a record has
        (b"\x17\x03\x03\x41\x01", "unread"),  # one more: no record is that long
        (b"\x16\x03\x03\x00\x01\x00", "unread"),  # TLS 1.2's HelloRequest: a handshake record
        (b"\x15\x03\x03\x00\x02\x01\x00", "unread"),  # an alert in the clear
        (b"\x17\x03\x03\x00\x01a\x16\x03", "unread"),  # partial, but not of type 23
    ],
)
def test_only_application_data_records_are_framed_as_whole_or_partial(
    data: bytes, framing: str
) -> None:
    """What OpenSSL may be shown to tell tickets from an answer: whole records of the one
    outer type TLS 1.3 gives every record after the handshake; a last one of that type not
    whole yet is waited for.  (TLS 1.2's renegotiation request is whole and gives no byte:
    only its type refuses it.)"""
    assert connect._framing(data) == framing


async def test_a_ticket_caught_half_arrived_is_waited_for_and_refuses_nothing(
    client: HttpClient, tls: TlsFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last ticket record's last 10 bytes come 20 ms after the check found it partial
    (a large stateless ticket, a proxy merging writes): the check waits for them (within
    ``TICKET_PATIENCE``), frames the records again, and the request is written."""
    found: list[str] = []
    check = connect.Connection._tls_application_data

    def recorded(conn: connect.Connection, stream: Any) -> str:
        found.append(check(conn, stream))
        return found[-1]

    monkeypatch.setattr(connect.Connection, "_tls_application_data", recorded)
    peer = RecordPeer(server_context(tls, V13), tickets_only, release=trio.Event(), pause=0.02)
    peer.before = split_ticket(peer)
    peer, res, err = await _call(client, tls, V13, peer.before, peer)
    assert found == ["partial", "clean"]  # really half-arrived at the check, then whole
    assert err is None and res is not None and res.outcome is Outcome.COMMITTED
    assert peer.request.startswith(b"POST /pay HTTP/1.1\r\n")


def _ticket_cut_short(obj: ssl.SSLObject, si: ssl.MemoryBIO, so: ssl.MemoryBIO) -> Sent:
    return so.read()[:-10], None


async def test_an_eof_after_half_a_ticket_refuses_at_once(
    client: HttpClient, tls: TlsFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The peer shuts its side after half its last ticket record: the socket reads as ready
    with nothing more to frame, and the check refuses at once rather than framing the same
    bytes again until ``TICKET_PATIENCE`` ran out."""
    found: list[str] = []
    check = connect.Connection._tls_application_data

    def recorded(conn: connect.Connection, stream: Any) -> str:
        found.append(check(conn, stream))
        return found[-1]

    monkeypatch.setattr(connect.Connection, "_tls_application_data", recorded)
    peer = RecordPeer(
        server_context(tls, V13), _ticket_cut_short, release=trio.Event(), eof_after_held=True
    )
    peer, res, err = await _call(client, tls, V13, peer.before, peer)
    assert res is None and isinstance(err, SetupError) and err.stage == "peer_spoke_first"
    assert found == ["partial"] and peer.after_handshake == 0


async def test_a_call_cancelled_while_a_ticket_s_rest_is_awaited_closes_the_connection(
    client: HttpClient, tls: TlsFixture
) -> None:
    """The caller's cancel lands during the wait for a ticket's rest (which never comes): the
    request is not written and the connection is closed then -- the peer sees it end at once,
    not when the client is garbage collected -- and the step says so: ``setup_fail`` at stage
    ``ticket_wait``, the machine never dispatched (tests/broker/test_ticket_wait_cancel.py: the
    record and the envelope)."""
    peer = RecordPeer(server_context(tls, V13), _ticket_cut_short)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    call = trio.CancelScope()

    async def during_gate(facts: Mapping[str, Any]) -> None:
        await peer.sent.wait()
        await trio.sleep(0.2)  # the half ticket on the client's socket
        call.deadline = trio.current_time() + connect.TICKET_PATIENCE / 5  # during the wait

    fe = FakeEngine(on_gate=during_gate)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(peer.serve, listeners[0])
        url = f"https://127.0.0.1:{port}/pay"
        with call:
            await client.perform(req(url, "POST", b"x", ca_file=tls.ca_file), fe.ctx)
        assert call.cancelled_caught
        with trio.fail_after(10):  # the peer's own wait ends at 3 s: a loaded machine's bound
            await peer.client_closed.wait()
        assert peer.after_handshake == 0
        assert fe.events[-1] == "setup_fail" and not fe.machine.dispatched
        assert fe.facts_of("setup_fail") == [
            {
                "hop": 1,
                "stage": "ticket_wait",
                "connection": fe.gates[0]["connection"],
                "local_error": "Cancelled",
            }
        ]
        await client.aclose()
    await listeners[0].aclose()


async def test_a_check_that_fails_without_a_cancel_claims_no_ticket_wait(
    client: HttpClient, tls: TlsFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a cancel ends the wait for a ticket's rest (the check's one checkpoint); anything
    else the check raises is no such end: no ``ticket_wait`` step is claimed for it, the
    request is still not written and the connection is closed."""

    async def broken(self: connect.Connection, connect_timeout: float) -> bool:
        raise OSError("FIONREAD failed")

    monkeypatch.setattr(connect.Connection, "unread_bytes", broken)
    fe = FakeEngine()
    peer = RecordPeer(server_context(tls, V13), _ticket_cut_short)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(peer.serve, listeners[0])
        url = f"https://127.0.0.1:{port}/pay"
        with trio.fail_after(10), pytest.raises(OSError, match="FIONREAD failed"):
            await client.perform(req(url, "POST", b"x", ca_file=tls.ca_file), fe.ctx)
        with trio.fail_after(10):  # the peer's own wait ends at 3 s: a loaded machine's bound
            await peer.client_closed.wait()
        assert peer.after_handshake == 0
        assert [f.get("stage") for f in fe.facts_of("setup_fail")] == []
        await client.aclose()
    await listeners[0].aclose()
