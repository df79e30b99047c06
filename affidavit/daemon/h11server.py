"""HTTP/1.1 on the daemon's socket: h11 on trio, two tasks per connection, none per request.

Why not hypercorn (which still serves the operator console, a full ASGI app): the socket API
is a handful of JSON routes, and hypercorn's ASGI machinery (its protocol wrapper, an HTTP
stream, a task group, a lock and shielded cancel scopes per request) cost about as much daemon
CPU as the broker's own work -- 1.2-1.4 ms per ``GET /v1/health`` at 64 keep-alive clients,
where a whole journaled call costs 2.35-2.60 ms.  This driver parses with h11 and writes each
answer in one ``send_all`` (tests/benchmarks/service_overhead.py measures both) -- but a body
over ``JOINED`` (64 KiB), written after its head rather than copied into one buffer with it, and
a stored result's, written a part at a time as it is read and verified (``answer_parts``): the
memory of both held within the server's answer budget (admission.py ``ANSWER_BUDGET``,
answers.py).

Each connection runs two tasks for its whole life:

* the **reader** reads the socket whenever it can, into an inbox the parser drains.  It keeps
  reading while a request is being handled, because that is how a hang-up is seen while a call
  runs (``Link.on_hang_up``: a call not yet at its dispatch gate is withdrawn).  Bytes of a
  pipelined next request that arrive meanwhile wait in the inbox and are served in order after
  the current answer.  The inbox is bounded (``INBOX``): a client that pipelines more than that
  behind a running call is simply not read from until its turn -- its own hang-up then goes
  unseen until the answer is written, which only that client can cause;
* the **server** takes one request at a time from h11, hands it to the routes (``Request``, no
  ASGI in between), and after the answer starts the next cycle or closes.

Limits a hostile or broken client meets (each answered, never a traceback in the log):

* a malformed request line or header: 400, then close; a head over ``MAX_HEAD`` bytes: 431
  (h11's ``max_incomplete_event_size``), then close; a ``Transfer-Encoding`` other than one
  ``chunked``: 501 ``TRANSFER_ENCODING_REFUSED`` (RFC 9112 section 6.1), then close; a
  ``Content-Length`` beside ``Transfer-Encoding: chunked``: 400 ``AMBIGUOUS_FRAMING``
  (field ``headers.content-length``) before a route or the body, then close (section 6.1:
  reject, or read by the coding alone, and close either way -- ``_refuse_framing`` says which
  and why); a ``Transfer-Encoding`` in an HTTP/1.0 request: 400 ``AMBIGUOUS_FRAMING`` (field
  ``headers.transfer-encoding``; section 6.1: faulty framing), likewise; a version other than
  HTTP/1.0 or 1.1 on the request line: 505 ``HTTP_VERSION_UNSUPPORTED``, likewise;
* more than ``MAX_CONNECTIONS`` open at once: the longest-idle one makes room, or the new
  one is answered 503 unread (``admission.py``, whose ``Server`` holds a listener's
  connections);
* a head begun but not finished within ``HEAD_WAIT`` of the connection turning busy (a client
  that sends half a head and stalls): closed; a body that stalls for ``HEAD_WAIT``, or is not
  whole ``BODY_WAIT`` after the end of its head (a client dripping a byte at a time): 408, close;
* ``CONNECT``, or a request with an ``Upgrade`` header (websocket, h2c): 501
  ``CONNECT_REFUSED`` / ``UPGRADE_REFUSED`` before any route runs or a byte of a body is read
  (so h11 never switches protocols), then close;
* an answer not written whole within ``WRITE_WAIT`` (a client that does not read it): the
  connection is closed, and the link notes the write broken -- never delivered (link.py);
* a body over ``MAX_BODY`` (http.py) -- an action's (``POST /v1/calls``) over
  ``Server.max_body``, ``http.body_limit`` of the config --: 413, then close (the rest of it
  is never read); one that declares a ``Content-Length`` over it: 413 before a byte of it is
  read (no 100-continue);
* the bodies all connections hold at once, past the first ``FREE_BODY`` (64 KiB) of each:
  at most ``Server.body_budget`` (256 MiB, or twice ``max_body`` if more) -- one that would
  not fit is 503 ``BODIES_IN_FLIGHT``, then close (http.py ``Request.body``), so 256
  connections each sending ``max_body`` bytes are not all in memory at once.  While a body is
  parsed it is held as its bytes, its text and the parsed value's strings: three times its
  size if ASCII, up to five once a character is past U+00FF and nine past U+FFFF (the text
  and its strings then take two or four bytes a character) -- plus at most ``MAX_NODES``
  (10 000) other values, under 1 MB: a body holding more is refused before the parser runs
  (``actions._prescan``; 16 MB of ``[[],[],...]`` was 5.3M lists, 740 MB, before).  A body
  over ``FREE_BODY`` is parsed in a worker thread (``Request._parsed``), off the event loop;
* a chunked body is counted as sent, its framing included, against both (``body_wire``), and
  decoded ``BODY_EVENTS`` h11 events at a time, the event loop running between (one chunk is
  one event whatever its size); past ``FREE_CHUNKS`` chunks averaging under ``MIN_CHUNK``
  bytes: 400 ``CHUNKS_TOO_SMALL`` (field ``body``), then close (``body_chunk``);
* ``Expect: 100-continue``: the interim 100 goes out when a route first reads the body;
* HTTP/1.0 and ``Connection: close`` are honoured (h11); an answer given before the request's
  body was read whole carries ``Connection: close`` unless the rest is already buffered.

Keep-alive: an idle connection waits up to ``keep_alive`` seconds for its next request (less
at the connection cap: ``admission.py``).  At shutdown (``Server.close``) idle connections
close at once and busy ones after their answer, which then says ``Connection: close``.
"""

