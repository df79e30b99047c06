"""One hop: a request written and its response read on one connection, through ``HttpExchange``
(sans-IO, ``machine.py``).

The steps, in order (``exchange()``):

1. ``pass_gate`` -- the engine's dispatch gate is awaited before the first request byte, on
   fresh and pooled connections alike; if it raises, nothing was written and the connection
   goes back to the pool.
2. ``transfer`` -- write the head (and, with ``Expect: 100-continue``, wait a bounded time for
   the interim answer), write the body -- watching for an early final response meanwhile
   (``send_body``, ``early.py``: a complete one read before the body is written whole ends the
   write and answers the hop; the connection is never pooled) -- read until the response is
   complete.  Every received byte goes through ``handle``: observed, hashed, and sent to the
   sink (or buffered, for a 3xx about to be followed) as its head's ``Plan`` decided.
3. on failure, ``interrupted`` -- the attempt ended after the boundary: the code follows what
   the machine proved (bytes of a final response arrived: REMOTE_RESULT_INCOMPLETE; otherwise
   REMOTE_OUTCOME_UNKNOWN).  A reused connection's write error after the gate is ``unknown``
   too: "A failed write says almost nothing about what the other side has already read" (seed).
   A body past the target's ``max_result`` (the sink raises ``ResultTooLarge``) ends the hop
   too: RESULT_SIZE_LIMIT, the connection closed.
   A hop sent without the credential whose head is a refusal (``redirects.py``) stops at that
   head: ``HopRefused``, its body never read, the connection closed.
4. ``finish`` -- a reusable connection (nothing read past the response, in h11 or in the TLS
   layer) goes back to the pool, any other is closed.

Every connection is checked after the gate, right before its first byte: holding unread bytes
then (sent before the request was written, so never its answer; over TLS, anything but a TLS
1.3 server's session tickets, a close_notify or an alert included), it is dropped unwritten as a
setup failure at stage ``reused_connection`` (a pooled one) or ``peer_spoke_first`` (a fresh
one).  Cancelled while that check waits for a TLS ticket's rest, it is dropped unwritten too,
the step ``setup_fail`` at stage ``ticket_wait`` saying so, and the cancellation propagates.
"""

from __future__ import annotations

import hashlib
import math
import select
from dataclasses import dataclass, field
from typing import Any, Final

import trio

from affidavit.adapters.base import AttemptContext, AttemptInterrupted, ResultTooLarge
from affidavit.statemachine import Code

from .classify import (
    Redactor,
    evidence_from,
    header_value,
    is_conditional,
    is_proxy_answer,
    parse_proxy_status,
)
from .connect import READ_SIZE, Connection, errno_name, setup_failed
from .early import EarlyResponse
from .machine import FramingError, HttpExchange, Observation
from .pool import Pool
from .redirects import Plan, plan_response
from .request import HttpRequest
from .urls import Url

__all__ = ["HopRefused", "HopResult", "exchange"]

EXPECT_CONTINUE_WAIT: Final = 1.0
"""RFC 9110 §10.1.1: a client that sent ``Expect: 100-continue`` need not wait indefinitely."""
MAX_READ_SIZE: Final = 1024 * 1024
"""The most one read asks for: reads start at ``READ_SIZE`` and double while they come back
full (a large body is waiting), so a 50 MiB response takes ~50 reads instead of 800 -- each
paying the trio wake-up, the h11 event, the protocol step, the redactor's scan setup and the
hashes once (issue 15); a small response allocates no more than before.  1 MiB measured best:
256 KiB cost the reading task ~15% more CPU on a 50 MiB body, 2 and 4 MiB more again (each
read's buffers are fresh allocations, and the writer thread waits longer for the GIL while the
redactor scans one)."""
REDIRECT_BODY_BUFFER: Final = 64 * 1024
"""Bytes of a to-be-followed 3xx body kept in case the next hop cannot be set up and the 3xx
becomes the result after all."""
_DROP_REQUEST_HEADERS: Final = frozenset({"host", "content-length", "transfer-encoding", "expect"})
_WITH_BODY: Final = frozenset({"POST", "PUT", "PATCH"})
WATCH_FROM: Final = 64 * 1024
"""A body (with its framing) longer than this is written with a reader beside it
(``send_body``); a shorter one goes to the socket buffers at once."""
DRAIN_WAIT: Final = 1.0
"""The most time spent reading what is readable after a failed write (``_drain``)."""
_IO_ERRORS: Final = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


