"""The few HTTP pieces the routes need: a request with its peer and link, JSON answers, and
the API's own errors (``{"api_error": {"code", "message"}}``; never an envelope).

A ``Request`` talks to its connection (``h11server.Connection``) directly -- no ASGI messages in
between: ``body`` reads the request's body from it, ``respond`` hands it the whole answer to
write at once.

Status codes are the API's, never the action's: every envelope -- error or not -- is HTTP 200.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote

import trio

from affidavit.api.limits import ActionInvalid, action_size_limit, load_action_json
from affidavit.api.wire import ApiFault, parse_count, parse_timeout
from affidavit.text import ECHO, echoed, shown_as_is

from .link import Link
from .peer import Peer

if TYPE_CHECKING:
    from .admission import Server
    from .h11server import Connection

__all__ = [
    "ECHO",
    "FREE_BODY",
    "MAX_BODY",
    "ApiProblem",
    "ClientGone",
    "Request",
    "api_error_body",
    "body_limit",
    "echoed",
    "json_body",
    "named",
]

MAX_BODY = 16 * 1024 * 1024
"""The bytes a request body may hold, and the least an action's may (``body_limit``): an action
is small; targets enforce their own ``max_body`` (PAYLOAD_LIMIT, an envelope)."""


BODY_RETRY = 5
"""Seconds a request refused 503 ``BODIES_IN_FLIGHT`` is told to wait (``Retry-After``): as
long as ``ANSWERS_IN_FLIGHT``'s (``results.ANSWER_RETRY``) -- a body held is let go once its
request is answered, bounded by ``BODY_WAIT``."""

FREE_BODY = 64 * 1024
"""The bytes of each request's body not counted against the server's ``body_budget`` (a
request that small is never refused for others' bodies: 256 connections hold 16 MiB of them at
most)."""


def named(name: str, instead: str) -> str:
    """A field or parameter name as an answer names it (its message and ``field``): itself when
    it is printable text of 1 to ``ECHO`` characters, else ``instead`` (``body``, ``query``)."""
    return name if 0 < len(name) <= ECHO and shown_as_is(name) else instead


def body_limit(targets: Iterable[object]) -> int:
    """The bytes a request body may hold on this daemon: what an embedded ``affidavit call``
    reads for the same targets (``action_size_limit``: the largest ``max_body``/``max_stdin``
    JSON-escaped, plus 1 MiB), and never less than ``MAX_BODY``.  Computed once, at start-up,
    from the loaded config (``Server.max_body``); only an action's body (``POST /v1/calls``)
    may be that large, every other route's takes ``MAX_BODY``."""
    return max(MAX_BODY, action_size_limit(targets))


class ApiProblem(ApiFault):
    """An API-level refusal: answered with ``status`` and ``{"api_error": ...}``.  ``field``:
    the request's part to fix (a body field, a query parameter), when one is -- as an
    envelope's error names it; the message starts with it too.  ``retry_after``: seconds after
    which the same request may succeed, sent as ``Retry-After`` (a read declined this once).
    ``action_code``: an action refused before it was journaled (its JSON), the code the broker
    gives the same fault embedded (PAYLOAD_LIMIT, INVALID_FIELD), for a client to answer as
    the embedded broker does without reading the message."""


class ClientGone(Exception):
    """The client hung up (before its body arrived, or before its answer could be written)."""


