"""One console request and its answer: the ASGI scope read once (query, headers, cookies,
the connection's owner), the form read within ``FORM_WAIT`` and refused when repeated or too
large, the answer with the headers every page carries (``CSP`` and the rest: see ``app``'s
docstring), and the small checks and refusals the handlers share (``Refused``, ``_fields``,
``_journal_refusal``, the session cookie).  The console itself -- routing, sessions and the
origin and peer checks -- is ``app.py``; its pages and decisions are ``handlers.py``.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import parse_qsl

import trio

from affidavit.approvals import OperatorError
from affidavit.engine import READ_RETRY
from affidavit.journal import JournalError, JournalReader
from affidavit.text import printable, shown_as_is

from .auth import Session
from .peer import socket_owner

Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Read = Callable[[Callable[[JournalReader], Any]], Awaitable[Any]]


log = logging.getLogger("affidavit.console")
COOKIE = "affidavit_console"
MAX_FORM = 64 * 1024
FORM_WAIT = 10.0
"""Seconds a form's body may take to arrive after its head (408 after that): a client that
sends the head of a POST and never its body would otherwise keep its connection -- one of the
daemon's few console places (``admission.ConsoleCap``) -- until the daemon stops."""
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
OWNER = "affidavit.owner"
"""The ASGI scope's key for the uid owning the client's end of the connection, as a 1-tuple
(None in it: nobody identified): the daemon looks it up once per connection, at admission
(``admission.ConsoleCap``), so that a request never asks the kernel again."""
AUTO = "auto"
"""The query parameter a live page's reload carries (``<meta refresh>`` of /actions): the
request is the browser's, not the operator's, and restarts no idle clock (``Sessions.get``)."""