class _StopAtHead(Exception):
    """The final head decided the hop is refused (``Plan.disposition``): nothing more of the
    response is read."""


class HopRefused(Exception):
    """A hop sent without the credential answered with a refusal (``Plan.disposition``
    ``refused``), stopped at its head; ``summary``: its hop, method, origin and status --
    secret-free, what ``redirect_not_followed`` names."""

    def __init__(self, summary: dict[str, Any]) -> None:
        super().__init__("next hop refused")
        self.summary = summary


@dataclass(frozen=True, slots=True)
class _Head:
    """The request line and headers as they will be written (the credential in them: neither is
    in ``repr``)."""

    target: str = field(repr=False)
    headers: list[tuple[str, str]] = field(repr=False)
    has_body: bool
    expect_continue: bool


@dataclass
class HopResult:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    hop_summary: dict[str, Any]
    peer: dict[str, Any] | None
    body_bytes: int
    body_sha256: str
    buffered_body: bytes | None
    buffered_complete: bool
    http_version: str
    """The response's HTTP version as h11 parsed it."""
    conditional: bool
    """The request this hop wrote is one a 304 may answer (``classify.is_conditional``), judged
    on the method and headers as sent."""
    head_echoed: str | None = None
    """A head of this hop held a secret (``_head_echoed``): the result's record's word for the
    bytes received -- ``redacted`` (an echo), whatever its body ends with, or
    ``short_redacted`` when it held only a value under 8 bytes' forms (may be ordinary text)."""


async def exchange(
    pool: Pool,
    request: HttpRequest,
    ctx: AttemptContext,
    hop: int,
    method: str,
    target: Url,
    headers: list[tuple[str, str]],
    body: bytes,
    redactor: Redactor,
    plan: Plan,
    redirects: int,
) -> HopResult:
    """Run one hop; ``plan`` is filled in at the response head."""
    conn, reused = await pool.acquire(request, ctx, hop, target)
    h = _Hop(request, ctx, conn, reused, hop, method, target, redactor, plan, redirects)
    await h.pass_gate(pool, headers, body)
    try:
        unread = await conn.unread_bytes(request.timeouts.connect)
    except BaseException as e:
        # Nothing was written: the head made ahead is dropped unsent and the connection closed,
        # not left open.  Cancelled, it was in the wait for a ticket's rest (the check's only
        # checkpoint): the step says so (stage ``ticket_wait``), written with the attempt's
        # close by the engine's shielded cancellation path; the cause is the engine's to name
        # (the caller, a deadline, a shutdown), so only the exception's type is kept.  The
        # outcome stays ``unknown``: DISPATCH_STARTED is durable (docs/design-notes.md, "A
        # cancel in the ticket wait").  Anything else raised by the check is no wait's end and
        # claims no stage: it goes to the attempt's own failure path as it is.
        h.ahead = None
        if isinstance(e, trio.Cancelled):
            facts = {"stage": "ticket_wait", "connection": conn.id, "local_error": "Cancelled"}
            failed = h.ex.setup("setup_fail", facts)
            ctx.observe(failed.step, failed.facts)
        await trio.aclose_forcefully(conn.stream)
        raise
    if unread:
        # Bytes waiting now were sent before this request was written, so they can never be
        # its answer: nothing is written and the connection is dropped.  A pooled connection
        # was checked before the gate, but the gate (a durable journal write) took time; a
        # fresh one's peer may speak first (right after accepting, or after the TLS handshake).
        # On the first hop the engine still sees its own DISPATCH_STARTED and keeps the outcome
        # ``unknown``; on a redirect hop ``setup_failed`` raises ``HopSetupFailed`` and the
        # previous hop's complete 3xx stands as the result (``client.perform``).  Over TLS a
        # close_notify or an alert waiting counts too (the peer is done: a keep-alive that ran
        # out during the gate); a plain TCP EOF or reset in that window is left to the write
        # and read below: ``unknown`` as well.
        h.ahead = None  # the head made ahead, credential and all, is dropped unsent
        await trio.aclose_forcefully(conn.stream)
        raise setup_failed(
            ctx,
            hop,
            Code.SETUP_FAILED,
            "reused_connection" if reused else "peer_spoke_first",
            "peer sent bytes before the request was written",
            connection=conn.id,
        )
    conn.requests += 1
    hop_summary: dict[str, Any] = {
        "hop": hop,
        "method": method,
        "origin": target.origin,
        "connection": conn.id,
        "reused_connection": reused,
        "via_proxy": conn.via_proxy,
        "status": None,
    }
    try:
        await h.transfer(headers, body)
    except _StopAtHead:
        # A hop sent without the credential refused (redirects.py): its answer decides
        # nothing, so its body is not read -- neither held to max_result as if it were a
        # result, nor waited for when it stalls -- and the connection, a response still
        # running on it, is closed, never pooled.
        obs = h.ex.refuse()
        if obs is not None:
            ctx.observe(obs.step, obs.facts)
        await trio.aclose_forcefully(conn.stream)
        summary = {k: hop_summary[k] for k in ("hop", "method", "origin")}
        raise HopRefused({**summary, "status": h.ex.final_status}) from None
    except trio.TooSlowError:
        exc = h.interrupted("timed_out")
        await trio.aclose_forcefully(conn.stream)
        raise exc from None
    except FramingError as e:
        # ``receive`` already fired peer_closed / malformed; report what it fired.
        for o in e.observations:
            ctx.observe(o.step, o.facts)
        await trio.aclose_forcefully(conn.stream)
        raise h.interruption(str(e)) from None
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
        # trio wraps OS and TLS errors in BrokenResourceError; the cause's errno name is the
        # only detail kept (its text could echo request bytes in exotic stacks).
        exc = h.interrupted("transport_error", errno_name(e))
        await trio.aclose_forcefully(conn.stream)
        raise exc from None
    except ResultTooLarge as e:
        # The body passed max_result (the sink stored none of the piece that did): stop
        # reading, and the connection -- a response still running on it -- is never pooled.
        await trio.aclose_forcefully(conn.stream)
        raise h.too_large(e) from None
    except BaseException as e:
        # Cancellation (or a sink/observer failure) after dispatch: the remote may be
        # running; the engine classifies by ``machine.dispatched`` (seed: "Cancellation
        # after dispatch is not a preflight error").  Only the exception's type is kept.
        obs = h.ex.abort("cancelled", {"during": h.during, "local_error": type(e).__name__})
        if obs is not None:
            ctx.observe(obs.step, obs.facts)
        await trio.aclose_forcefully(conn.stream)
        raise
    await h.finish(pool)
    return h.result(hop_summary)