def json_body(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode("utf-8") + b"\n"


def api_error_body(
    code: str, message: str, field: str | None = None, action_code: str | None = None
) -> bytes:
    error = {"code": code, "message": message}
    if field is not None:
        error["field"] = field
    if action_code is not None:
        error["action_code"] = action_code
    return json_body({"api_error": error})


def parse_json(raw: bytes | bytearray, limit: int = MAX_BODY, *, action: bool = False) -> Any:
    # Size, UTF-8 and nesting are checked before the parser runs (issue 9: 100k nested
    # arrays ended in a RecursionError); the message says which.  An action's body is refused
    # in the words `affidavit call` uses embedded (its stable code and the field path: a
    # field named twice is refused at that field, ``action.headers.X``).
    try:
        return load_action_json(raw, limit)
    except ActionInvalid as exc:
        if action:
            message = f"action refused: {exc.code.value} at {exc.field}: {exc.message}"
            raise ApiProblem(
                400, "BAD_JSON", message, exc.field, action_code=exc.code.value
            ) from None
        field = exc.field.replace("action", "body", 1)
        where = "" if exc.field == "action" else f" (at {field})"
        raise ApiProblem(400, "BAD_JSON", f"the body {exc.message}{where}", field) from None


class Request:
    """One request on its connection: method, path, query parameters, the peer that sent it."""

    __slots__ = (
        "_conn",
        "answered",
        "held",
        "method",
        "params",
        "path",
        "peer",
        "repeated",
        "target",
    )

    def __init__(
        self, conn: Connection, method: str, target: str, query: bytes, peer: Peer
    ) -> None:
        self._conn = conn
        self.method = method
        self.target = target
        """The path as sent, still percent-encoded: what the routes match, so that an id
        quoted into one segment (``/`` as ``%2F``) stays one."""
        self.path = unquote(target)
        """The path unquoted: for messages and the log."""
        self.peer = peer
        pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True) if query else []
        self.params: dict[str, str] = dict(pairs)
        self.repeated = frozenset(n for n, c in Counter(n for n, _ in pairs).items() if c > 1)
        """The parameter names sent more than once, refused by every route (``_check_params``):
        ``dict`` keeps the last, so ``?timeout=1&timeout=100`` would run under 100."""
        self.answered = False
        self.held = 0
        """Bytes of its body counted against the server's ``body_budget`` (``body``)."""

    @property
    def link(self) -> Link:
        return self._conn.link

    @property
    def other(self) -> bool:
        """Its peer is not one the server reserves places for (not an operator's): it counts
        among the others, for connections and answers (``Server.reserved``)."""
        return self._conn.other

    @property
    def server(self) -> Server:
        """The listener's ``Server``: its budgets (``hold_body``, ``hold_answer``)."""
        return self._conn.server

    async def body(self, limit: int = MAX_BODY) -> bytes | bytearray:
        """The whole body, at most ``limit`` bytes (an action's: the server's ``max_body``;
        any other route's: ``MAX_BODY``) -- else 413, before a byte is read when the declared
        length is over it.  Handed back as read (a ``bytearray``: no copy of it).

        Its bytes past the first ``FREE_BODY`` count against the server's ``body_budget``, as
        they arrive, until the request's handling is over (``Connection.serve``); past the
        budget, 503 ``BODIES_IN_FLIGHT`` (the rest unread, the connection closed).  256
        connections may each send ``limit`` bytes, but their bodies -- each held a few times
        over while it is read and parsed -- cannot all be in memory at once.  Bytes that
        arrived, not a declared length, are counted: holding the budget costs a client the
        bytes it holds, and a small body (every call's but the largest) is never refused.

        Both the limit and the budget count the body as sent, its chunk framing included
        (``Connection.body_wire``): a body of 1-byte chunks is six times its bytes on the
        wire, and each chunk costs the daemon an h11 event.  A body of many tiny chunks is
        refused outright (400 ``CHUNKS_TOO_SMALL``, ``h11server.MIN_CHUNK``)."""
        conn = self._conn
        declared = conn.declared
        if declared is not None and declared > limit:  # refused before a byte is read
            raise ApiProblem(413, "BODY_TOO_LARGE", f"the body exceeds {limit} bytes")
        data = bytearray()
        while True:
            chunk = await conn.body_chunk()  # ClientGone if the client hung up
            if chunk is None:
                return data
            data += chunk
            sent = max(len(data), conn.body_wire)  # as sent: chunk framing counts
            if sent > limit:
                raise ApiProblem(413, "BODY_TOO_LARGE", f"the body exceeds {limit} bytes")
            if sent - FREE_BODY > self.held:
                self._hold(sent - FREE_BODY - self.held)

    def _hold(self, n: int) -> None:
        """Hold ``n`` more bytes of the body in the server's budget and the peer's shares of it
        (``Server.hold_body``), or 503 ``BODIES_IN_FLIGHT`` naming the share that is full,
        with ``Retry-After`` as ``ANSWERS_IN_FLIGHT`` has."""
        server, other = self._conn.server, self._conn.other
        full = server.hold_body(n, self.peer, other)
        if full is not None:
            whose = {
                "all": "and others fill it",
                "uid": f"for uid {self.peer.uid}, and its other bodies fill it",
                "others": "for peers who are not operators, and theirs fill it",
            }[full]
            raise ApiProblem(
                503,
                "BODIES_IN_FLIGHT",
                f"the daemon holds {server.body_shares.limit(full, other)} bytes of request "
                f"bodies at most, at once, {whose}: the body was not read; try again later",
                retry_after=BODY_RETRY,
            )
        self.held += n

    async def _parsed(self, raw: bytes | bytearray, limit: int, *, action: bool = False) -> Any:
        """``parse_json`` -- in one of the server's ``parse_threads`` for a body over
        ``FREE_BODY``: decoding, scanning and parsing 16 MB takes 10-300 ms (a string of escapes
        the most), which would stall every other connection on the event loop.  Each step of
        it is short (``SCAN_CHUNK``), so the loop runs between them.  Not cancelled midway:
        bounded by the body's size."""
        if len(raw) <= FREE_BODY:
            return parse_json(raw, limit, action=action)
        parse = functools.partial(parse_json, raw, limit, action=action)
        return await trio.to_thread.run_sync(parse, limiter=self._conn.server.parse_threads)

    async def json(self) -> Any:
        return await self._parsed(await self.body(), MAX_BODY)

    async def action(self) -> Any:
        """The body as an action's JSON (``POST /v1/calls``): as large as the configured
        targets accept (``Server.max_body``, ``body_limit``)."""
        limit = self._conn.server.max_body
        return await self._parsed(await self.body(limit), limit, action=True)

    async def json_object(self) -> dict[str, Any]:
        """The body as a JSON object; an empty body is ``{}``."""
        raw = await self.body()
        value = await self._parsed(raw, MAX_BODY) if raw.strip() else {}
        if not isinstance(value, dict):
            raise ApiProblem(400, "BAD_REQUEST", "the body must be a JSON object", "body")
        return value

    def text_param(self, name: str) -> str | None:
        """A query parameter's value, None when it is absent.  Given empty (``?session=``,
        ``?since``): 400 ``BAD_REQUEST`` naming it, as a bad value of it is -- never read as
        absent, which would list every session's records to a caller that meant one."""
        raw = self.params.get(name)
        if raw == "":
            raise ApiProblem(
                400, "BAD_REQUEST", f"{name}: empty (give a value, or leave it out)", name
            )
        return raw

    def count_param(self, name: str) -> int | None:
        raw = self.params.get(name)
        if raw is None:
            return None
        try:
            return parse_count(raw)  # refuses "" too
        except ValueError as exc:
            raise ApiProblem(400, "BAD_REQUEST", f"{name}: {exc}", name) from None

    def timeout_param(self) -> float | None:
        """``?timeout=`` as ``affidavit call --timeout`` reads it (``wire.parse_timeout``):
        400 ``INVALID_FIELD`` in the same words -- an empty value too, as ``--timeout ''``."""
        raw = self.params.get("timeout")
        if raw is None:
            return None
        try:
            return parse_timeout(raw)
        except ValueError as exc:
            raise ApiProblem(400, "INVALID_FIELD", str(exc), "timeout") from None

    async def respond(
        self,
        status: int,
        body: bytes,
        content_type: bytes = b"application/json",
        *,
        close: bool = False,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        """The whole answer, in one write up to ``h11server.JOINED`` bytes of body (link.py:
        one answer, one write); ``link.broken`` says afterwards whether it failed.  Not held in
        the answer budget: a large one is written through ``answers.py``, which holds it."""
        self.answered = True
        sent = [(b"content-type", content_type), *(headers or ())]
        await self._conn.answer(status, sent, body, close=close)

    async def respond_parts(self, status: int, length: int, parts: AsyncIterator[bytes]) -> None:
        """An answer of ``length`` bytes written a part at a time (``Connection.answer_parts``:
        a stored result's, ``results.py``)."""
        self.answered = True
        headers = [(b"content-type", b"application/json")]
        await self._conn.answer_parts(status, headers, length, parts)

    async def respond_json(self, value: Any) -> None:
        await self.respond(200, json_body(value))

    async def respond_problem(self, problem: ApiProblem, *, close: bool = False) -> None:
        after = problem.retry_after
        await self.respond(
            problem.status,
            api_error_body(problem.code, problem.message, problem.field, problem.action_code),
            close=close,
            headers=None if after is None else [(b"retry-after", b"%d" % after)],
        )
