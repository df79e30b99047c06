"""``affidavit.Client``: the broker daemon (``affidavit serve``) from Python, under trio.

    async with affidavit.Client.open("/run/affidavit/affidavit.sock") as client:
        envelope = await client.call({"target": "billing", "method": "GET", "path": "/v1/x"})
        again = await client.fetch_result(envelope["invocation_id"])   # a read, never a re-run

The same ``call`` / ``fetch_result`` / ``record`` as ``Broker``, so ``affidavit.sdk.call_checked``
takes either; the caller holds no secret, journal or config -- only the socket.  Records and
events come back as the plain JSON ``affidavit record --json`` prints (the daemon's process owns
the journal; no ``Record`` object crosses the socket).

Keep-alive connections are pooled (one per concurrent request).  A call is never re-sent by the
client: if the connection breaks before the answer, ``AnswerLost`` says so and the daemon keeps
what happened (seed, "A result delivery error must not repeat execution").  Reads (``GET``) are
retried once on a fresh connection when a pooled one turns out closed before any answer byte.
A connection the daemon closed before reading the whole request, having answered first (503
``TOO_MANY_CONNECTIONS`` at its connection cap: nothing read, nothing run), breaks the send;
that answer, if it is there whole, is the answer (``ApiError``), never ``AnswerLost``.
"""

from __future__ import annotations

import json
import os
import select
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import quote

import h11
import trio

from .pages import read_pages, read_record_pages
from .wire import (
    AFTER_BROKEN_SEND,
    DELIVERY_WAIT,
    EVENTS_LIMIT,
    HEADERS,
    MAX_COUNT,
    MAX_RESULT_PAGE_CHUNKS,
    READ_SIZE,
    AnswerLost,
    ApiError,
    DaemonUnavailable,
    NotSent,
    Response,
    answer_cap,
    answer_wait,
    approval_path,
    check_envelope,
    check_peer,
    check_socket,
    check_timeout,
    health_wait,
    invocation_path,
    parse_daemon_uid,
    read_wait,
    retry_after_of,
    socket_path,
    target,
    unreachable,
)

__all__ = ["Client", "ResponseReader", "encode_request"]


def _timeout(value: float | None) -> float | None:
    """``check_timeout``, its refusal a ``NotSent``: the request was never sent."""
    try:
        return check_timeout(value)
    except ValueError as exc:
        raise NotSent(str(exc)) from None


def encode_request(
    conn: h11.Connection, method: str, request_target: str, body: bytes | None = None
) -> bytes:
    """One request on a keep-alive connection, through h11."""
    headers = list(HEADERS)
    if body is not None:
        headers += [("content-type", "application/json"), ("content-length", str(len(body)))]
    data = conn.send(h11.Request(method=method, target=request_target, headers=headers)) or b""
    if body:
        data += conn.send(h11.Data(data=body)) or b""
    data += conn.send(h11.EndOfMessage()) or b""
    return data


class ResponseReader:
    """Feeds received bytes to h11 until one whole response has arrived; one whose body would
    be longer than ``cap`` (``wire.answer_cap``) is ``AnswerLost`` before its body is read."""

    def __init__(self, conn: h11.Connection, cap: int | None = None) -> None:
        self._conn = conn
        self._cap = cap
        self.head = False
        """The answer's head has arrived."""
        self._status = 0
        self._type = ""
        self._retry_after: int | None = None
        self._body = bytearray()
        self.started = False
        """A byte of the answer arrived (a retry would no longer be a first try)."""

    def feed(self, data: bytes) -> Response | None:
        """The response once complete, else None (call again with more bytes).  ``data=b""``
        is the end of the stream: ``AnswerLost`` if the answer is not complete."""
        if data:
            self.started = True
        elif not self.started:  # not h11's words for it ("can't handle event type ...")
            raise AnswerLost("the daemon closed the connection before answering")
        try:
            self._conn.receive_data(data)
            while True:
                event = self._conn.next_event()
                if event is h11.NEED_DATA:
                    if not data:
                        raise AnswerLost("the daemon closed the connection before answering")
                    return None
                if isinstance(event, h11.Response):
                    self._status = event.status_code
                    self.head = True
                    for name, value in event.headers:
                        if name == b"content-type":
                            self._type = value.decode("latin-1")
                        elif name == b"retry-after":
                            self._retry_after = retry_after_of(value)
                        elif name == b"content-length":
                            self._check_length(int(value))
                elif isinstance(event, h11.Data):
                    self._body += event.data
                    self._check_length(len(self._body))
                elif isinstance(event, h11.EndOfMessage):
                    return Response(self._status, self._type, bytes(self._body), self._retry_after)
                elif isinstance(event, h11.ConnectionClosed):
                    raise AnswerLost("the daemon closed the connection before answering")
        except h11.RemoteProtocolError as exc:
            if not data:
                raise AnswerLost(
                    "the daemon closed the connection in the middle of its answer"
                ) from None
            raise AnswerLost(f"the daemon's answer is not valid HTTP/1.1 ({exc})") from None

    def _check_length(self, n: int) -> None:
        if self._cap is not None and n > self._cap:
            raise AnswerLost(
                f"the daemon's answer would be {n} bytes, more than the {self._cap} it ever sends"
            )

    def reusable(self) -> bool:
        """After a complete response: both sides are done, the connection can carry another --
        unless bytes arrived past the answer (h11's ``trailing_data``: an answer nobody asked
        for, which the next request on it would read as its own)."""
        if self._conn.trailing_data[0] or self._conn.trailing_data[1]:
            return False
        if self._conn.our_state is h11.DONE and self._conn.their_state is h11.DONE:
            self._conn.start_next_cycle()
            return True
        return False


