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
                                        (POST /journal/verify: a whole verify begun in
                                        the background -- or the one that runs, joined --
                                        and 303 to the page at once)
    GET  /static/{console.css,console.js}

Every request must name the console in ``Host`` (its bound address, or
``[service] console_public_origin``; bound beyond loopback, only the latter -- the bound name
is plain HTTP across the network): another name is a DNS-rebinding page or a misdirected
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
no-store`` on everything that is not a static file, and ``Cross-Origin-Resource-Policy:
same-origin`` (no other origin's page may embed an answer: a port of 127.0.0.1 is another).
A request another site's page made (``Sec-Fetch-Site`` ``same-site`` or ``cross-site``) is
refused, 403, unless it is a top-level navigation GET; a prefetch or prerender
(``Sec-Purpose``) is refused, 503.  Only a request that passed every check, and that a console
page or the operator made (``Sec-Fetch-Site`` ``same-origin``, ``none`` or absent), restarts
the session's idle clock, and only such a request's page has its decision buttons enabled:
one another page navigated to (the double-click attack) shows them disabled, and its forms'
token decides nothing (``request.decision_forms``; 403 ``RELOAD_TO_DECIDE``) -- and so do all
the session's pages after it (``Session.held``) until the held page's reload link, which the
console's script arms, is followed (``/reload``).
``Cross-Origin-Opener-Policy: same-origin``: a page that opened the
console in a popup keeps no handle on it.

This module is the console's front door: routing, the Host, session, peer, origin and CSRF
checks, static files and the login.  The pages and decisions it routes to are ``handlers.py``
(``Handlers``, which ``Console`` extends); one request, its form and its answer with those
headers, ``request.py``.
"""

from __future__ import annotations

import re
import time
from importlib import resources
from typing import Any
from urllib.parse import quote, urlsplit

import jinja2
import trio

import affidavit
from affidavit.api.broker import Broker
from affidavit.approvals import Operator
from affidavit.config import is_loopback
from affidavit.journal import SessionSummary
from affidavit.spells import REFUSED_QUIET, UidSpells
from affidavit.text import outcome_counts, printable, shown_outcome, utc_time
from affidavit.views import metrics_key

from .auth import Session, Sessions, TokenDirError, TokenStore
from .handlers import Handlers, Slot, unlinked
from .request import (
    AUTO,
    COOKIE,
    Message,
    Read,
    Receive,
    Refused,
    Request,
    Send,
    _cookie,
    _fields,
    _shown,
    decision_forms,
    log,
)
from .text import content, length_mark, lines_of, session_name, visible
from .verified import KeptVerify

__all__ = ["COOKIE", "Console"]

STATIC = {"console.css": b"text/css; charset=utf-8", "console.js": b"text/javascript"}
_DECIDE = re.compile(r"/approvals/([^/]+)/(approve|deny)")
_CONTENT = re.compile(r"/approvals/([^/]+)/content/([a-z][a-z0-9_]*)")
_DECISION_PAGES = ("approval.html", "approvals.html", "invocation.html", "journal.html")
_INVOCATION = re.compile(r"/invocations/([^/]+)(/reconcile|/result\.json)?")


class Console(Handlers):
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
        slot: Slot = unlinked,
    ) -> None:
        self.broker = broker
        self.slot = slot
        """Where a reconciliation runs among the calls in flight (``Slot``)."""
        self.read = read
        self.read_summarized = read_summarized or read
        """``read`` for a view that brings ``summary`` to the head (the daemon's: they take
        turns on the event loop, not in threads waiting on its lock)."""
        self.summary = summary or SessionSummary(metrics_key)
        """The journal page's sessions and the unfiltered actions page's counts, brought up to
        date per request (the daemon's, shared with ``/v1/sessions`` and ``/v1/metrics``)."""
        self.verified = KeptVerify(self.summary)
        """The journal page's verify: the last whole one, extended to the head per request."""
        self.tokens = tokens
        self.sessions = Sessions()
        host = urlsplit(origin).hostname or ""
        # Bound beyond loopback, the console is served through TLS only: its TLS proxy's
        # origin is the one it answers to.  Its bound name is refused (421): a login link or a
        # cookie sent there would cross the network in clear.  (The config and the daemon
        # refuse such a console first: ``config.served_through_tls``.)
        if not is_loopback(host) and not (public_origin or "").startswith("https://"):
            raise ValueError("beyond loopback a console of plain HTTP needs an https:// origin")
        bound = () if is_loopback(host) else (origin,)
        self.origins = frozenset(o for o in (origin, public_origin) if o and o not in bound)
        self.hosts = frozenset(urlsplit(o).netloc for o in self.origins)
        # Who is on the other end can be asked of the kernel only on loopback.  Through a proxy
        # the proxy is the peer: its connections (those of ``proxy_uid``) carry the cookie as
        # the only proof, and name the public origin; every other connection is checked as
        # without a proxy.  With a proxy whose user is not declared, nothing is checked.
        if proxy_uid is not None and (public_origin is None or not is_loopback(host)):
            raise ValueError("a proxy's user is declared for a loopback console behind a proxy")
        self.proxy_uid = proxy_uid
        self.public_origin = public_origin
        self.public_host = urlsplit(public_origin).netloc if public_origin else None
        # ``Host`` as a proxy may forward it, with the scheme's default port the public origin
        # leaves out (``console.example:443``): the same name (``_host``).
        self.public_with_port = None
        if public_origin and urlsplit(public_origin).port is None:
            default = 443 if public_origin.startswith("https://") else 80
            self.public_with_port = f"{self.public_host}:{default}"
        self.check_peer = is_loopback(host) and (public_origin is None or proxy_uid is not None)
        # Served through TLS, the session cookie is Secure: a browser then never sends it over
        # plain HTTP -- not to a server an agent runs on another port of the public host,
        # where cookies (which ignore ports) would otherwise go.
        self.secure_cookie = (public_origin or "").startswith("https://")
        self._refusals = UidSpells()
        """Runs of ``PEER_REFUSED`` by (peer uid, session): logged once each (``_require_peer``)."""
        self._refusals_quiet = REFUSED_QUIET
        self.templates = jinja2.Environment(
            loader=jinja2.PackageLoader("affidavit.console", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.templates.filters["when"] = _when
        self.templates.filters["q"] = lambda s: quote(str(s), safe="")
        self.templates.filters["v"] = visible
        self.templates.filters["content"] = content
        self.templates.filters["lines"] = lines_of
        # An attribute's value (a filter's box): escaped text, as ``printable`` shows it -- the
        # ``v`` filter's marks are markup, which an attribute cannot hold.
        self.templates.filters["box"] = lambda s: printable(str(s))
        self.templates.filters["session"] = session_name
        self.templates.filters["outcome"] = lambda r: shown_outcome(r["outcome"], r["evidence"])
        self.templates.filters["outcome_counts"] = outcome_counts
        self.templates.filters["long"] = length_mark

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        req = Request(scope, receive, send)
        try:
            await self._route(req)
        except Refused as exc:
            page = self._render(
                "error.html", req, message=exc.message, code=exc.code, field=exc.field
            )
            after = exc.retry_after
            head = [] if after is None else [(b"retry-after", b"%d" % after)]
            if exc.close:
                head.append((b"connection", b"close"))
            await req.answer(exc.status, page, headers=head)
        except Exception:
            log.exception("console: %s %s failed", req.method, req.shown_path)
            page = self._render(
                "error.html",
                req,
                message="the console failed; see its log",
                code="CONSOLE_FAILED",
                field=None,
            )
            await req.answer(500, page)

    def _render(self, name: str, req: Request, **context: Any) -> bytes:
        session = req.session
        forms = decision_forms(req, name in _DECISION_PAGES)
        text = self.templates.get_template(name).render(
            operator=session.operator if session else None,
            **forms,
            # The query kept: a held /invocations/X?from=N reloads as itself (review rv51c2).
            reload_here=quote(req.path) + (f"?{req.query_string}" if req.query_string else ""),
            version=affidavit.__version__,
            here=req.path,
            **context,
        )
        return text.encode("utf-8")

    async def _route(self, req: Request) -> None:
        path, method = req.path, req.method
        host = self._host(req)
        if host not in self.hosts:
            raise Refused(421, "this console is not served under that name", "HOST_REFUSED")
        if self.proxy_uid is not None:
            req.via_proxy = req.owner() == self.proxy_uid
            if req.via_proxy and host != self.public_host:
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
                    421,
                    "through the proxy this console is served only as its public origin",
                    "HOST_REFUSED",
                )
        if req.repeated:  # one of its values would be dropped unseen
            message = f"{_shown(req.repeated[0], 'query')}: query parameter given twice"
            raise Refused(400, message, "INVALID_FIELD", field=_shown(req.repeated[0], "query"))
        if path.startswith("/static/"):
            return await self._static(req, path.removeprefix("/static/"))
        if path == "/login" and method == "GET":
            return await self._login_page(req)
        if path == "/login" and method == "POST":
            return await self._login(req)
        req.session = self._session(req)
        _same_site_or_navigation(req)
        _not_speculative(req)
        if method == "POST":
            form = await self._checked_form(req)  # 403 before anything else is looked at
        elif method != "GET":
            raise Refused(
                405, f"{_shown(method, 'this method')} is not used here", "METHOD_NOT_ALLOWED"
            )
        elif req.session is None:
            return await req.redirect("/login")
        else:
            _hold(req, req.session)
        # Only now may the request be the operator's: it restarts the idle clock -- a refused
        # one (a stranger's, a hostile page's 403'd post or image) never does, nor does a live
        # page's own reload (``AUTO``, nobody is at it), nor a navigation another page started
        # (``_operator_s_own``).
        if _operator_s_own(req) and not (method == "GET" and req.query.get(AUTO) == "1"):
            self.sessions.touch(req.session)  # type: ignore[arg-type]
        if path == "/reload" and method == "GET":
            return await req.redirect(_reloaded(req, req.session))  # type: ignore[arg-type]
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
        raise Refused(404, "no such page", "NOT_FOUND")

    def _host(self, req: Request) -> str | None:
        """``Host`` as the console's origins write it: lower-cased (a name is case-blind), and
        the public origin's name with its scheme's default port is that name."""
        host = req.headers.get("host")
        host = None if host is None else host.lower()
        return self.public_host if host == self.public_with_port else host

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
            message = "refused: this request carries two console sessions; nothing done"
            raise Refused(403, message, "SESSION_AMBIGUOUS")
        else:
            session = live[0]
        self._require_peer(req, session.operator, "a session cookie", session.id)
        return session  # (not touched: the request may yet be refused -- ``_route``)

    def _require_peer(self, req: Request, operator: Operator, what: str, session: str = "") -> None:
        """403 ``PEER_REFUSED`` unless the connection is ``operator``'s (on loopback, without
        the declared proxy); ``what`` was presented -- of ``session`` (its id: never logged)."""
        if not self.check_peer or req.via_proxy:
            return  # behind the declared proxy the cookie (the token) is the proof
        uid = req.owner()
        if uid != operator.uid:
            self._log_refused(req, operator, uid, what, session)
            message = "refused: this connection is not the operator's; nothing done"
            raise Refused(403, message, "PEER_REFUSED")  # (and the connection closed)

    def _log_refused(
        self, req: Request, operator: Operator, uid: int | None, what: str, session: str
    ) -> None:
        """A refusal's log: the first of a run by (peer uid, session) a warning, the rest
        counted and their count logged once the run is over (``REFUSED_QUIET`` without one) --
        a cookie replayed in a loop is one line, not one per request (``spells.UidSpells``,
        the spells the daemon's connection caps log by)."""
        now = time.monotonic()
        peer = "an unidentified peer" if uid is None else f"uid {uid}"
        self.end_refusal_runs(now)
        if self._refusals.turned_away((peer, what, operator.uid, session), now):
            log.warning(
                "console: refused %s %s: %s of uid %d presented by %s (its further refusals "
                "are counted, and logged once %g s pass without one)",
                req.method,
                req.shown_path,
                what,
                operator.uid,
                peer,
                self._refusals_quiet,
            )

    def end_refusal_runs(self, now: float) -> None:
        """The runs of refusals over at ``now`` (``REFUSED_QUIET`` without one): each one's
        count logged, when it was more than its first line."""
        for key, count in self._refusals.over(now, self._refusals_quiet):
            if count > 1:
                log.info(
                    "console: %d more requests of %s with %s of uid %d were refused",
                    count - 1,
                    *key[:3],  # type: ignore[index]
                )

    async def keep_refusal_log(self) -> None:
        """Upkeep for the daemon's life: a run's count logged once it is over, though no later
        refusal comes to end it (it was logged only then: a run that stopped stayed unsaid)."""
        while True:
            await trio.sleep(self._refusals_quiet / 4)
            self.end_refusal_runs(time.monotonic())

    def _same_origin(self, req: Request) -> None:
        origin = req.headers.get("origin")
        if origin is None:
            referer = req.headers.get("referer")
            parts = urlsplit(referer) if referer else None
            origin = f"{parts.scheme}://{parts.netloc}" if parts else None
        allowed = {self.public_origin} if req.via_proxy else self.origins
        if origin not in allowed:
            message = "refused: the request did not come from a console page"
            raise Refused(403, message, "ORIGIN_REFUSED")

    async def _checked_form(self, req: Request) -> dict[str, str]:
        """A POST's form, once its session, origin and CSRF token are proven; else 403."""
        if req.session is None:
            message = "not logged in (ask for a link with `affidavit console-url`)"
            raise Refused(403, message, "NOT_LOGGED_IN")
        self._same_origin(req)
        form = await req.form()
        given = form.get("csrf")
        if not req.session.csrf_ok(given, decision=False):
            message = "refused: the form's CSRF token is missing or wrong; nothing done"
            raise Refused(403, message, "CSRF_REFUSED", field="csrf")
        if req.path != "/logout" and not req.session.csrf_ok(given):
            # Every other form decides (approve, deny, reconcile, verify): its page must have
            # been rendered with the buttons enabled -- one another page navigated to was not.
            message = (
                "refused: this form was on a page another page opened; reload the page "
                "to decide; nothing done"
            )
            raise Refused(403, message, "RELOAD_TO_DECIDE", field="csrf")
        return form

    async def _static(self, req: Request, name: str) -> None:
        kind = STATIC.get(name)
        if kind is None or req.method != "GET":
            raise Refused(404, "no such file", "NOT_FOUND")
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
            # Its path and owners are for the daemon's log, not for anyone posting /login.
            log.error("console: login tokens unusable: %s", printable(str(exc)))
            raise Refused(
                500, "the console cannot read login tokens; see its log", "FILE_UNUSABLE"
            ) from None
        if who is not None and not self.broker.operator_policy.is_operator(who):
            who = None  # no longer an operator (the config changed since the link was made)
        if who is None:
            return await req.answer(403, self._render("login.html", req, failed=True, token=""))
        req.session = self.sessions.start(who)
        page = self._render("welcome.html", req)
        cookie = _cookie(req.session.id, secure=self.secure_cookie)
        await req.answer(200, page, headers=[(b"set-cookie", cookie)])


def _same_site_or_navigation(req: Request) -> None:
    """403 for a request another site's page made (``Sec-Fetch-Site``, Fetch Metadata: a
    browser sends it and a page cannot forge it) unless it is a top-level navigation GET -- a
    link the operator followed.  ``same-site`` counts too: a page an agent serves on another
    port of 127.0.0.1 is the same site (a site ignores ports), and its ``<img>`` or form would
    otherwise reach the console with the operator's cookie and keep the session alive.  A
    request without the header (not a browser's, or an old one) is left to the other checks."""
    site = req.headers.get("sec-fetch-site")
    if site not in ("same-site", "cross-site"):
        return
    navigation = (
        req.headers.get("sec-fetch-mode") == "navigate"
        and req.headers.get("sec-fetch-dest") == "document"
    )
    if req.method == "GET" and navigation:
        return
    raise Refused(
        403, "refused: another site's page made this request; nothing done", "SITE_REFUSED"
    )


def _hold(req: Request, session: Session) -> None:
    """A GET another page's navigation made holds the session's pages (``Session.held``).
    Only the held page's armed reload link ends it (``_reloaded``).  Not a reload by the
    browser: chromium sends a reload -- and a back or forward to a page it refetches (no-store)
    -- the ``Sec-Fetch-Site`` of the navigation that first reached the page, ``same-site``
    again (chromedriver's refresh, 2026-12).  Nor ``none`` (the address bar, a bookmark): a
    back to a page first opened so is sent ``none`` too, and another page can send this tab
    back (``history.back()``)."""
    if req.headers.get("sec-fetch-site") in ("same-site", "cross-site"):
        session.held = True


def _reloaded(req: Request, session: Session) -> str:
    """``/reload?to=PATH``, the held page's reload link (base.html): the page is reloaded, no
    longer held, when a console page's link asked (``Sec-Fetch-Site: same-origin``) -- the
    console's script gives the link its address only once the operator is at the page, as it
    arms a decision button.  Where to: the console's path named, else /approvals (no other
    site: an open redirect would be a hostile page's link with the console's name on it)."""
    if req.headers.get("sec-fetch-site") == "same-origin":
        session.held = False
    to = req.query.get("to") or ""
    own = to.startswith("/") and not to.startswith("//") and "\\" not in to
    plain = to.isascii() and to.isprintable() and len(to) <= 2048  # (as ``quote`` makes it)
    return to if own and plain else "/approvals"


def _not_speculative(req: Request) -> None:
    """503 for a request the browser makes ahead of the operator (``Sec-Purpose: prefetch``,
    ``prefetch;prerender``; the older ``Purpose: prefetch``): a page's speculation rules
    (``<script type=speculationrules>``) make chromium fetch a console page with the cookie,
    labelled a top-level navigation the operator started (``Sec-Fetch-Site: none``) -- a
    hostile page on another port could keep a session alive forever without a click.  Nobody
    asked for it: nothing is served (a prefetch answered other than 2xx is dropped, and the
    operator's own navigation fetches the page again), and the idle clock stays."""
    if "sec-purpose" in req.headers or "purpose" in req.headers:
        raise Refused(
            503, "refused: a prefetch is no request of the operator's", "PREFETCH_REFUSED"
        )


def _operator_s_own(req: Request) -> bool:
    """Whether the request restarts the session's idle clock: only a console page's own
    (``Sec-Fetch-Site: same-origin``), one the operator typed or opened from a bookmark
    (``none``), or a client's that sends no Fetch Metadata.  A navigation another page
    started (``same-site``: a page on another port of 127.0.0.1, which can re-navigate a
    popup at will) is served -- it may be a link the operator followed -- but keeps nobody
    logged in."""
    return req.headers.get("sec-fetch-site") in (None, "same-origin", "none")


def _when(at: Any) -> str:
    return utc_time(at, "%Y-%m-%d %H:%M:%S UTC")