from __future__ import annotations

import contextlib
import logging
import select
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

import h11
import trio

from affidavit.api.wire import DELIVERY_WAIT

from .http import ApiProblem, ClientGone, Request, api_error_body
from .link import GONE, Link
from .peer import Peer

if TYPE_CHECKING:
    from .admission import Server

__all__ = [
    "BODY_EVENTS",
    "BODY_WAIT",
    "FREE_CHUNKS",
    "HEAD_WAIT",
    "INBOX",
    "MAX_HEAD",
    "MIN_CHUNK",
    "TURNED_AWAY",
    "TURN_AWAY_WAIT",
    "WRITE_WAIT",
    "Connection",
    "Handler",
]

log = logging.getLogger("affidavit.daemon")

Handler = Callable[[Request], Awaitable[None]]

MAX_HEAD = 16 * 1024
"""A request line and headers larger than this are refused (431): an API request has a few."""
HEAD_WAIT = 10.0
"""Seconds a request's head may take from its first byte, and a body may stall: a local client
writes a whole request at once, so only a stuck or hostile one comes near."""
BODY_WAIT = 30.0
"""Seconds a request's whole body may take from the end of its head (16 MiB over a local
socket takes milliseconds; a client dripping a byte just under ``HEAD_WAIT`` apart does not)."""
WRITE_WAIT = DELIVERY_WAIT
"""Seconds one answer's write may take: a client that does not read its answer loses it (the
clients' ``wire.DELIVERY_WAIT``: they wait as long for it)."""
TURN_AWAY_WAIT = 1.0
"""Seconds the 503 of a connection turned away (``admission.py``) may take to be written."""
INBOX = 64 * 1024
"""Bytes read ahead of the parser at most (see the module docstring)."""
JOINED = 64 * 1024
"""An answer's body up to this many bytes is written joined to its head, in one ``send_all``
(each write to a Unix socket wakes the reader: two per answer cost throughput, link.py); a
larger one is written after its head, never copied into one buffer with it."""
BODY_EVENTS = 256
"""h11 events (a body's chunks, or the parts a read brought them in) decoded at most between
two turns of the event loop (``body_chunk``)."""
FREE_CHUNKS = 1024
MIN_CHUNK = 256
"""A chunked body may hold ``FREE_CHUNKS`` chunks of any size; past them, its chunks must
average ``MIN_CHUNK`` bytes (a 16 MiB body may still come in 64 Ki chunks of 256 bytes), else 400
``CHUNKS_TOO_SMALL`` (field ``body``), then close: each chunk costs the event loop an h11 event
whatever its size."""
_RECV = 64 * 1024
_REFUSED = {
    400: ("BAD_REQUEST", "malformed request"),
    431: ("HEAD_TOO_LARGE", f"request head over {MAX_HEAD} bytes"),
    # RFC 9112 section 6.1: a transfer coding the server does not understand is "501 (Not
    # Implemented)".  h11 reads chunked alone, and one Transfer-Encoding field.
    501: (
        "TRANSFER_ENCODING_REFUSED",
        "a transfer coding other than chunked (once) is not served here",
    ),
}
"""Status -> (code, message) of a request h11 refuses; its ``error_status_hint`` is one."""