def _lone(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first exception in ``group`` that is not a cancellation, else its first one."""
    _cancelled, rest = group.split(trio.Cancelled)
    first = (rest or group).exceptions[0]
    return _lone(first) if isinstance(first, BaseExceptionGroup) else first


class _Hop:
    """The state of one hop's exchange: what has been received and where it went."""

    def __init__(
        self,
        request: HttpRequest,
        ctx: AttemptContext,
        conn: Connection,
        reused: bool,
        hop: int,
        method: str,
        target: Url,
        redactor: Redactor,
        plan: Plan,
        redirects: int,
    ) -> None:
        self.request = request
        self.ctx = ctx
        self.conn = conn
        self.reused = reused
        self.hop = hop
        self.method = method
        self.target = target
        self.redactor = redactor
        self.plan = plan
        self.redirects = redirects
        self.ex = HttpExchange(ctx.machine, conn.h11, hop)
        # Only TLS (opened with https_compatible=False) ends a stream with proof: close_notify.
        # (A plain ``SocketStream`` said so without the ABC's ``__instancecheck__``.)
        stream = conn.stream
        self.ex.eof_ends_body = type(stream) is not trio.SocketStream and isinstance(
            stream, trio.SSLStream
        )
        forward_proxy = conn.forward_proxy
        self.ex.proxy_judge = lambda status, hdrs: is_proxy_answer(
            status, hdrs, via_forward_proxy=forward_proxy
        )
        self.ex.head_echoed = self._head_echoed
        self.during = "write"
        """What the hop was doing (write, expect_continue, read): reported when it fails."""
        self._sha: Any = None
        self.sink_hashes: bool | None = None
        """The body goes to the sink, which hashes what it is given anyway (``ctx.fed``): the
        wire hash is the sink's, not a second pass over every byte here (issue 15).  Decided
        at the first body byte, only if the sink's body stream is still empty then."""
        self.sunk = 0
        self.read_past = 0
        """Body bytes of a response that is not the result (a 3xx followed, a proxy's own
        error): not stored, but held to ``ctx.result_limit`` like a result -- never read without
        end."""
        self.buffered = bytearray()
        self.buffered_complete = True
        self.head: Observation | None = None
        self.conditional = False
        """The request head written is conditional (``HopResult.conditional``)."""
        self.ahead: tuple[_Head, tuple[dict[str, Any], bytes]] | None = None
        """The request head made while the gate's barrier committed (``prepare``), not sent."""
        # One cancel scope for the whole exchange (made by ``transfer``), re-armed per phase
        # (``io.deadline``), instead of a new ``fail_after`` scope per handoff and per read: a
        # stalled peer still times out per write and per read (``Timeouts``), at a fraction of
        # the cost.  The deadline is lifted while received bytes are handled: the sink's
        # journal writes are not the peer's silence.
        self.io: trio.CancelScope | None = None
        self.read_size = READ_SIZE
        self.body_cut = False
        self.refused_early = False
        """An error answer's head (>= 400) was read before the body was written whole: the
        connection is never pooled (a non-compliant server may hold the unread body on it)."""
        """A complete final response was read before the body was written whole
        (``send_body``): the connection is never pooled, its request unfinished."""

    @property
    def sha(self) -> Any:
        """The hasher of this hop's body bytes where the sink does not hash them (``_sink``),
        or of bytes that are not the result: made on first use -- a hop whose body the sink
        hashes makes none (issue 15)."""
        if self._sha is None:
            self._sha = hashlib.sha256()
        return self._sha

    # -- 1. the dispatch gate -------------------------------------------------------------------

    async def pass_gate(self, pool: Pool, headers: list[tuple[str, str]], body: bytes) -> None:
        """Await the gate; while its barrier commits (the journal's fsync, the loop otherwise
        idle: issue 15), ``prepare`` makes the request head's bytes -- the credential in them --
        into ``self.ahead``.  Nothing is written before the gate returns."""
        ctx, conn = self.ctx, self.conn
        if not ctx.machine.crosses_dispatch("send_headers"):
            return

        def prepare() -> None:
            try:
                head = self.request_head(headers, body)
                encoded = self.ex.encode_request(
                    self.method, head.target, head.headers, has_body=head.has_body
                )
            except Exception:
                return  # made again after the gate, which raises it as it always did
            self.ahead = (head, encoded)

        gate_facts = {
            "hop": self.hop,
            "origin": self.target.origin,
            "connection": conn.id,
            "reused_connection": self.reused,
            "peer": conn.peer,
            "via_proxy": conn.via_proxy,
        }
        try:
            await ctx.gate(gate_facts, meanwhile=prepare)
        except BaseException:
            # Nothing was written.  The head made ahead (the barrier failed after its rows
            # were written) is dropped unsent; h11 heard of it, so the connection is closed.
            # Refused before that, h11 never heard of the request: the connection is as good as
            # before and goes back to the pool.
            self.ahead = None
            obs = self.ex.setup("gate_refused", {"connection": conn.id})
            ctx.observe(obs.step, obs.facts)
            if self.ex.untouched:
                pool.release(conn)
            else:
                await trio.aclose_forcefully(conn.stream)
            raise

    # -- 2. write the request, read the response ------------------------------------------------

    def request_head(self, headers: list[tuple[str, str]], body: bytes) -> _Head:
        has_body = bool(body) or self.method in _WITH_BODY
        out = [(n, v) for n, v in headers if n.lower() not in _DROP_REQUEST_HEADERS]
        out.insert(0, ("Host", self.target.authority))
        if has_body:
            out.append(("Content-Length", str(len(body))))
        expect = self.request.expect_continue and bool(body)
        if expect:
            out.append(("Expect", "100-continue"))
        target = self.target
        req_target = target.absolute if self.conn.forward_proxy else target.path_query
        return _Head(req_target, out, has_body, expect)

    async def transfer(self, headers: list[tuple[str, str]], body: bytes) -> None:
        """Write the request and read the response to its end (``trio.TooSlowError`` when a
        write or a wait for bytes outlasts its limit).  The head is the one made ahead
        (``pass_gate``), else made now."""
        ctx, ex, stream = self.ctx, self.ex, self.conn.stream
        ahead, self.ahead = self.ahead, None
        head, encoded = ahead if ahead is not None else (self.request_head(headers, body), None)
        del ahead
        # Only the caller's own request (the first hop): a redirect hop carries the caller's
        # validators to another resource (``redirects.next_hop``), which a 304 there does not
        # answer for.
        self.conditional = self.hop == 1 and is_conditional(self.method, head.headers)
        expect = head.expect_continue
        t = self.request.timeouts
        # Made armed with the write's limit (nothing awaits before the write): one deadline
        # change less per call than arming it after entering (issue 15).
        io = self.io = trio.CancelScope(deadline=trio.current_time() + t.write)
        with io:
            obs, data = ex.start_request(
                self.method, head.target, head.headers, has_body=head.has_body, encoded=encoded
            )
            encoded = None
            ctx.observe(obs.step, obs.facts)
            await stream.send_all(data)
            if expect:
                self.during = "expect_continue"
                # The wait bounds the peer's silence only: what it sends in time is handled
                # outside it, so the sink (blocked by the journal's back-pressure) is never
                # cancelled out of bytes the exchange then counts as received.
                until = trio.current_time() + min(t.read, EXPECT_CONTINUE_WAIT)
                while not ex.informational_seen and not ex.final_response_started:
                    got: bytes | None = None
                    with trio.move_on_at(until):
                        got = await self._receive(t.read)
                    if got is None:
                        io.deadline = math.inf
                        break
                    await self._take(got)
            if not ex.final_response_started:
                self.during = "write"
                io.deadline = math.inf  # the write has its own (``send_body``)
                await self.send_body(ex.body_bytes(body), t.write)
            self.during = "read"
            # Bounded by the peer's bytes: a read returning the end of stream (``b""``, at once
            # on a closed socket) leaves the exchange finished or raises ``FramingError`` --
            # never waiting for more (``HttpExchange.stream_ended``; a switch of protocols,
            # after which h11 only pauses, ends it at its head: audit 48b #4).
            while not ex.finished:
                await self._read_some(t.read)
        if io.cancelled_caught:
            if self.during == "write" and await self._answered_unwatched():
                return
            raise trio.TooSlowError

    async def _answered_unwatched(self) -> bool:
        """A short body's write (under the hop's deadline, ``send_body``) timed out: drained
        outside the cancelled scope, a complete final response waiting answers the hop as a
        failed write's does (``_cut``)."""
        early = self._early()
        await self._drain(early)
        if not early.complete:
            return False
        await self._cut(early)
        return self.ex.finished

    async def send_body(self, tail: bytes, limit: float) -> None:
        """Write the body and its framing within ``limit`` seconds, watching for an early final
        response (``early.py``): a body past ``WATCH_FROM`` is written while what the peer sends
        is read (trio's streams, ``SSLStream`` included, allow one sender and one receiver at
        once), and a complete error answer (>= 400, RFC 9112 §9.5) read meanwhile stops the
        write -- unless ``send_all`` returned in the same scheduling round: the body was then
        written whole and the normal path runs, the connection unpooled (``refused_early``).  A
        complete 2xx/3xx only stops the reader, the write goes on.  A write that fails or times
        out, over plain TCP, drains what is already readable (a peer that answered and reset
        the connection left its answer in the receive queue).  A complete final response so
        read, or read by the watcher, is the hop's answer, fed to the machine now (``send_body``
        never fired: the body was not written whole; the response head's facts say
        ``request_body_cut``) and the connection never pooled (``body_cut``); anything less is
        not fed and the write's failure stands as before.  Written whole, ``send_body`` fires,
        then whatever was read meanwhile is fed.  A short body (the socket buffers take it at
        once) is written plainly under the hop's deadline: nothing is built for it unless its
        write fails."""
        ctx, ex, conn = self.ctx, self.ex, self.conn
        early: EarlyResponse | None = None
        failed: BaseException | None = None
        timed_out = False
        written = True
        if len(tail) <= WATCH_FROM:
            if tail:
                io = self.io
                assert io is not None  # (``transfer``'s)
                io.deadline = trio.current_time() + limit
                try:
                    await conn.stream.send_all(tail)
                except _IO_ERRORS as e:
                    failed = e
                io.deadline = math.inf
        else:
            early = self._early()
            written = False  # stays so if the timer cancels the write
            with trio.move_on_after(limit) as timer:
                failed, written = await self._send_watched(tail, early)
            timed_out = timer.cancelled_caught and not written
        if failed is not None or timed_out:
            if early is None:
                early = self._early()
            if not early.complete:
                await self._drain(early)
            if early.complete:
                await self._cut(early)
                return
            if failed is None:
                raise trio.TooSlowError
            raise failed
        if not written:  # a refusal read cut the write (``_send_watched``)
            assert early is not None and early.refusal
            await self._cut(early)
            return
        # Written whole, although a refusal may have been read in the same scheduling round
        # (trio's checkpoint after the last send): the normal path.  An error answer whose head
        # came before the body was written whole leaves the connection unpooled
        # (``refused_early``): a server that did not want the body may not have read it.
        if early is not None and early.status >= 400:
            self.refused_early = True
        obs = ex.body_written()
        ctx.observe(obs.step, obs.facts)
        if early is not None:
            if early.data:
                await self._take(bytes(early.data))
            if early.eof:
                await self._take(b"")

    def _early(self) -> EarlyResponse:
        # The exchange's h11 may hold the start of a response (after an interim one read in
        # the expect-continue wait): parsed first.
        return EarlyResponse(self.method, bytes(self.conn.h11.trailing_data[0]))

    async def _cut(self, early: EarlyResponse) -> None:
        """``early``, complete, answers the hop although the body was not written whole."""
        self.body_cut = True
        self.ex.request_body_cut = True
        await self._take(bytes(early.data))

    async def _send_watched(
        self, tail: bytes, early: EarlyResponse
    ) -> tuple[BaseException | None, bool]:
        """``send_all(tail)`` with a reader beside it filling ``early``; the write's error, if
        it failed, and whether ``send_all`` returned (the body written whole, even when a
        refusal was read in the same round).  A complete error answer read cancels the write
        (``EarlyResponse.refusal``); a complete 2xx/3xx stops the reader only."""
        conn = self.conn
        failed: BaseException | None = None
        written = False

        async def write() -> None:
            nonlocal failed, written
            try:
                await conn.stream.send_all(tail)
                written = True
            except _IO_ERRORS as e:
                failed = e
            n.cancel_scope.cancel()  # the reader is done too: the read after the write follows

        async def watch() -> None:
            while not early.done:
                try:
                    data = await conn.receive_some(READ_SIZE)
                except _IO_ERRORS:
                    return  # the write, or the read after it, says so
                early.add(data)
            if early.refusal:
                n.cancel_scope.cancel()

        try:
            async with trio.open_nursery() as n:
                n.start_soon(write)
                n.start_soon(watch)
        except BaseExceptionGroup as group:
            # Both tasks keep their I/O errors; what is left (a cancellation from outside, an
            # interrupt) leaves as the lone write's would have, so the abort's facts name it
            # (``local_error``), not the group.
            raise _lone(group) from None
        return failed, written

    async def _drain(self, early: EarlyResponse) -> None:
        """After a failed write over plain TCP: read what is readable now, without waiting for
        more, bounded in bytes (``EARLY_BYTES``) and time.  Over TLS a failed write leaves the
        stream broken; what the reader got before it is all there is."""
        conn = self.conn
        if type(conn.stream) is not trio.SocketStream:
            return
        with trio.move_on_after(DRAIN_WAIT):
            while not early.done:
                try:
                    fd = conn.socket_stream.socket.fileno()
                    readable, _w, _x = select.select([fd], [], [], 0)
                    if not readable:
                        return
                    data = await conn.receive_some(READ_SIZE)
                except (*_IO_ERRORS, ValueError):
                    return
                early.add(data)

    async def _read_some(self, limit: float) -> None:
        # ``data`` stays referenced while it is handled, as the read's buffer always was: freed
        # before, a 1 MiB read's memory went back to the system and the next read faulted in
        # fresh pages (+70 ms of CPU over a 50 MiB body, measured).
        data = await self._receive(limit)
        await self._take(data)

    async def _take(self, data: bytes) -> None:
        """``data``'s steps, handled one body piece at a time: a piece past ``max_result``
        stops the hop before an end of message read with it fires, so the abort
        (``closed_early``, ``http.result_size_limit``) is recorded whether the body crossed the
        limit in one read or over several."""
        ex = self.ex
        await self._handle(ex.receive(data, piecewise=True))
        # A final head with faulty framing (``HttpExchange.framing_fault``) stopped the read at
        # itself: handled above (a refusal at it stops the hop there), it ends the exchange now.
        ex.faulty_framing()
        while ex.held:
            await self._handle(ex.more())

    async def _receive(self, limit: float) -> bytes:
        """One read, within ``limit`` seconds of the peer's silence."""
        io = self.io
        assert io is not None  # (``transfer``'s)
        io.deadline = trio.current_time() + limit
        size = self.read_size
        data = await self.conn.receive_some(size)
        io.deadline = math.inf
        if len(data) == size and size < MAX_READ_SIZE:
            self.read_size = size * 2
        return data

    async def _handle(self, observations: list[Observation]) -> None:
        ctx, plan = self.ctx, self.plan
        for i, obs in enumerate(observations):
            ctx.observe(obs.step, obs.facts)
            if obs.status is not None:
                self.head = obs
                plan_response(
                    self.request,
                    plan,
                    self.method,
                    self.target,
                    obs,
                    self.conn.forward_proxy,
                    self.redirects,
                    self.redactor,
                )
                if plan.disposition == "refused":
                    # Steps h11 fired past the head in the same read are reported; their bytes
                    # are not handled.
                    for rest in observations[i + 1 :]:
                        ctx.observe(rest.step, rest.facts)
                    raise _StopAtHead
            if not obs.data:
                continue
            if plan.disposition == "sink":
                await self._sink(obs.data)
                continue
            self.read_past += len(obs.data)
            limit = ctx.result_limit
            if limit is not None and self.read_past > limit:
                if ctx.withhold is not None:
                    # A body read past and never scanned (a followed 3xx's, a proxy's own
                    # error's): its count is told nowhere a caller reads (engine/echoed.py).
                    ctx.withhold("body")
                raise ResultTooLarge(limit, self.read_past)
            self.sha.update(obs.data)
            if plan.disposition == "follow":
                if len(self.buffered) + len(obs.data) <= REDIRECT_BODY_BUFFER:
                    self.buffered.extend(obs.data)
                else:
                    self.buffered_complete = False

    async def _sink(self, data: bytes) -> None:
        ctx = self.ctx
        if self.sink_hashes is None:  # the hop's first body byte
            fed = ctx.fed
            self.sink_hashes = fed is not None and fed("body")[0] == 0
        if not self.sink_hashes:
            self.sha.update(data)
        self.sunk += len(data)
        await ctx.sink("body", data)

    # -- 3. how a dispatched hop ends without a response --------------------------------------

    def interrupted(self, event: str, errname: str | None = None) -> AttemptInterrupted:
        """Fire ``event`` (timed_out, transport_error) and build the interruption."""
        obs = self.ex.abort(event, {"during": self.during, "error": errname})
        if obs is not None:
            self.ctx.observe(obs.step, obs.facts)
        what = {"timed_out": "timed out", "transport_error": "transport failed"}[event]
        return self.interruption(f"{what} during {self.during}")

    def too_large(self, exc: ResultTooLarge) -> AttemptInterrupted:
        """Fire ``result_size_limit`` and build the interruption: RESULT_SIZE_LIMIT, with the
        limit and the bytes received beside this hop's facts."""
        facts = {"during": self.during, **exc.facts}
        obs = self.ex.abort("result_size_limit", facts)
        if obs is not None:
            self.ctx.observe(obs.step, obs.facts)
        out = self.interruption(exc.detail)
        return AttemptInterrupted(exc.code, exc.detail, {**out.facts, **exc.facts})

    def _head_echoed(self) -> str | None:
        """Whether a response head of this hop holds a secret: one parsed (``ex.heads``: every
        interim and final head, kept before any abort -- its reason, its header fields), the
        bytes received before a final head was parsed (``ex.head_bytes``: a head h11 refused
        has left its buffer), or the bytes received and not parsed yet (a head cut short) --
        as sent or in any form the streams are redacted of (``AttemptContext.holds``).  Its
        word: ``redacted``, or ``short_redacted`` when what held one held only a short value's
        forms (``AttemptContext.head_word``); None when no head held any."""
        red, ex, holds = self.redactor, self.ex, self.ctx.holds

        def seen(lines: list[str]) -> bool:  # as sent, or another form (a base64: ``holds``)
            # One ``holds`` per head (``holds_any``: each line's bytes alone, one search).
            return any(map(red.contains, lines)) or (holds is not None and holds(lines))

        held = [[reason, *(f"{n}: {v}" for n, v in fields_)] for reason, fields_ in ex.heads]
        if ex.head_bytes:
            held.append([bytes(ex.head_bytes).decode("latin-1")])
        unparsed = self.conn.h11.trailing_data[0]
        if unparsed:
            held.append([bytes(unparsed).decode("latin-1")])
        held = [lines for lines in held if seen(lines)]
        if not held:
            return None
        word = self.ctx.head_word
        return "redacted" if word is None else word(t for lines in held for t in lines)

    def interruption(self, detail: str) -> AttemptInterrupted:
        ex, conn = self.ex, self.conn
        # The last proven boundary decides (seed): bytes of a final response arrived -> that
        # result was cut short; otherwise nothing of a result is known at all.
        code = Code.REMOTE_RESULT_INCOMPLETE if ex.response_started else Code.REMOTE_OUTCOME_UNKNOWN
        # Through a forward proxy our transport only ever saw the proxy's socket; through a
        # CONNECT tunnel it spoke TLS with the origin itself.
        hop = "proxy" if conn.forward_proxy else "origin"
        ps = None
        if ex.proxy_response:
            # A proxy's own error (judged at its head) is never a result of the origin's, whole
            # or not: the origin's outcome is unknown, as for the whole error (``client.py``),
            # its Proxy-Status beside it -- not a result cut short.
            code, hop = Code.REMOTE_OUTCOME_UNKNOWN, "proxy"
            fields_ = ex.heads[-1][1]
            ps = self.redactor.scrub_parsed(
                parse_proxy_status(header_value(fields_, "proxy-status"))
            )
        facts = {
            "hop": hop,
            "evidence_from": evidence_from(
                hop, proxy=conn.via_proxy, status=ex.final_status, proxy_status=ps
            ),
            "via_proxy": conn.via_proxy,
            "hop_number": ex.hop,
            "connection": conn.id,
            "reused_connection": self.reused,
            "during": self.during,
            **ex.progress(),
        }
        if ex.proxy_response:
            facts.update(status=ex.final_status, proxy_status=ps)
        return AttemptInterrupted(code, detail, facts)

    # -- 4. the connection afterwards, and the hop's result -----------------------------------

    async def finish(self, pool: Pool) -> None:
        assert self.head is not None and self.head.status is not None
        conn = self.conn
        # h11's buffer (``reusable``) and the TLS layer's (``tls_buffered``) must both be empty:
        # bytes past the response in either would answer the next request on this connection.
        reuse = not self.body_cut and not self.refused_early
        if reuse and self.ex.reusable and not conn.tls_buffered():
            conn.h11.start_next_cycle()
            pool.release(conn, self.head.headers)
        else:
            await trio.aclose_forcefully(conn.stream)

    def _body_sha256(self) -> str:
        """The hex SHA-256 of the body bytes received in this hop."""
        if not self.sink_hashes:
            mine: str = self.sha.hexdigest()
            return mine
        assert self.ctx.fed is not None
        fed, digest = self.ctx.fed("body")
        if fed != self.sunk:  # the sink's stream is this hop's body, or the hash is not its
            raise AssertionError(f"the sink holds {fed} body bytes, this hop sank {self.sunk}")
        return digest

    def result(self, hop_summary: dict[str, Any]) -> HopResult:
        head = self.head
        assert head is not None and head.status is not None
        hop_summary["status"] = head.status
        return HopResult(
            status=head.status,
            reason=head.reason,
            headers=list(head.headers),
            hop_summary=hop_summary,
            peer=self.conn.peer,
            body_bytes=self.ex.body_bytes_received,
            body_sha256=self._body_sha256(),
            buffered_body=bytes(self.buffered) if self.plan.disposition == "follow" else None,
            buffered_complete=self.buffered_complete,
            http_version=self.ex.http_version,
            conditional=self.conditional,
            head_echoed=self._head_echoed(),
        )