class _Conn:
    __slots__ = ("h11", "stream")

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT)

    def alive(self) -> bool:
        """An idle keep-alive connection with nothing to read is still open; one that is
        readable was closed by the daemon (or holds stray bytes): either way, not reusable."""
        try:
            readable, _, _ = select.select([self.stream.socket.fileno()], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable


class Client:
    """A client of one daemon socket.  Use ``async with Client.open(path)`` (or call ``aclose``).

    ``daemon_uid``: the uid (or user name) the daemon runs as, whose socket the client then
    trusts beside root's and its own (``wire.check_socket``); without it,
    ``$AFFIDAVIT_DAEMON_UID``'s.  A value that is no uid and names no user is
    ``DaemonUidInvalid`` (a ValueError, code ``DAEMON_UID_INVALID``) here, not at a request."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        max_idle: int = 64,
        daemon_uid: int | str | None = None,
    ) -> None:
        resolved = socket_path(path)
        if resolved is None:
            raise ValueError("no daemon socket: pass its path or set $AFFIDAVIT_SOCKET")
        self.path = resolved
        self.daemon_uid = None if daemon_uid is None else parse_daemon_uid(daemon_uid)
        """The daemon's uid to trust, given explicitly; None: the environment's."""
        self._idle: list[_Conn] = []
        self._max_idle = max_idle
        self._closed = False

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        max_idle: int = 64,
        daemon_uid: int | str | None = None,
    ) -> AsyncIterator[Client]:
        client = cls(path, max_idle=max_idle, daemon_uid=daemon_uid)
        try:
            yield client
        finally:
            await client.aclose()

    async def aclose(self) -> None:
        """Close the idle connections; a request still running closes its own when done."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.stream.aclose()

    # -- the Broker-like API --------------------------------------------------------------------

    async def call(
        self,
        action: Mapping[str, Any],
        *,
        timeout: float | None = None,
        approval_wait: float = 0.0,
    ) -> dict[str, Any]:
        """Perform one action in the daemon; return its envelope (as ``Broker.call``).

        Its answer is waited for ``wire.answer_wait(timeout, approval_wait)`` seconds at most:
        the caller's ``timeout`` (else ``wire.CALL_WAIT``), plus ``approval_wait`` -- the
        target's ``approval.wait``, when the action may wait for an operator --, plus the
        daemon's delivery budget; past it the connection is closed and ``AnswerLost`` raised
        (the call may have run: the daemon keeps what happened).  An answer that is no
        envelope is ``AnswerInvalid`` (an ``AnswerLost``)."""
        timeout = _timeout(timeout)
        if not 0 <= approval_wait < float("inf"):
            raise NotSent("approval_wait must be a number of seconds, 0 or more")
        # allow_nan=False: an overflowed float (``1e400`` read as inf) is refused here, never
        # sent re-encoded as ``Infinity`` -- words the caller never wrote.
        try:
            body = json.dumps(action, allow_nan=False).encode("utf-8")
        except ValueError as exc:
            raise NotSent(str(exc)) from None
        wait = answer_wait(timeout, approval_wait)
        response = await self._request(
            "POST", target("/v1/calls", {"timeout": timeout}), body, retry=False, wait=wait
        )
        return check_envelope(response.json())

    async def fetch_result(
        self, invocation_id: str, *, from_chunk: int | None = None, chunks: int | None = None
    ) -> dict[str, Any] | None:
        """The recorded envelope of an invocation -- never a re-execution.  None if unknown.
        ``from_chunk=N`` resumes (as ``Broker.fetch_result``): to the end, read a page of
        ``MAX_RESULT_PAGE_CHUNKS`` at a time and put together (``pages.read_pages``); with
        ``chunks=M``, one page of at most M chunks of each stream (1 to
        ``MAX_RESULT_PAGE_CHUNKS``), whose ``result.resume.next_chunk`` names the next.
        Only the whole fetch (no ``from_chunk``) records the result delivered to this uid (the
        daemon records it once it wrote the answer to its socket); a page, or pages
        put together -- from chunk 0 too, the by-reference pointer's form -- record nothing."""
        if from_chunk is not None and from_chunk < 0:
            raise NotSent("from_chunk must be >= 0")
        if chunks is not None and not 1 <= chunks <= MAX_RESULT_PAGE_CHUNKS:
            raise NotSent(f"chunks must be from 1 to {MAX_RESULT_PAGE_CHUNKS}")
        path = invocation_path(invocation_id, "/result")

        async def page(at: int, size: int = chunks or MAX_RESULT_PAGE_CHUNKS) -> Any:
            return await self._get_or_none(target(path, {"from_chunk": at, "chunks": size}))

        if chunks is not None:
            envelope: dict[str, Any] | None = await page(from_chunk or 0)
        elif from_chunk is not None:
            envelope = await read_pages(page, from_chunk)
        else:
            envelope = await self._get_or_none(path)
        return envelope

    async def poll_operation(
        self, operation_id: str, *, timeout: float | None = None
    ) -> dict[str, Any]:
        """Query a job's status resource once, in the daemon (as ``Broker.poll_operation``):
        ``{"operation", "poll"}`` (and ``"refused"``, ``POLL_SUPERSEDED``: the row leaving
        the poll open was refused, another asker closed it meanwhile and opened another, or
        the job ended meanwhile).
        ``ApiError`` (422 ``OPERATION_ERROR``) for an unknown id or
        a job with nothing to query; (409 ``POLL_PENDING``, no field) while the operation's
        poll the target's approval covers awaits an operator or is being sent -- nothing more
        was asked or sent: poll again once it is decided; (429 ``POLL_TOO_SOON``, its
        ``retry_after``) within the target's ``operations.min_poll_interval`` of the last poll,
        nothing asked."""
        timeout = _timeout(timeout)
        path = "/v1/operations/" + quote(operation_id, safe="") + "/poll"
        response = await self._request("POST", target(path, {"timeout": timeout}), b"", retry=False)
        answer: dict[str, Any] = response.json()
        return answer

    async def catalog(self) -> dict[str, Any]:
        """The targets and each protocol's action schema (``Broker.catalog``)."""
        data: dict[str, Any] = await self._get("/v1/catalog")
        return data

    async def record(self, invocation_id: str) -> dict[str, Any] | None:
        """The projected record as plain JSON (``affidavit record --json``'s ``record``): asked
        alone, as the page of events past the last seq there can be -- none of its events is
        read out, however long the record (an operation's, grown by its polls)."""
        path = target(invocation_path(invocation_id), {"from_seq": MAX_COUNT, "limit": 1})
        found: dict[str, Any] | None = await self._get_or_none(path)
        if found is None:
            return None
        record: dict[str, Any] = found["record"]
        return record

    async def invocation(self, invocation_id: str) -> dict[str, Any] | None:
        """``{"record", "events"}`` in one request (``affidavit record --json``); None if
        unknown.  A record larger than the daemon ever answers whole (413
        ``ANSWER_TOO_LARGE``: an operation's, grown by its polls) is read a page of events at
        a time instead (``?from_seq=``, ``read_record_pages``)."""
        path = invocation_path(invocation_id)
        try:
            found: dict[str, Any] | None = await self._get_or_none(path)
        except ApiError as exc:
            if exc.code != "ANSWER_TOO_LARGE":
                raise

            async def page(at: int, limit: int) -> dict[str, Any] | None:
                got: dict[str, Any] | None = await self._get_or_none(
                    target(path, {"from_seq": at, "limit": limit})
                )
                return got

            found = await read_record_pages(page, EVENTS_LIMIT)
        return found

    async def events(self, invocation_id: str) -> list[dict[str, Any]]:
        found = await self.invocation(invocation_id)
        return [] if found is None else list(found["events"])

    # -- views ------------------------------------------------------------------------------------

    async def actions(
        self,
        *,
        session: str | None = None,
        outcome: str | None = None,
        phase: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        """The newest ``limit`` matching records (the daemon's default when None), oldest
        first: ``{"actions": [...], "limit", "total", "truncated"}`` -- ``truncated`` says
        older ones were left out, ``total`` how many matched."""
        params = {"session": session, "outcome": outcome, "phase": phase, "since": since}
        params.update(until=until, limit=limit)
        page: dict[str, Any] = await self._get(target("/v1/actions", params))
        return page

    async def sessions(self, *, limit: int | None = None) -> dict[str, Any]:
        """The ``limit`` sessions seen last (the daemon's default when None), in order of first
        appearance: ``{"sessions": [...], "limit", "total", "truncated"}`` -- ``truncated``
        says others were left out, ``total`` how many there are."""
        page: dict[str, Any] = await self._get(target("/v1/sessions", {"limit": limit}))
        return page

    async def metrics(
        self, *, session: str | None = None, since: float | None = None
    ) -> dict[str, Any]:
        """Counts by phase x outcome and code x outcome (``GET /v1/metrics?format=json``)."""
        params = {"format": "json", "session": session, "since": since}
        data: dict[str, Any] = await self._get(target("/v1/metrics", params))
        return data

    async def health(self) -> dict[str, Any]:
        """``GET /v1/health``, waited for ``wire.health_wait()`` at most (then ``AnswerLost``):
        a stopped daemon is told, not waited for."""
        response = await self._request("GET", "/v1/health", None, retry=True, wait=health_wait())
        data: dict[str, Any] = response.json()
        return data

    # -- operators (docs/approvals.md): the socket peer's uid is the identity -------------------

    async def approvals(self) -> list[dict[str, Any]]:
        """Requests waiting for a decision (``affidavit approvals --json``).  Operators only:
        any other peer gets ``ApiError`` 403 NOT_AN_OPERATOR."""
        rows: list[dict[str, Any]] = await self._get("/v1/approvals")
        return rows

    async def approval(self, invocation_id: str) -> dict[str, Any]:
        view: dict[str, Any] = await self._get(approval_path(invocation_id))
        return view

    async def approve(
        self, invocation_id: str, *, note: str | None = None, blind: bool = False
    ) -> dict[str, Any]:
        """Approve a pending request as this peer (``ApiError`` 403 for a non-operator or the
        requester itself, 409 when it is no longer pending, or REQUEST_UNREADABLE when its
        sealed request cannot be read and ``blind`` is not given)."""
        body: dict[str, Any] = {"note": note}
        if blind:
            body["blind"] = True
        return await self._post_json(approval_path(invocation_id, "/approve"), body)

    async def deny(self, invocation_id: str, *, note: str | None = None) -> dict[str, Any]:
        return await self._post_json(approval_path(invocation_id, "/deny"), {"note": note})

    async def revoke(self, invocation_id: str, *, note: str) -> dict[str, Any]:
        """Take back a grant not yet sent, as this peer (``ApiError`` 409 NOT_APPROVED when it
        is not approved and undispatched, DISPATCHING while a dispatcher holds it)."""
        return await self._post_json(approval_path(invocation_id, "/revoke"), {"note": note})

    async def reconcile(
        self,
        invocation_id: str,
        *,
        query: bool = False,
        attest: str | None = None,
        note: str | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """As ``Broker.reconcile``: ``query=True`` (any peer the daemon admits) or
        ``attest="committed" | "rejected"`` with a ``note`` (operators only)."""
        body: dict[str, Any] = {"query": True} if query else {"attest": attest, "note": note}
        timeout = _timeout(timeout)
        path = target(invocation_path(invocation_id, "/reconcile"), {"timeout": timeout})
        return await self._post_json(path, body)

    async def _post_json(self, request_target: str, body: Mapping[str, Any]) -> dict[str, Any]:
        # Not retried: a decision or a reconciliation is a write (the daemon refuses a second
        # one as NOT_PENDING / NOT_UNKNOWN, never applies it twice).
        data = json.dumps(body).encode("utf-8")
        answer: dict[str, Any] = (
            await self._request("POST", request_target, data, retry=False)
        ).json()
        return answer

    # -- transport ----------------------------------------------------------------------------

    async def _get(self, request_target: str) -> Any:
        response = await self._request("GET", request_target, None, retry=True, head=read_wait())
        return response.json()

    async def _get_or_none(self, request_target: str) -> Any:
        response = await self._request("GET", request_target, None, retry=True, head=read_wait())
        return None if response.status == 404 else response.json()

    async def _take(self) -> tuple[_Conn, bool]:
        while self._idle:
            conn = self._idle.pop()
            if conn.alive():
                return conn, True
            await conn.stream.aclose()
        check_socket(self.path, self.daemon_uid)
        try:
            stream = await trio.open_unix_socket(self.path)
        except OSError as exc:
            raise DaemonUnavailable(unreachable(self.path, exc)) from None
        try:
            check_peer(stream.socket, self.path, self.daemon_uid)  # type: ignore[arg-type]
        except BaseException:
            with trio.CancelScope(shield=True):
                await stream.aclose()
            raise
        return _Conn(stream), False

    async def _request(
        self,
        method: str,
        request_target: str,
        body: bytes | None,
        *,
        retry: bool,
        wait: float | None = None,
        head: float | None = None,
    ) -> Response:
        """One request and its whole answer.  ``wait``: the seconds it all may take (a call's:
        ``wire.answer_wait``); ``head``: the seconds until the answer's first byte (a read's:
        ``wire.read_wait``); else no bound before that byte; after it,
        as ``wire._Clock`` has it (its head within ``DELIVERY_WAIT``, then the whole of an
        answer the daemon holds in its budget, or a byte every ``DELIVERY_WAIT`` of a stored
        result).  Past either: the connection closed, ``AnswerLost``."""
        now = trio.current_time()
        ends = now + wait if wait is not None else float("inf")
        head_ends = min(ends, now + head) if head is not None else ends
        for _ in range(2):
            conn, reused = await self._take()
            cap = answer_cap(request_target)
            reader = ResponseReader(conn.h11, cap)
            sent = True
            response: Response | None = None
            try:
                request = encode_request(conn.h11, method, request_target, body)
                try:
                    with trio.move_on_at(head_ends):
                        await conn.stream.send_all(request)
                    if trio.current_time() >= head_ends:
                        raise _Late(wait if head is None else head)
                except (trio.BrokenResourceError, OSError):
                    # The daemon stopped reading: an answer it wrote first is the answer.
                    sent = False
                    response = await _answer_after_broken_send(conn.stream, reader)
                    if response is None:
                        raise
                first: float | None = None
                while response is None:
                    limit = head_ends
                    if first is not None:
                        whole = cap is not None or not reader.head
                        rest = first if whole else trio.current_time()
                        limit = min(ends, rest + DELIVERY_WAIT)
                    with trio.move_on_at(limit):
                        data = await conn.stream.receive_some(READ_SIZE)
                        if first is None:
                            first = trio.current_time()
                        response = reader.feed(data)
                        continue
                    raise _Late(wait if first is not None or head is None else head)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                await conn.stream.aclose()
                if retry and reused and not reader.started:
                    continue
                raise AnswerLost(
                    f"the connection to the daemon broke before it answered ({exc})"
                ) from None
            except _Late as late:
                await conn.stream.aclose()
                raise AnswerLost(str(late)) from None
            except AnswerLost:
                await conn.stream.aclose()
                if retry and reused and not reader.started:
                    continue
                raise
            except BaseException:
                # Cancelled mid-request: the connection's state is unknown; closing it tells
                # the daemon the caller is gone (it cancels a call that was not yet dispatched).
                with trio.CancelScope(shield=True):
                    await conn.stream.aclose()
                raise
            if sent and reader.reusable() and not self._closed and len(self._idle) < self._max_idle:
                self._idle.append(conn)
            else:
                await conn.stream.aclose()
            return response
        raise AssertionError("unreachable")  # pragma: no cover


class _Late(Exception):
    """No whole answer within the bounds of ``Client._request``."""

    def __init__(self, wait: float | None) -> None:
        within = f"within {wait:.0f} s" if wait is not None else "in time"
        super().__init__(
            f"the daemon sent no whole answer {within} (the call may have run: the daemon "
            f"keeps what happened -- affidavit actions, then affidavit result ID)"
        )


async def _answer_after_broken_send(
    stream: trio.SocketStream, reader: ResponseReader
) -> Response | None:
    """The request could not be sent whole: the daemon closed the connection.  It may have
    answered first (a 503 ``TOO_MANY_CONNECTIONS``, nothing of the request read, so the call
    did not run; a 413): that answer, whole, within ``AFTER_BROKEN_SEND``, else None -- and the
    caller's ``AnswerLost``, never a guess (wire.py ``_answer_after_broken_send`` says why)."""
    with trio.move_on_after(AFTER_BROKEN_SEND):
        try:
            while True:
                response = reader.feed(await stream.receive_some(READ_SIZE))
                if response is not None:
                    return response
        except (AnswerLost, trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return None
    return None