class Connection:
    """One client connection: h11's state, the reader's inbox, the answer's single write."""

    def __init__(self, server: Server, link: Link, peer: Peer) -> None:
        self.server = server
        self.link = link
        self.peer = peer
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        self._inbox = bytearray()
        self._eof = False
        """The reader saw the end of the stream (or a broken read)."""
        self._eof_fed = False
        self._bytes = trio.Event()  # set when the inbox gains bytes or the stream ends
        self._room = trio.Event()  # set when the parser drains the inbox
        self._head_only = False
        self.declared: int | None = None
        """The request's ``Content-Length``, if it declared one (h11 checked it is a number)."""
        self._body_by = 0.0
        """When the request's body must be whole (``BODY_WAIT`` after the end of its head)."""
        self.evicted = False
        """Closed while idle to make room for a new connection (``Server._evict``)."""
        self.other = False
        """Its peer is not an operator, where the server keeps places for them
        (``Server.reserved``): it counts among ``Server.others``."""
        self.asked = False
        """A request's head was read on this connection."""
        self._fed = 0
        """Bytes handed to h11 on this connection (``_consumed``)."""
        self._body_from: int | None = None
        self.body_wire = 0
        """Bytes of the request's body as sent, chunk framing included, read so far (counted
        when h11 runs out of data, and at the body's end: ``body_chunk``)."""
        self.body_data = 0
        self.chunks = 0
        self.tiny = False
        """A body of tiny chunks was refused on it (``_check_chunks``): the connection closes
        after the answer, its rest never read."""

    def unread(self) -> bool:
        """Bytes (or the end of the stream) are waiting: for the server task in the inbox, or
        for the reader in the socket (a request sent but not yet read is a request)."""
        if self._inbox or self._eof:
            return True
        try:
            poll = select.poll()
            poll.register(self.link.socket.fileno(), select.POLLIN)
            return bool(poll.poll(0))
        except (OSError, ValueError):
            return True  # not known to be idle

    # -- the reader task --------------------------------------------------------------------------

    async def read(self) -> None:
        while True:
            if len(self._inbox) >= INBOX:
                self._room = trio.Event()
                await self._room.wait()
                continue
            try:
                data = await self.link.receive_some(_RECV)
            except GONE:  # the link noted the hang-up
                data = b""
            if data:
                self._inbox += data
            else:
                self._eof = True
            self._bytes.set()
            if not data:
                return

    # -- the server task --------------------------------------------------------------------------

    async def _fill(self) -> None:
        """Hand h11 what the reader has read, waiting for it if there is nothing yet."""
        while not self._inbox and not self._eof:
            if self._bytes.is_set():
                self._bytes = trio.Event()
            await self._bytes.wait()
        self._feed()

    def _feed(self) -> None:
        if self._inbox:
            data, self._inbox = self._inbox, bytearray()
            self._fed += len(data)
            self.h11.receive_data(bytes(data))
            self._room.set()
        elif self._eof and not self._eof_fed:
            self._eof_fed = True
            self.h11.receive_data(b"")

    async def _next_event(self) -> h11.Event | type[h11.PAUSED]:
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event  # type: ignore[return-value]
            if self.h11.they_are_waiting_for_100_continue:
                await self._write(
                    self.h11.send(h11.InformationalResponse(status_code=100, headers=[]))
                )
            await self._fill()

    async def _request(self) -> h11.Request | None:
        """The next request's head, or None when the connection is to close."""
        event = self.h11.next_event()
        if event is h11.NEED_DATA:
            if not self._inbox and not self._eof and not self.h11.trailing_data[0]:
                # Idle (no byte of a next request held, here or in h11): wait for one, up to
                # keep_alive; shutdown ends the wait.  A head begun waits head_wait only.
                # At the connection cap, the longest idle is closed to make room (``_evict``).
                with trio.move_on_after(self.server.keep_alive) as idle:
                    self.server._idle[self] = idle
                    if self.server.closing:
                        idle.cancel()
                    try:
                        await self._fill()
                    finally:
                        self.server._idle.pop(self, None)
                if idle.cancelled_caught:
                    return None
            with trio.move_on_after(self.server.head_wait):
                event = await self._next_event()
        # Otherwise the peer closed (ConnectionClosed) or stalled mid-head (still NEED_DATA).
        return event if isinstance(event, h11.Request) else None

    async def serve(self, handler: Handler) -> None:
        while True:
            self._head_only, self.declared = False, None  # nothing of the last request's
            self._body_from, self.body_wire, self.body_data, self.chunks = None, 0, 0, 0
            try:
                head = await self._request()
            except h11.RemoteProtocolError as exc:
                if not self._eof:  # not a head cut short by a hang-up: nobody to tell
                    await self._refuse(exc)
                return
            if head is None:
                if self.evicted and not self.asked:
                    await self._turned_away()
                return
            self.asked = True
            self._head_only = head.method == b"HEAD"  # before any answer, a refusal too
            if _head_size(head) > MAX_HEAD:
                await self._refuse(h11.RemoteProtocolError("head too large", 431))
                return
            if head.http_version not in (b"1.0", b"1.1"):
                await self._refuse_version(head.http_version)
                return
            if head.method == b"CONNECT" or any(n == b"upgrade" for n, _ in head.headers):
                await self._refuse_switch(head.method == b"CONNECT")
                return
            if any(
                n == b"content-encoding" and v.strip().lower() != b"identity"
                for n, v in head.headers
            ):
                await self._refuse_encoding()
                return
            framing = _bad_framing(head)
            if framing is not None:
                await self._refuse_framing(*framing)
                return
            self._body_by = trio.current_time() + self.server.body_wait
            self.declared = _content_length(head)
            path, _, query = head.target.partition(b"?")
            req = Request(self, head.method.decode("ascii"), path.decode("ascii"), query, self.peer)
            try:
                await handler(req)
            except Exception:
                log.exception("a request to %r failed inside the daemon", req.path)
                if not req.answered and not self.link.hung_up.is_set():
                    await req.respond_problem(ApiProblem(500, "INTERNAL", "the daemon failed"))
            finally:
                self.server.drop_body(req.held, self.peer.uid, self.other)  # no longer held
            if not req.answered or not self._next_cycle():
                return

    def _next_cycle(self) -> bool:
        """After an answer: ready for the next request on this connection, or not."""
        if self.server.closing or self.link.hung_up.is_set() or self.link.broken:
            return False
        if self.h11.our_state is not h11.DONE or self.h11.their_state is not h11.DONE:
            return False
        self.h11.start_next_cycle()
        return True

    async def _refuse(self, exc: h11.RemoteProtocolError) -> None:
        """A request h11 could not parse: 400 -- or the status h11 hints, with a code of its
        own (``_REFUSED``) -- then close."""
        status = exc.error_status_hint if exc.error_status_hint in _REFUSED else 400
        code, message = _REFUSED[status]
        log.info("refused a malformed request from %s (%d)", self.peer.describe(), status)
        if self.h11.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        await self.answer(
            status,
            [(b"content-type", b"application/json")],
            api_error_body(code, message),
            close=True,
        )

    async def _turned_away(self) -> None:
        """Evicted before its first request: answered as if turned away (503, nothing read),
        so that a client whose request crosses the eviction reads that its request did not
        run rather than a bare close (the one-shot client of the command line connects, then
        sends).  One evicted between requests is closed without a word, as by ``keep_alive``."""
        with trio.move_on_after(TURN_AWAY_WAIT), contextlib.suppress(*GONE):
            await self.link.send_all(TURNED_AWAY)

    async def _refuse_switch(self, connect: bool) -> None:
        """CONNECT or ``Upgrade``: 501 before a route or the body, so that h11 (which would
        switch protocols on a 2xx to CONNECT, or a 101) never does; then close."""
        what = "a CONNECT" if connect else "an Upgrade"
        log.info("refused %s request from %s (501)", what, self.peer.describe())
        code, message = (
            ("CONNECT_REFUSED", "CONNECT is not served here")
            if connect
            else ("UPGRADE_REFUSED", "no protocol upgrade is served here (HTTP/1.1 only)")
        )
        await self.answer(
            501, [(b"content-type", b"application/json")], api_error_body(code, message), close=True
        )

    async def _refuse_encoding(self) -> None:
        """A body under a ``Content-Encoding`` (gzip...): 415 before a route reads it as the
        plain bytes it is not -- an action is JSON as sent, never decompressed -- then close."""
        log.info("refused an encoded request body from %s (415)", self.peer.describe())
        message = "a request body is sent as is: no Content-Encoding (gzip...) is accepted"
        await self.answer(
            415,
            [(b"content-type", b"application/json")],
            api_error_body("CONTENT_ENCODING_REFUSED", message),
            close=True,
        )

    async def _refuse_version(self, version: bytes) -> None:
        """A request line naming an HTTP version other than 1.0 or 1.1 (``HTTP/2.0``,
        ``HTTP/9.9``: h11 parses any ``HTTP/d.d`` as if it were 1.1): 505
        ``HTTP_VERSION_UNSUPPORTED`` before any route runs or a byte of a body is read, then
        close -- the framing of a message in a version this server does not speak is unknown
        (RFC 9110 section 15.6.6), and a call must never run on a guess of it."""
        log.info("refused a request in HTTP/%s from %s (505)", version, self.peer.describe())
        message = "this socket speaks HTTP/1.1 (and 1.0) only: the request was not run"
        await self.answer(
            505,
            [(b"content-type", b"application/json")],
            api_error_body("HTTP_VERSION_UNSUPPORTED", message),
            close=True,
        )

    async def _refuse_framing(self, message: str, field: str) -> None:
        """A body framed ambiguously (``_bad_framing``): 400 before a route or a byte of the
        body, then close.

        ``Content-Length`` beside ``Transfer-Encoding: chunked``: RFC 9112 section 6.1 lets a
        server reject such a request
        or read it by the chunked coding alone, and either way "MUST close the connection after
        responding"; section 6.3 says it "ought to be handled as an error" (a smuggling
        attempt).  Refused rather than read: no client of this socket sends both (ours, curl,
        the MCP proxy send one), and a call must never run on a body two framings disagree
        about -- which of them an intermediary between agent and socket honoured is unknowable
        here.

        ``Transfer-Encoding`` in an HTTP/1.0 request: section 6.1 again -- a server "MUST
        treat the message as if the framing is faulty" (1.0 has no chunked coding; an
        intermediary of 1.0 would have read the body to the close instead), and close after
        answering.  h11 read it chunked and the call was dispatched (audit 53)."""
        log.info("refused a request framed ambiguously from %s (400)", self.peer.describe())
        await self.answer(
            400,
            [(b"content-type", b"application/json")],
            api_error_body("AMBIGUOUS_FRAMING", message, field),
            close=True,
        )

    # -- what Request uses ------------------------------------------------------------------------

    async def body_chunk(self) -> bytearray | None:
        """The next piece of the request's body -- every byte of it h11 can decode from what is
        already read, joined, up to ``BODY_EVENTS`` h11 events -- or None once it is whole.

        One deadline scope per piece, not per h11 event, and the event loop runs between
        pieces (``trio.lowlevel.checkpoint``): a body of 1-byte chunks (6 bytes each as sent)
        was one event and one ``fail_at`` scope per chunk, ~11 000 of them per inbox drained
        without yielding -- four such clients took every other client's ``/v1/health`` from
        1.6 ms to 1.9 s (audit 50, tests/benchmarks/tiny_chunks.py).  ``body_wire`` counts the
        body's bytes as sent, its chunk framing included (what ``Request.body`` holds against
        the limits), and a chunked body past ``FREE_CHUNKS`` chunks averaging under
        ``MIN_CHUNK`` bytes is refused: 400 ``CHUNKS_TOO_SMALL``."""
        if self.h11.their_state is not h11.SEND_BODY:
            return None
        if self._body_from is None:  # the first piece: nothing of the body consumed yet
            self._body_from = self._consumed()
        stall = trio.current_time() + self.server.head_wait
        whole = stall >= self._body_by  # the whole body's deadline comes first
        try:
            with trio.fail_at(min(stall, self._body_by)):
                return await self._body_piece()
        except h11.RemoteProtocolError:
            if self._eof:
                raise ClientGone from None
            raise ApiProblem(400, "BAD_REQUEST", "the request body is malformed") from None
        except trio.TooSlowError:
            late = (
                f"was not whole {self.server.body_wait:g} s after its head" if whole else "stalled"
            )
            log.info("the request body from %s %s: 408, closed", self.peer.describe(), late)
            raise ApiProblem(408, "REQUEST_TIMEOUT", f"the request body {late}") from None

    async def _body_piece(self) -> bytearray | None:
        piece = bytearray()
        for _ in range(BODY_EVENTS):
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                self._count_wire()  # h11 holds at most a chunk's head undecoded now: cheap
                if piece:
                    return piece
                if self.h11.they_are_waiting_for_100_continue:
                    await self._write(
                        self.h11.send(h11.InformationalResponse(status_code=100, headers=[]))
                    )
                await self._fill()
            elif isinstance(event, h11.Data):
                piece += event.data
                self.body_data += len(event.data)
                if event.chunk_end:  # the whole chunk is in body_data, however it arrived
                    self.chunks += 1
                    self._check_chunks()
            elif isinstance(event, h11.EndOfMessage):
                self._count_wire()
                return piece or None
            else:
                raise ClientGone  # ConnectionClosed
        await trio.lowlevel.checkpoint()  # BODY_EVENTS events: let the other tasks run
        return piece

    def _check_chunks(self) -> None:
        if self.chunks > FREE_CHUNKS and self.body_data < self.chunks * MIN_CHUNK:
            self.tiny = True
            log.info(
                "refused a body of tiny chunks from %s (400, %d chunks)",
                self.peer.describe(),
                self.chunks,
            )
            message = (
                f"the body's chunks average under {MIN_CHUNK} bytes past the first "
                f"{FREE_CHUNKS}: send it in larger chunks, or with a Content-Length"
            )
            raise ApiProblem(400, "CHUNKS_TOO_SMALL", message, "body")

    def _consumed(self) -> int:
        """The bytes of this connection h11 has parsed (fed, less what it still holds)."""
        return self._fed - len(self.h11.trailing_data[0])

    def _count_wire(self) -> None:
        if self._body_from is not None:
            self.body_wire = self._consumed() - self._body_from

    async def answer(
        self, status: int, headers: list[tuple[bytes, bytes]], body: bytes, *, close: bool
    ) -> None:
        """Write one whole answer: in one ``send_all`` up to ``JOINED`` bytes of body, past it
        the head then the body itself, never a copy of it -- joined, an answer was held twice
        its size while written (the body and the framed copy) where the answer budget counts
        it once (audit 48).  Both within one ``WRITE_WAIT``.  A failed write is noted by the
        link (``broken``) and swallowed: the caller judges delivery by it (app.py
        ``_deliver``)."""
        self._settle()
        headers.append((b"content-length", b"%d" % len(body)))
        if close or self.server.closing or self.h11.their_state is not h11.DONE:
            headers.append((b"connection", b"close"))
        conn = self.h11
        parts = [conn.send(h11.Response(status_code=status, headers=headers)) or b""]
        if body and not self._head_only:
            # Content-Length framing: h11 hands the body back as it was given, unframed.
            parts.extend(conn.send_with_data_passthrough(h11.Data(data=body)) or ())
        parts.append(conn.send(h11.EndOfMessage()) or b"")  # b"" under Content-Length
        if len(body) <= JOINED:
            await self._write(b"".join(parts))
        else:
            await self._write(*parts)

    async def answer_parts(
        self,
        status: int,
        headers: list[tuple[bytes, bytes]],
        length: int,
        parts: AsyncIterator[bytes],
        *,
        close: bool = False,
    ) -> None:
        """``answer``, its body ``length`` bytes written a part at a time as ``parts`` yields
        them, each within ``WRITE_WAIT`` (a stored result's: app.py ``Api.result``).  A part
        raising, or a write failing, leaves the answer cut short -- the link ``broken``, the
        connection closed after it -- and the exception (not the write's failure) raised."""
        self._settle()
        headers.append((b"content-length", b"%d" % length))
        if close or self.server.closing or self.h11.their_state is not h11.DONE:
            headers.append((b"connection", b"close"))
        await self._write(self.h11.send(h11.Response(status_code=status, headers=headers)) or b"")
        if not self._head_only:
            try:
                async for part in parts:
                    if self.link.broken:
                        return
                    await self._write(self.h11.send(h11.Data(data=part)) or b"")
            except BaseException:
                self.link.broken = True  # cut short: never a next request on it
                raise
        if not self.link.broken:
            await self._write(self.h11.send(h11.EndOfMessage()) or b"")

    def _settle(self) -> None:
        """Read the rest of a request's body if it is already here (a route that answers
        without reading it): then the connection may stay open.  At most ``BODY_EVENTS`` h11
        events, synchronously: a rest of tiny chunks leaves the connection to close instead."""
        for _ in range(BODY_EVENTS):
            if self.tiny or self.h11.their_state is not h11.SEND_BODY:
                return
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError:
                return
            if event is h11.NEED_DATA:
                if not self._inbox:
                    return
                self._feed()

    async def _write(self, *parts: bytes) -> None:
        """Write ``parts`` in turn, all within one ``WRITE_WAIT``; a write that failed or timed
        out leaves the link ``broken`` (so not delivered, and the connection closes after this
        request), and no later write is tried on it."""
        if self.link.broken:
            return
        with trio.move_on_after(self.server.write_wait) as late, contextlib.suppress(*GONE):
            for data in parts:
                if data:
                    await self.link.send_all(data)
        if late.cancelled_caught:
            log.info(
                "%s did not take its answer within %g s: the connection is closed",
                self.peer.describe(),
                self.server.write_wait,
            )