class Refused(Exception):
    """Answer ``status`` with the error page saying ``message`` under its stable ``code``
    (docs/console.md, "Refusals"), and ``field`` -- the query parameter or form field at
    fault -- when there is one; ``retry_after``: seconds sent as ``Retry-After`` (a read page
    the journal declined this once, or could not answer now: ``read_refusal``)."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        retry_after: int | None = None,
        *,
        field: str | None = None,
    ) -> None:
        self.status, self.message, self.code, self.field = status, message, code, field
        self.retry_after = retry_after
        self.close = code == "PEER_REFUSED"
        """Whether the connection is closed after the answer (``Connection: close``): a peer
        refused for whom it is keeps no connection open to go on presenting the cookie."""
        super().__init__(message)

    @classmethod
    def of(cls, exc: OperatorError) -> Refused:
        """The refusal of a decision or a reconciliation, as the daemon's API answers it: its
        status, code and field (``INVALID_FIELD`` at ``note``, never only its words) -- in the
        console's terms, a form field or a query parameter: an id or a content name of the
        page's address is none (its own ``NO_SUCH_INVOCATION`` names none), and a field the
        console has no control for (``blind``: it approves only a request it shows) is named
        as the interfaces that have one spell it, with no field of its own."""
        if exc.field in ("invocation_id", "name"):  # the daemon API's path parts
            return cls(exc.status, exc.message, exc.code)
        if exc.field == "blind":
            message = exc.message.removeprefix("blind: ") + (
                " -- not here: the console approves only a request it shows (`affidavit "
                'approvals approve ID --blind`, or the daemon API\'s {"blind": true}, does)'
            )
            return cls(exc.status, message, exc.code)
        return cls(exc.status, exc.message, exc.code, field=exc.field)


class Request:
    def __init__(self, scope: Mapping[str, Any], receive: Receive, send: Send) -> None:
        self.scope, self.receive, self.send = scope, receive, send
        self.method = str(scope["method"])
        self.path = str(scope["path"])
        query = scope.get("query_string", b"").decode("latin-1")
        self.query_string = query
        """The query as sent (still percent-encoded): a held page's reload link keeps it."""
        # Blank values kept: ``?from=`` is a value that is no row number (INVALID_FIELD), not
        # the absence of one; every filter reads a blank as none.
        pairs = parse_qsl(query, keep_blank_values=True)
        self.query = dict(pairs)
        self.repeated = _repeated(pairs)
        """Query parameter names sent more than once, blank or not (refused: ``_route``)."""
        self.headers: dict[str, str] = {}
        self._cookie_lines: list[str] = []
        for k, v in scope.get("headers", []):
            name = k.decode("latin-1").lower()
            self.headers[name] = v.decode("latin-1")
            if name == "cookie":
                self._cookie_lines.append(self.headers[name])
        self.session: Session | None = None
        self.via_proxy = False
        """Whether the connection is the declared proxy's (``Console.proxy_uid``)."""
        self._owner: tuple[int | None] | None = None

    @property
    def shown_path(self) -> str:
        """The path for a log line: decoded, it may hold a line break (``%0A``) or a terminal
        escape -- a stranger's line of its own in the daemon's log -- so those are escaped."""
        return printable(self.path)

    def owner(self) -> int | None:
        """The uid owning the client's end of this request's connection: the daemon's lookup at
        admission (``OWNER`` in the scope), else ``peer.socket_owner`` asked once; None when no
        established socket of this machine is: nobody identified."""
        if self._owner is None and self.scope.get(OWNER) is not None:
            self._owner = (self.scope[OWNER][0],)
        if self._owner is None:
            client, server = self.scope.get("client"), self.scope.get("server")
            uid = socket_owner(tuple(client), tuple(server)) if client and server else None
            self._owner = (uid,)
        return self._owner[0]

    def cookies(self, name: str) -> list[str]:
        """Every value a cookie of ``name`` has in the request, in the order sent, each once.
        Several is no mistake of the browser's: a server on another port of this host may set
        one of the same name (cookies ignore ports), and one with a longer ``Path`` is sent
        first (RFC 6265 §5.4) -- so no single value may be taken for the console's own."""
        values: dict[str, None] = {}
        for line in self._cookie_lines:
            for part in line.split(";"):
                key, _, value = part.strip().partition("=")
                if key == name:
                    values[value] = None
        return list(values)

    async def form(self) -> dict[str, str]:
        data = bytearray()
        with trio.move_on_after(FORM_WAIT) as waited:
            while True:
                message = await self.receive()
                if message["type"] == "http.disconnect":
                    raise Refused(400, "the request was cut off", "BAD_REQUEST")
                data += message.get("body", b"")
                if len(data) > MAX_FORM:
                    raise Refused(413, "the form is too large", "FORM_TOO_LARGE")
                if not message.get("more_body", False):
                    break
        if waited.cancelled_caught:
            raise Refused(408, f"the form did not arrive within {FORM_WAIT:g} s", "FORM_TIMEOUT")
        try:
            pairs = parse_qsl(data.decode("utf-8"), keep_blank_values=True)
        except UnicodeDecodeError:
            raise Refused(400, "the form is not UTF-8", "BAD_REQUEST", field="form") from None
        # A field given twice is refused, never one of its values kept unseen: of
        # ``how=query&how=committed`` the last would attest what the page's button did not say.
        repeated = _repeated(pairs)
        if repeated:
            name = _shown(repeated[0], "form")
            raise Refused(400, f"{name}: field given twice", "INVALID_FIELD", field=name)
        return dict(pairs)

    async def answer(
        self,
        status: int,
        body: bytes,
        content_type: bytes = b"text/html; charset=utf-8",
        headers: list[tuple[bytes, bytes]] | None = None,
        *,
        cache: bytes = b"no-store",
    ) -> None:
        head = [
            (b"content-type", content_type),
            (b"content-length", b"%d" % len(body)),
            (b"content-security-policy", CSP.encode()),
            (b"x-frame-options", b"DENY"),
            (b"referrer-policy", b"same-origin"),
            (b"x-content-type-options", b"nosniff"),
            (b"cross-origin-resource-policy", b"same-origin"),
            (b"cross-origin-opener-policy", b"same-origin"),
            (b"cache-control", cache),
            *(headers or []),
        ]
        await self.send({"type": "http.response.start", "status": status, "headers": head})
        await self.send({"type": "http.response.body", "body": body})

    async def redirect(
        self, location: str, headers: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        await self.answer(303, b"", headers=[(b"location", location.encode()), *(headers or [])])


def decision_forms(req: Request, decisions: bool = True) -> dict[str, Any]:
    """What a page's forms are rendered with: ``csrf``, and ``elsewhere`` (a page with decision
    buttons, ``decisions``: they are disabled, and the page says to reload it).

    A page another page navigated to -- ``Sec-Fetch-Site`` ``same-site`` (a page an agent
    serves on another port of 127.0.0.1) or ``cross-site`` -- is the double-click attack's:
    its first click sends the operator's tab here, timed so that the second lands on a
    button.  Its buttons are disabled, and its forms hold the session's
    ``csrf_shown_disabled``, which logs out and decides nothing (``Console._checked_form``).
    A page the operator opened (``none``: typed, a bookmark, a reload), one a console page
    opened (``same-origin``), or a client's that sends no Fetch Metadata is rendered enabled,
    with ``csrf`` -- unless the session is held (``Session.held``: a page another page opened
    is held, and so is every page its links open, until the operator reloads it)."""
    session = req.session
    enabled = req.headers.get("sec-fetch-site") in (None, "same-origin", "none")
    enabled = enabled and not (session is not None and session.held)
    csrf = "" if session is None else session.csrf if enabled else session.csrf_shown_disabled
    return {"csrf": csrf, "elsewhere": decisions and not enabled}


def _fields(form: dict[str, str], known: tuple[str, ...]) -> None:
    """400 ``INVALID_FIELD`` naming the first field of ``form`` not in ``known`` (as the
    daemon's operator routes and the call API refuse one); a name that is not plain printable
    text, or is long, is not echoed: ``form`` stands for it."""
    for key in sorted(form):
        if key not in known:
            name = _shown(key, "form")
            raise Refused(400, f"{name}: unknown field", "INVALID_FIELD", field=name)


def _shown(name: str, instead: str) -> str:
    """``name`` for a message, when it is short plain printable text; else ``instead``."""
    return name if len(name) <= 64 and shown_as_is(name) else instead


def _repeated(pairs: list[tuple[str, str]]) -> list[str]:
    """The names given more than once in ``pairs``, sorted."""
    return sorted(n for n, c in Counter(n for n, _ in pairs).items() if c > 1)


def _journal_refusal(exc: JournalError, failure: tuple[int, str, str]) -> Refused:
    """What the journal could not do, as every surface answers it (``read_failure``,
    ``act_failure``): the error page with its status and code, and one line in the log --
    never a traceback, never the password (the journal's words redact it)."""
    status, code, message = failure
    log.warning("console: %s: %s", printable(message), printable(str(exc)))  # a path's id
    return Refused(status, message, code)


def read_refusal(exc: JournalError, failure: tuple[int, str, str]) -> Refused:
    """``_journal_refusal`` of a read page, with the ``Retry-After`` the daemon's reads send for
    the same code (``READ_RETRY``: 1 s declined, 5 s unavailable; none for the rest).  Never a
    decision's: it may have been recorded."""
    refused = _journal_refusal(exc, failure)
    refused.retry_after = READ_RETRY.get(refused.code)
    return refused


def _cookie(value: str, *, expire: bool = False, secure: bool = False) -> bytes:
    # Secure only behind a TLS proxy: on loopback the console speaks plain HTTP.
    tail = ("; Max-Age=0" if expire else "") + ("; Secure" if secure else "")
    return f"{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict{tail}".encode()
