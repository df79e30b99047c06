"""The console's web application (ASGI, served by the daemon: ``affidavit.daemon.server``).

    GET  /login?token=T                 a page whose one button posts the token (a link
                                        previewer that fetches the URL redeems nothing)
    POST /login                         redeem a one-time token: a session cookie
    POST /logout                        end the session
    GET  /approvals                     pending requests; POST /approvals/{id}/approve|deny
    GET  /approvals/{id}/content/{name}  a content of the request (its body, its stdin) whole,
                                        as a download: the bytes the broker accepted, served
                                        only when their SHA-256 is the one the card shows
    GET  /actions                       the invocation list, filters, counts, live refresh
    GET  /invocations/{id}              timeline, attempts, result, lifecycle; POST .../reconcile
    GET  /invocations/{id}/result.json  the stored envelope, as a download
    GET  /journal                       verify status, the last signed checkpoint, sessions
                                        (POST /journal/verify: a whole verify -- or the
                                        one that runs, joined -- then 303 to it)
    GET  /static/{console.css,console.js}

Every request must name the console in ``Host`` (its bound address, or
``[service] console_public_origin``): another name is a DNS-rebinding page or a misdirected
request, 421.  Every page but /login and /static needs a session; without one the answer is a
redirect to the login page.  On a loopback console the session's operator must also own the
connecting socket (``peer.socket_owner``: a cookie reaches every port of 127.0.0.1, RFC 6265
§8.5), and still be an operator: otherwise 403, logged, nothing done.  Behind a proxy whose
local user is declared (``[service] console_proxy_user``) that user's connections are the
proxy's: they must name the public origin (421 otherwise; forms post from it), and the cookie
is their proof; any other connection is checked as without a proxy.  Behind a proxy whose user
is not declared, no connection is checked (the daemon warns at start).  Every POST needs the
session's CSRF token and an ``Origin`` (or, when a browser sends none, ``Referer``) that is the
console's: otherwise 403 and nothing is done.  Decisions go to the
``Broker`` with the session's operator (``via="console"``): the rules -- who is an operator,
self-approval, still pending, still unknown -- are ``affidavit.approvals`` /
``affidavit.reconcile``'s, and their refusal is shown with its code.

Headers on every answer (docs/console.md, "Security model"): a strict Content-Security-Policy
(scripts and styles from /static only, no framing, forms to this origin only), X-Frame-Options
DENY, ``Referrer-Policy: same-origin`` -- not ``no-referrer``, under which browsers send
``Origin: null`` with a form POST and the origin check could not tell the console from a
stranger; same-origin still sends nothing to another site -- nosniff, and ``Cache-Control:
no-store`` on everything that is not a static file.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

import jinja2
import markupsafe
import trio

import affidavit
from affidavit.api.broker import Broker
from affidavit.api.wire import parse_time
from affidavit.approvals import Operator, OperatorError, service
from affidavit.engine import read_failure
from affidavit.journal import (
    AlteredRow,
    JournalError,
    JournalReader,
    JournalUnavailable,
    ReadFailed,
    SessionSummary,
)
from affidavit.reconcile import service as reconciling
from affidavit.text import printable, utc_time
from affidavit.views import metrics_key

from . import pages
from .auth import Session, Sessions, TokenDirError, TokenStore
from .peer import is_loopback, socket_owner
from .text import visible
from .verified import KeptVerify

__all__ = ["COOKIE", "Console"]

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
AUTO = "auto"
"""The query parameter a live page's reload carries (``<meta refresh>`` of /actions): the
request is the browser's, not the operator's, and restarts no idle clock (``Sessions.get``)."""
STATIC = {"console.css": b"text/css; charset=utf-8", "console.js": b"text/javascript"}
_DECIDE = re.compile(r"/approvals/([^/]+)/(approve|deny)")
_CONTENT = re.compile(r"/approvals/([^/]+)/content/([a-z][a-z0-9_]*)")
_INVOCATION = re.compile(r"/invocations/([^/]+)(/reconcile|/result\.json)?")


class Refused(Exception):
    """Answer ``status`` with the error page saying ``message``."""

    def __init__(self, status: int, message: str, code: str = "") -> None:
        self.status, self.message, self.code = status, message, code
        super().__init__(message)


class Request:
    def __init__(self, scope: Mapping[str, Any], receive: Receive, send: Send) -> None:
        self.scope, self.receive, self.send = scope, receive, send
        self.method = str(scope["method"])
        self.path = str(scope["path"])
        query = scope.get("query_string", b"").decode("latin-1")
        self.query = dict(parse_qsl(query))
        self.repeated = _repeated(parse_qsl(query, keep_blank_values=True))
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
        """The uid owning the client's end of this request's connection (``peer.socket_owner``,
        asked once); None when no established socket of this machine is: nobody identified."""
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
                    raise Refused(400, "the request was cut off")
                data += message.get("body", b"")
                if len(data) > MAX_FORM:
                    raise Refused(413, "the form is too large")
                if not message.get("more_body", False):
                    break
        if waited.cancelled_caught:
            raise Refused(408, f"the form did not arrive within {FORM_WAIT:g} s")
        try:
            pairs = parse_qsl(data.decode("utf-8"), keep_blank_values=True)
        except UnicodeDecodeError:
            raise Refused(400, "the form is not UTF-8") from None
        # A field given twice is refused, never one of its values kept unseen: of
        # ``how=query&how=committed`` the last would attest what the page's button did not say.
        repeated = _repeated(pairs)
        if repeated:
            raise Refused(400, f"{_shown(repeated[0], 'form')}: field given twice", "INVALID_FIELD")
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
            (b"cache-control", cache),
            *(headers or []),
        ]
        await self.send({"type": "http.response.start", "status": status, "headers": head})
        await self.send({"type": "http.response.body", "body": body})

    async def redirect(
        self, location: str, headers: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        await self.answer(303, b"", headers=[(b"location", location.encode()), *(headers or [])])


class Console:
    """The console of ``origin`` (``http://HOST:PORT``, where it is bound); ``public_origin``:
    where a TLS proxy in front of it serves it (``[service] console_public_origin``)."""

    def __init__(
        self,
        broker: Broker,
        read: Read,
        tokens: TokenStore,
        *,
        origin: str,
        public_origin: str | None = None,
        proxy_uid: int | None = None,
        summary: SessionSummary | None = None,
        read_summarized: Read | None = None,
    ) -> None:
        self.broker = broker
        self.read = read
        self.read_summarized = read_summarized or read
        """``read`` for a view that brings ``summary`` to the head (the daemon's: they take
        turns on the event loop, not in threads waiting on its lock)."""
        self.summary = summary or SessionSummary(metrics_key)
        """The journal page's sessions and the unfiltered actions page's counts, brought up to
        date per request (the daemon's, shared with ``/v1/sessions`` and ``/v1/metrics``)."""
        self.verified = KeptVerify(self.summary)
        """The journal page's verify: the last whole one, extended to the head per request."""
        self.verifying: trio.Event | None = None
        """Set when the whole verify that runs (``_verify_whole``) ends; None when none runs."""
        self.tokens = tokens
        self.sessions = Sessions()
        self.origins = frozenset(o for o in (origin, public_origin) if o)
        self.hosts = frozenset(urlsplit(o).netloc for o in self.origins)
        # Who is on the other end can be asked of the kernel only on loopback.  Through a proxy
        # the proxy is the peer: its connections (those of ``proxy_uid``) carry the cookie as
        # the only proof, and name the public origin; every other connection is checked as
        # without a proxy.  With a proxy whose user is not declared, nothing is checked.
        host = urlsplit(origin).hostname or ""
        if proxy_uid is not None and (public_origin is None or not is_loopback(host)):
            raise ValueError("a proxy's user is declared for a loopback console behind a proxy")
        self.proxy_uid = proxy_uid
        self.public_origin = public_origin
        self.public_host = urlsplit(public_origin).netloc if public_origin else None
        self.check_peer = is_loopback(host) and (public_origin is None or proxy_uid is not None)
        # Served through TLS, the session cookie is Secure: a browser then never sends it over
        # plain HTTP -- not to a server an agent runs on another port of the public host,
        # where cookies (which ignore ports) would otherwise go.
        self.secure_cookie = (public_origin or "").startswith("https://")
        self.templates = jinja2.Environment(
            loader=jinja2.PackageLoader("affidavit.console", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.templates.filters["when"] = _when
        self.templates.filters["q"] = lambda s: quote(str(s), safe="")
        self.templates.filters["v"] = visible

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        req = Request(scope, receive, send)
        try:
            await self._route(req)
        except Refused as exc:
            page = self._render("error.html", req, message=exc.message, code=exc.code)
            await req.answer(exc.status, page)
        except Exception:
            log.exception("console: %s %s failed", req.method, req.shown_path)
            page = self._render(
                "error.html", req, message="the console failed; see its log", code=""
            )
            await req.answer(500, page)

    def _render(self, name: str, req: Request, **context: Any) -> bytes:
        session = req.session
        text = self.templates.get_template(name).render(
            operator=session.operator if session else None,
            csrf=session.csrf if session else "",
            version=affidavit.__version__,
            here=req.path,
            **context,
        )
        return text.encode("utf-8")

    async def _route(self, req: Request) -> None:
        path, method = req.path, req.method
        if req.headers.get("host") not in self.hosts:
            raise Refused(421, "this console is not served under that name")
        if self.proxy_uid is not None:
            req.via_proxy = req.owner() == self.proxy_uid
            if req.via_proxy and req.headers.get("host") != self.public_host:
                # The proxy serves the console under the public origin only: another name
                # through it is a misrouted request (or not the proxy's at all).
                log.warning(
                    "console: refused %s %s: the proxy's uid %d named %r, not the public origin",
                    req.method,
                    req.shown_path,
                    self.proxy_uid,
                    req.headers.get("host"),
                )
                raise Refused(
                    421, "through the proxy this console is served only as its public origin"
                )
        if req.repeated:  # one of its values would be dropped unseen
            message = f"{_shown(req.repeated[0], 'query')}: query parameter given twice"
            raise Refused(400, message, "INVALID_FIELD")
        if path.startswith("/static/"):
            return await self._static(req, path.removeprefix("/static/"))
        if path == "/login" and method == "GET":
            return await self._login_page(req)
        if path == "/login" and method == "POST":
            return await self._login(req)
        req.session = self._session(req)
        if method == "POST":
            form = await self._checked_form(req)  # 403 before anything else is looked at
        elif method != "GET":
            raise Refused(405, f"{method} is not used here")
        elif req.session is None:
            return await req.redirect("/login")
        if path in ("/", "/approvals") and method == "GET":
            return await self._approvals(req)
        if path == "/actions" and method == "GET":
            return await self._actions(req)
        if path == "/journal" and method == "GET":
            return await self._journal(req)
        if path == "/journal/verify" and method == "POST":
            _fields(form, ("csrf",))
            await self._verify_whole()
            return await req.redirect("/journal")  # (a reload does not post it again)
        if path == "/logout" and method == "POST":
            self.sessions.end(req.session.id)  # type: ignore[union-attr]
            expired = _cookie("", expire=True, secure=self.secure_cookie)
            return await req.redirect("/login", [(b"set-cookie", expired)])
        m = _DECIDE.fullmatch(path)
        if m is not None and method == "POST":
            return await self._decide(req, m.group(1), m.group(2), form)
        m = _CONTENT.fullmatch(path)
        if m is not None and method == "GET":
            return await self._content(req, m.group(1), m.group(2))
        m = _INVOCATION.fullmatch(path)
        if m is not None:
            iid, sub = m.group(1), m.group(2)
            if sub == "/reconcile" and method == "POST":
                return await self._reconcile(req, iid, form)
            if sub == "/result.json" and method == "GET":
                return await self._download(req, iid)
            if sub is None and method == "GET":
                return await self._invocation(req, iid)
        raise Refused(404, "no such page")

    def _session(self, req: Request) -> Session | None:
        """The request's session: alive, its operator still one, and (on loopback) the owner of
        the connecting socket; 403 when the cookie is presented by someone else.

        The cookie may come more than once (``Request.cookies``: another port of this host can
        set one that shadows the console's).  A value that is no live session is ignored --
        it cannot log the operator out; among live ones, on loopback, the connection's owner's
        is the session; without that check, two live sessions are refused: nothing done under
        either, since which one is the operator's cannot be told."""
        live: list[Session] = []
        for sid in req.cookies(COOKIE):
            session = self.sessions.get(sid, used=False)
            if session is None:
                continue
            if not self.broker.operator_policy.is_operator(session.operator):
                self.sessions.end(session.id)  # no longer an operator: the session is over
                log.warning(
                    "console: ended the session of uid %d: not an operator", session.operator.uid
                )
                continue
            live.append(session)
        if not live:
            return None
        if self.check_peer and not req.via_proxy:
            owner = req.owner()
            session = next((s for s in live if s.operator.uid == owner), live[0])
        elif len(live) > 1:
            log.warning("console: refused %s %s: two session cookies", req.method, req.shown_path)
            raise Refused(403, "refused: this request carries two console sessions; nothing done")
        else:
            session = live[0]
        self._require_peer(req, session.operator, "a session cookie")
        # The operator's request restarts the idle clock -- a stranger's refused one does not
        # (an agent holding the cookie would otherwise keep it alive), nor does a live page's
        # own reload (``AUTO``): nobody is at it.
        if not (req.method == "GET" and req.query.get(AUTO) == "1"):
            self.sessions.touch(session)
        return session

    def _require_peer(self, req: Request, operator: Operator, what: str) -> None:
        if not self.check_peer or req.via_proxy:
            return  # behind the declared proxy the cookie (the token) is the proof
        uid = req.owner()
        if uid != operator.uid:
            log.warning(
                "console: refused %s %s: %s of uid %d presented by %s",
                req.method,
                req.shown_path,
                what,
                operator.uid,
                "an unidentified peer" if uid is None else f"uid {uid}",
            )
            raise Refused(403, "refused: this connection is not the operator's; nothing done")

    def _same_origin(self, req: Request) -> None:
        origin = req.headers.get("origin")
        if origin is None:
            referer = req.headers.get("referer")
            parts = urlsplit(referer) if referer else None
            origin = f"{parts.scheme}://{parts.netloc}" if parts else None
        allowed = {self.public_origin} if req.via_proxy else self.origins
        if origin not in allowed:
            raise Refused(403, "refused: the request did not come from a console page")

    async def _checked_form(self, req: Request) -> dict[str, str]:
        """A POST's form, once its session, origin and CSRF token are proven; else 403."""
        if req.session is None:
            raise Refused(403, "not logged in (ask for a link with `affidavit console-url`)")
        self._same_origin(req)
        form = await req.form()
        if not req.session.csrf_ok(form.get("csrf")):
            raise Refused(403, "refused: the form's CSRF token is missing or wrong; nothing done")
        return form

    async def _static(self, req: Request, name: str) -> None:
        kind = STATIC.get(name)
        if kind is None or req.method != "GET":
            raise Refused(404, "no such file")
        data = resources.files("affidavit.console").joinpath("static", name).read_bytes()
        await req.answer(200, data, kind, cache=b"max-age=300")

    # -- login ------------------------------------------------------------------------------

    async def _login_page(self, req: Request) -> None:
        token = req.query.get("token") or ""
        await req.answer(200, self._render("login.html", req, failed=False, token=token))

    async def _login(self, req: Request) -> None:
        self._same_origin(req)
        token = (await req.form()).get("token") or ""
        try:
            # The connection's owner is checked before the token is used up: a stranger who
            # got hold of an operator's link is refused, and the link still works for them.
            who = self.tokens.redeem(token, lambda w: self._require_peer(req, w, "a login token"))
        except TokenDirError as exc:
            raise Refused(500, str(exc)) from None
        if who is not None and not self.broker.operator_policy.is_operator(who):
            who = None  # no longer an operator (the config changed since the link was made)
        if who is None:
            return await req.answer(403, self._render("login.html", req, failed=True, token=""))
        req.session = self.sessions.start(who)
        page = self._render("welcome.html", req)
        cookie = _cookie(req.session.id, secure=self.secure_cookie)
        await req.answer(200, page, headers=[(b"set-cookie", cookie)])

    # -- pages --------------------------------------------------------------------------------

    async def _approvals(self, req: Request) -> None:
        rows: list[tuple[str, markupsafe.Markup | None, str | None]] = []
        found = await self._reading(pages.approvals_page, "the pending approvals")
        for row in found["rows"]:
            iid = str(row.get("invocation_id"))
            try:
                html = self.templates.get_template("approval.html").render(
                    a=row,
                    csrf=req.session.csrf if req.session else "",
                )
                rows.append((iid, markupsafe.Markup(html), None))
            except Exception as exc:  # one request's failure is its own row's, not the page's
                log.exception("console: the approval %s could not be rendered", iid)
                rows.append((iid, None, f"{type(exc).__name__}: {exc}"))
        decided = req.session.take_notice("decided") if req.session else None
        page = self._render("approvals.html", req, rows=rows, decided=decided, total=found["total"])
        await req.answer(200, page)

    async def _actions(self, req: Request) -> None:
        filters = _filters(req.query)
        summary = self.summary
        data = await self._reading(
            lambda r: pages.actions_page(r, filters, summary),
            "the actions view",
            summarized=filters == pages.ActionFilters(),
        )
        shown = {k: v for k, v in req.query.items() if k != AUTO}
        page = self._render(
            "actions.html",
            req,
            f=shown,
            reload="?" + urlencode({**shown, AUTO: "1"}),
            live=req.query.get("live", "1") != "0",
            outcomes=pages.OUTCOMES,
            phases=pages.PHASES,
            codes=pages.CODES,
            **data,
        )
        await req.answer(200, page)

    async def _invocation(self, req: Request, iid: str, problem: Refused | None = None) -> None:
        data = await self._reading(lambda r: pages.invocation_page(r, iid), f"the record of {iid}")
        if data is None:
            raise Refused(404, f"no invocation {iid} in the journal")
        result = None
        if data["record"]["final"]:
            result = pages.result_view(await self._envelope(iid))
        page = self._render(
            "invocation.html",
            req,
            **data,
            result=result,
            problem=problem,
            done=req.session.take_notice("done", iid) if req.session and not problem else None,
        )
        await req.answer(problem.status if problem else 200, page)

    async def _download(self, req: Request, iid: str) -> None:
        envelope = await self._envelope(iid)
        if envelope is None:
            raise Refused(404, f"no invocation {iid} in the journal")
        body = json.dumps(envelope, sort_keys=True, indent=2).encode("utf-8") + b"\n"
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", iid)
        disposition = f'attachment; filename="{name}.json"'.encode()
        await req.answer(200, body, b"application/json", [(b"content-disposition", disposition)])

    async def _content(self, req: Request, iid: str, name: str) -> None:
        """One content of an approval's request, whole (``service.content``: the accepted
        action's bytes, checked against the view's hash): an attachment, never rendered."""
        try:
            data = await self.read(lambda r: service.content(r, iid, name))
        except OperatorError as exc:
            if exc.code == "CONTENT_MISMATCH":
                log.warning("console: refused the %s of %s: %s", name, iid, exc.message)
            raise Refused(exc.status, exc.message, exc.code) from None
        except JournalError as exc:  # 503 JOURNAL_UNAVAILABLE when away: nothing served
            raise _journal_refusal(exc, read_failure(exc, f"the approval of {iid}")) from None
        file = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{iid}.{name}")
        disposition = f'attachment; filename="{file}.bin"'.encode()
        await req.answer(
            200, data, b"application/octet-stream", [(b"content-disposition", disposition)]
        )

    async def _journal(self, req: Request) -> None:
        """The journal page (``KeptVerify``: the kept verify extended to the head)."""
        data = await self._verified(whole=False)
        summary = self.summary
        sessions = await self._reading(
            lambda r: pages.journal_sessions(r, summary), "the journal view", summarized=True
        )
        await req.answer(200, self._render("journal.html", req, **data, **sessions))

    async def _verify_whole(self) -> None:
        """The operator's press: a whole verify -- or, while one runs, that one (one at a time
        per journal).  A press meanwhile joins it: it waits on the event loop, holding no view
        thread (each press held one, waiting its turn on ``KeptVerify``'s lock: four presses
        took every view thread, and the views stalled), and its page is the running one's
        result.  A failure is answered to the press that ran it; a press that joined is sent to
        the page as it is."""
        running = self.verifying
        if running is not None:
            await running.wait()
            return
        self.verifying = done = trio.Event()
        try:
            await self._verified(whole=True)
        finally:
            self.verifying = None
            done.set()

    async def _verified(self, whole: bool) -> dict[str, Any]:
        """The journal page but its sessions (read on their own: a whole verify that runs does
        not hold them, nor they it)."""
        summary, kept = self.summary, self.verified
        return await self._reading(  # type: ignore[no-any-return]
            lambda r: pages.journal_page(r, summary, kept, whole, sessions=False),
            "the journal view",
        )

    # -- decisions ----------------------------------------------------------------------------

    async def _decide(self, req: Request, iid: str, verb: str, form: dict[str, str]) -> None:
        _fields(form, ("csrf", "note"))
        who = _operator(req)
        decision = self.broker.approve if verb == "approve" else self.broker.deny
        try:
            await decision(iid, note=form.get("note") or None, operator=who)
        except OperatorError as exc:
            raise Refused(exc.status, exc.message, exc.code) from None
        except JournalError as exc:  # 503 JOURNAL_UNAVAILABLE when away: nothing decided
            raise _journal_refusal(exc, service.decision_failure(exc, iid)) from None
        _operator_session(req).notice = ("decided", iid, "")
        await req.redirect("/approvals")

    async def _reconcile(self, req: Request, iid: str, form: dict[str, str]) -> None:
        _fields(form, ("csrf", "how", "note"))
        who = _operator(req)
        how = form.get("how")
        if how not in ("query", "committed", "rejected"):
            raise Refused(400, "how: choose query, committed or rejected", "BAD_REQUEST")
        try:
            answer = await self.broker.reconcile(
                iid,
                query=how == "query",
                attest=None if how == "query" else how,
                note=form.get("note") or None,
                operator=who,
            )
        except OperatorError as exc:
            problem = Refused(exc.status, exc.message, exc.code)
            return await self._invocation(req, iid, problem)
        except JournalError as exc:  # the page itself could not be read now: the error page
            raise _journal_refusal(exc, reconciling.failure(exc, iid)) from None
        refused = answer.get("refused")
        if refused is not None:  # the query ran; the record moved on meanwhile
            query_id = (answer.get("query") or {}).get("invocation_id")
            message = f"{refused['message']} (the query ran: {query_id}, linked in the timeline)"
            return await self._invocation(req, iid, Refused(409, message, refused["code"]))
        done = "reconciled" if answer["reconciled"] else "inconclusive"
        _operator_session(req).notice = ("done", iid, done)
        await req.redirect(f"/invocations/{quote(iid, safe='')}")

    # -- reading ------------------------------------------------------------------------------

    async def _reading(
        self, view: Callable[[JournalReader], Any], what: str, summarized: bool = False
    ) -> Any:
        try:
            return await (self.read_summarized if summarized else self.read)(view)
        except JournalError as exc:  # 503 JOURNAL_UNAVAILABLE naming ``what`` when away
            raise _journal_refusal(exc, read_failure(exc, what)) from None
        except OperatorError as exc:
            raise Refused(500, f"the journal could not be read: {exc}") from None

    async def _envelope(self, iid: str) -> dict[str, Any] | None:
        """The stored envelope, read as a resumed read from chunk 0: it records nothing (the
        console is not the caller; its look is no delivery)."""
        try:
            return await self.broker.fetch_result(iid, from_chunk=0)
        except (JournalUnavailable, ReadFailed, AlteredRow) as exc:  # not unverified: unread
            # (away, declined) or a row altered in place (JOURNAL_UNREADABLE, the journal's words)
            raise _journal_refusal(exc, read_failure(exc, f"the result of {iid}")) from None
        except JournalError as exc:
            raise Refused(500, f"the stored result does not verify: {exc}") from None


def _fields(form: dict[str, str], known: tuple[str, ...]) -> None:
    """400 ``INVALID_FIELD`` naming the first field of ``form`` not in ``known`` (as the
    daemon's operator routes and the call API refuse one); a name that is not plain printable
    text, or is long, is not echoed: ``form`` stands for it."""
    for key in sorted(form):
        if key not in known:
            raise Refused(400, f"{_shown(key, 'form')}: unknown field", "INVALID_FIELD")


def _shown(name: str, instead: str) -> str:
    """``name`` for a message, when it is short plain printable text; else ``instead``."""
    return name if len(name) <= 64 and name.isprintable() else instead


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


def _operator(req: Request) -> Operator:
    return _operator_session(req).operator


def _operator_session(req: Request) -> Session:
    assert req.session is not None
    return req.session


def _cookie(value: str, *, expire: bool = False, secure: bool = False) -> bytes:
    # Secure only behind a TLS proxy: on loopback the console speaks plain HTTP.
    tail = ("; Max-Age=0" if expire else "") + ("; Secure" if secure else "")
    return f"{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict{tail}".encode()


def _filters(query: Mapping[str, str]) -> pages.ActionFilters:
    def pick(name: str, allowed: list[str]) -> str | None:
        value = query.get(name) or None
        if value is not None and value not in allowed:
            raise Refused(400, f"{name}: expected one of {', '.join(allowed)}")
        return value

    def when(name: str) -> float | None:
        value = query.get(name) or None
        try:
            return parse_time(value) if value else None
        except ValueError as exc:
            raise Refused(400, f"{name}: {exc}") from None

    return pages.ActionFilters(
        session=query.get("session") or None,
        outcome=pick("outcome", pages.OUTCOMES),
        phase=pick("phase", pages.PHASES),
        code=pick("code", ["OK", *pages.CODES]),
        since=when("since"),
        until=when("until"),
    )


def _when(at: Any) -> str:
    return utc_time(at, "%Y-%m-%d %H:%M:%S UTC")