TURNED_AWAY_BODY = api_error_body(
    "TOO_MANY_CONNECTIONS",
    "the daemon has too many open connections: the request was not read; try again later",
)
TURNED_AWAY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(TURNED_AWAY_BODY), TURNED_AWAY_BODY)
)
"""The answer to a connection over ``MAX_CONNECTIONS``, whatever it asks (nothing is read)."""


def _content_length(head: h11.Request) -> int | None:
    for name, value in head.headers:
        if name == b"content-length":
            return int(value)
    return None


def _bad_framing(head: h11.Request) -> tuple[str, str] | None:
    """Why the request's body framing is ambiguous, and the field to fix, or None:
    ``Transfer-Encoding`` in HTTP/1.0, or beside a ``Content-Length`` (h11 has refused any
    coding but one ``chunked``, and would read the body by it, ignoring the length)."""
    names = {name for name, _ in head.headers}
    if b"transfer-encoding" not in names:
        return None
    if head.http_version == b"1.0":
        return (
            "an HTTP/1.0 request has no Transfer-Encoding: send HTTP/1.1, or a Content-Length "
            "alone (RFC 9112 section 6.1)",
            "headers.transfer-encoding",
        )
    if b"content-length" in names:
        return (
            "a request body is framed by Content-Length or Transfer-Encoding: chunked, never "
            "both (RFC 9112 section 6.1)",
            "headers.content-length",
        )
    return None


def _head_size(head: h11.Request) -> int:
    """About the bytes of a request's head.  h11's ``max_incomplete_event_size`` bounds only a
    head still incomplete in its buffer; one that arrived whole in one read is measured here."""
    return len(head.method) + len(head.target) + sum(len(n) + len(v) + 4 for n, v in head.headers)
