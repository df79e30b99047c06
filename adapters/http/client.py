"""The trio driver: DNS, TCP, proxy tunnel, TLS, the pool, the exchange, redirects.

It drives ``HttpExchange`` (sans-IO, ``machine.py``) and never decides an outcome itself: a
failure is classified by the last boundary the ``ProtocolMachine`` proved (adapters/base.py).

* Setup stages each run under their own ``trio.fail_after(timeouts.connect)`` and name their
  stage (``dns``, ``tcp_connect``, ``proxy_connect``, ``tls_handshake``) so a wrong host name is
  told apart from a rejected certificate (seed, "Connection setup needs a precise end point").
* The gate is awaited before the first request byte of *every* hop, on fresh and pooled
  connections alike; if it raises nothing is written and the connection goes back to the pool.
* A reused connection's write error after the gate is ``unknown``: "A failed write says almost
  nothing about what the other side has already read" (seed).
* Nothing here logs, raises or returns a header value, a URL query or a response body
  (``Redactor`` scrubs what must be returned; exception details are fixed texts and errno names).
"""

from __future__ import annotations

import base64
import binascii
import errno
import hashlib
import logging
import math
import select
import ssl
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final

import h11
import trio

from affidavit.adapters.base import AttemptContext, AttemptInterrupted, RemoteResult, SetupError
from affidavit.statemachine import Code

from .classify import Redactor, classify_response, header_value, parse_proxy_status
from .machine import FramingError, HttpExchange, Observation

__all__ = ["HttpClient", "HttpRequest", "RedirectDecision", "Timeouts"]

log = logging.getLogger("affidavit.adapters.http")

REDIRECT_STATUSES: Final = frozenset({301, 302, 303, 307, 308})
EXPECT_CONTINUE_WAIT: Final = 1.0
"""RFC 9110 §10.1.1: a client that sent ``Expect: 100-continue`` need not wait indefinitely."""
REDIRECT_BODY_BUFFER: Final = 64 * 1024
"""Bytes of a to-be-followed 3xx body kept in case the next hop cannot be set up and the 3xx
becomes the result after all."""
READ_SIZE: Final = 65536
_DROP_REQUEST_HEADERS: Final = frozenset({"host", "content-length", "transfer-encoding", "expect"})
_DROP_RESPONSE_HEADERS: Final = frozenset({"set-cookie", "set-cookie2"})


@dataclass(frozen=True)
class Timeouts:
    """Per-phase limits in seconds.  ``connect`` applies to each setup stage on its own, ``write``
    to each handoff of bytes, ``read`` to each wait for response bytes (an inactivity limit)."""

    connect: float = 5.0
    write: float = 30.0
    read: float = 30.0


@dataclass(frozen=True)
class RedirectDecision:
    allowed: bool
    keep_credential: bool
    reason: str = ""


@dataclass
class HttpRequest:
    method: str
    # repr=False: the URL and headers carry the injected credential, and a dataclass repr
    # (a debug line, an assertion message) would print it.
    url: str = field(repr=False)
    """Absolute; the credential query parameter (if any) is already added."""
    headers: list[tuple[str, str]] = field(repr=False)
    """Credential header(s) already injected."""
    body: bytes = b""
    credential_headers: frozenset[str] = frozenset()
    """Lower-case names of the headers carrying the credential."""
    credential_query: str | None = None
    """Name of the query parameter carrying the credential."""
    ca_file: str | None = None
    proxy: str | None = None
    """``http://host:port``: a forward proxy for http:// URLs, a CONNECT tunnel for https://."""
    follow_redirects: bool = False
    redirect_policy: Callable[[str, str], RedirectDecision] | None = None
    """(method, absolute url) -> decision; the url passed has the credential query removed."""
    max_redirects: int = 5
    timeouts: Timeouts = field(default_factory=Timeouts)
    expect_continue: bool = False


# -- URLs -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Url:
    scheme: str
    host: str
    port: int
    path_query: str

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"

    @property
    def hostport(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def origin(self) -> str:
        return f"{self.scheme}://{self.hostport}"

    @property
    def absolute(self) -> str:
        return f"{self.scheme}://{self.authority}{self.path_query}"


class _BadUrl(ValueError):
    pass


def _parse_url(url: str, *, schemes: frozenset[str] = frozenset({"http", "https"})) -> _Url:
    # Error texts name the problem, never the URL (its query may carry the credential).
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise _BadUrl("URL does not parse") from e
    scheme = parts.scheme.lower()
    if scheme not in schemes:
        raise _BadUrl("URL scheme must be " + " or ".join(sorted(schemes)))
    if not parts.hostname:
        raise _BadUrl("URL has no host")
    if parts.username is not None or parts.password is not None:
        raise _BadUrl("URL must not carry userinfo")
    path = parts.path or "/"
    pq = f"{path}?{parts.query}" if parts.query else path
    return _Url(scheme, parts.hostname, port or (443 if scheme == "https" else 80), pq)


def _query_values(url: str, name: str | None) -> list[str]:
    if not name:
        return []
    q = urllib.parse.urlsplit(url).query
    return [v for k, v in urllib.parse.parse_qsl(q, keep_blank_values=True) if k == name]


def _set_query(url: str, name: str, values: list[str]) -> str:
    """``url`` with every ``name`` parameter removed, then ``values`` appended under it."""
    parts = urllib.parse.urlsplit(url)
    kept = [
        (k, v) for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True) if k != name
    ]
    kept += [(name, v) for v in values]
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(kept)))


# -- the pool -----------------------------------------------------------------------------------

_PoolKey = tuple[str, str, int, str | None, str | None]


@dataclass(eq=False)
class _Connection:
    id: str
    key: _PoolKey
    stream: trio.abc.Stream
    socket_stream: trio.SocketStream
    h11: h11.Connection
    peer: dict[str, Any] | None
    via_proxy: str | None
    forward_proxy: bool
    idle_since: float = 0.0
    requests: int = 0

    def looks_stale(self) -> bool:
        """A pooled connection must be silent while idle.  Readable means EOF, a reset, or bytes
        nobody asked for — any of those makes the next request's fate ambiguous, so the socket is
        discarded *before* the boundary instead (zero-timeout poll, no blocking)."""
        try:
            fd = self.socket_stream.socket.fileno()
            if fd < 0:
                return True
            readable, _w, _x = select.select([fd], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)


class _HopSetupFailed(Exception):
    """Setup of a redirect hop failed before its request was written."""

    def __init__(self, code: Code, stage: str) -> None:
        self.code, self.stage = code, stage
        super().__init__(f"{code.value} at {stage}")


@dataclass
class _HopResult:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    hop_summary: dict[str, Any]
    peer: dict[str, Any] | None
    body_bytes: int
    body_sha256: str
    buffered_body: bytes | None
    buffered_complete: bool


@dataclass
class _Plan:
    """What to do with the response being read, decided at its head."""

    disposition: str = "sink"  # sink | follow | proxy_error
    next_url: str | None = None
    next_method: str = ""
    keep_credential: bool = False
    redirect_facts: dict[str, Any] = field(default_factory=dict)


class HttpClient:
    """Owns the connection pool; one per broker.  ``async with HttpClient() as c:`` closes it.

    ``max_per_origin`` caps the idle connections kept per pool key (scheme, host, port, proxy,
    CA file); ``idle_timeout`` discards pooled connections idle longer than that.  The default
    covers 64 concurrent calls to one origin: with 16, three calls in four reconnected
    (tests/benchmarks/http_overhead.py)."""

    def __init__(self, *, max_per_origin: int = 64, idle_timeout: float = 30.0) -> None:
        self._max_idle = max_per_origin
        self._idle_timeout = idle_timeout
        self._idle: dict[_PoolKey, list[_Connection]] = {}
        self._ssl: dict[str | None, ssl.SSLContext] = {}
        self._next_id = 0
        self._closed = False

    async def __aenter__(self) -> HttpClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for c in conns:
                await trio.aclose_forcefully(c.stream)

    def idle_connections(self) -> int:
        """How many connections sit in the pool (diagnostics and tests)."""
        return sum(len(v) for v in self._idle.values())

    # -- perform ----------------------------------------------------------------------------

    async def perform(self, request: HttpRequest, ctx: AttemptContext) -> RemoteResult:
        if self._closed:
            raise SetupError(Code.SETUP_FAILED, "pool", "client is closed")
        redactor = Redactor(self._secret_values(request))
        method = request.method.upper()
        url = request.url
        headers = list(request.headers)
        body = request.body
        hops: list[dict[str, Any]] = []
        redirects = 0
        pending_result: _HopResult | None = None
        pending_facts: dict[str, Any] = {}
        hop = 1
        while True:
            try:
                target = _parse_url(url)
            except _BadUrl as e:
                if hop == 1:
                    raise SetupError(Code.SETUP_FAILED, "url", str(e)) from None
                raise AssertionError("redirect target was validated before following") from e
            plan = _Plan()
            try:
                res = await self._hop(
                    request, ctx, hop, method, target, headers, body, redactor, plan, redirects
                )
            except _HopSetupFailed as e:
                # The previous hop's complete 3xx stands as the result; the next request was
                # never written (seed: each redirect hop is its own dispatch boundary).
                assert pending_result is not None
                pending_facts["redirect_not_followed"] = {
                    "hop": hop,
                    "code": e.code.value,
                    "stage": e.stage,
                }
                return await self._result(
                    pending_result, ctx, hops, redactor, pending_facts, sink_buffer=True
                )
            hops.append(res.hop_summary)
            if plan.disposition == "proxy_error":
                ps = parse_proxy_status(header_value(res.headers, "proxy-status"))
                raise AttemptInterrupted(
                    Code.REMOTE_OUTCOME_UNKNOWN,
                    "a proxy answered with its own error; the origin's outcome is unknown",
                    facts={
                        "hop": "proxy",
                        "status": res.status,
                        "proxy_status": redactor.scrub(ps),
                        "via_proxy": res.hop_summary["via_proxy"],
                        "hops": hops,
                    },
                )
            if plan.disposition != "follow":
                extra = {"redirects": redirects, **plan.redirect_facts}
                return await self._result(res, ctx, hops, redactor, extra)
            assert plan.next_url is not None
            redirects += 1
            step = ctx.machine.fire("follow_redirect")
            ctx.observe(step, {"hop": hop, "status": res.status, **plan.redirect_facts})
            log.debug("following redirect hop=%d to %s", hop + 1, _parse_url(plan.next_url).origin)
            pending_result = res
            pending_facts = {"redirects": redirects - 1}
            if plan.next_method != method:
                # RFC 9110 §15.4.4 (303) and §15.4.2/3 (POST after 301/302): GET, no content.
                body = b""
                headers = [
                    (n, v)
                    for n, v in headers
                    if n.lower() not in {"content-type", "content-encoding", "content-language"}
                ]
            method = plan.next_method
            if plan.keep_credential:
                url = plan.next_url
                if request.credential_query:
                    url = _set_query(
                        plan.next_url,
                        request.credential_query,
                        _query_values(request.url, request.credential_query),
                    )
            else:
                url = plan.next_url
                headers = [
                    (n, v) for n, v in headers if n.lower() not in request.credential_headers
                ]
            hop += 1

    # -- one hop ------------------------------------------------------------------------------

    async def _hop(
        self,
        request: HttpRequest,
        ctx: AttemptContext,
        hop: int,
        method: str,
        target: _Url,
        headers: list[tuple[str, str]],
        body: bytes,
        redactor: Redactor,
        plan: _Plan,
        redirects: int,
    ) -> _HopResult:
        conn, reused = await self._acquire(request, ctx, hop, target)
        ex = HttpExchange(ctx.machine, conn.h11, hop)
        ex.proxy_judge = lambda status, hdrs: (
            classify_response(status, hdrs, via_forward_proxy=conn.forward_proxy).hop == "proxy"
        )
        gate_facts = {
            "hop": hop,
            "origin": target.origin,
            "connection": conn.id,
            "reused_connection": reused,
            "peer": conn.peer,
            "via_proxy": conn.via_proxy,
        }
        if ctx.machine.crosses_dispatch("send_headers"):
            try:
                await ctx.gate(gate_facts)
            except BaseException:
                # Nothing was written and h11 never heard of the request: the connection is as
                # good as before and goes back to the pool.
                obs = ex.setup("gate_refused", {"connection": conn.id})
                ctx.observe(obs.step, obs.facts)
                self._release(conn)
                raise
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
        state: dict[str, Any] = {"during": "write"}
        sha = hashlib.sha256()
        buffered = bytearray()
        buffered_complete = True
        head_obs: Observation | None = None

        async def handle(observations: list[Observation]) -> None:
            nonlocal head_obs, buffered_complete
            for obs in observations:
                ctx.observe(obs.step, obs.facts)
                if obs.status is not None:
                    head_obs = obs
                    self._plan(request, plan, method, target, obs, conn, redirects, redactor)
                if obs.data:
                    sha.update(obs.data)
                    if plan.disposition == "sink":
                        await ctx.sink("body", obs.data)
                    elif plan.disposition == "follow":
                        if len(buffered) + len(obs.data) <= REDIRECT_BODY_BUFFER:
                            buffered.extend(obs.data)
                        else:
                            buffered_complete = False

        # One cancel scope for the whole exchange, re-armed per phase (``io.deadline``), instead
        # of a new ``fail_after`` scope per handoff and per read: a stalled peer still times out
        # per write and per read (``Timeouts``), at a fraction of the cost.  The deadline is
        # lifted while received bytes are handled: the sink's journal writes are not the
        # peer's silence.
        io = trio.CancelScope()

        async def read_some(limit: float) -> None:
            io.deadline = trio.current_time() + limit
            data = await conn.stream.receive_some(READ_SIZE)
            io.deadline = math.inf
            await handle(ex.receive(bytes(data)))

        has_body = bool(body) or method in {"POST", "PUT", "PATCH"}
        out_headers = [(n, v) for n, v in headers if n.lower() not in _DROP_REQUEST_HEADERS]
        out_headers.insert(0, ("Host", target.authority))
        if has_body:
            out_headers.append(("Content-Length", str(len(body))))
        expect = request.expect_continue and bool(body)
        if expect:
            out_headers.append(("Expect", "100-continue"))
        req_target = target.absolute if conn.forward_proxy else target.path_query
        t = request.timeouts
        try:
            with io:
                obs, head = ex.start_request(method, req_target, out_headers, has_body=has_body)
                ctx.observe(obs.step, obs.facts)
                io.deadline = trio.current_time() + t.write
                await conn.stream.send_all(head)
                if expect:
                    state["during"] = "expect_continue"
                    with trio.move_on_after(min(t.read, EXPECT_CONTINUE_WAIT)):
                        while not ex.informational_seen and not ex.final_response_started:
                            await read_some(t.read)
                if not ex.final_response_started:
                    state["during"] = "write"
                    tail = ex.body_bytes(body)
                    if tail:
                        io.deadline = trio.current_time() + t.write
                        await conn.stream.send_all(tail)
                    obs = ex.body_written()
                    ctx.observe(obs.step, obs.facts)
                state["during"] = "read"
                while not ex.finished:
                    await read_some(t.read)
            if io.cancelled_caught:
                raise trio.TooSlowError
        except trio.TooSlowError:
            exc = self._interrupted(ctx, ex, conn, reused, "timed_out", state)
            await trio.aclose_forcefully(conn.stream)
            raise exc from None
        except FramingError as e:
            # ``receive`` already fired peer_closed / malformed; report what it fired.
            for o in e.observations:
                ctx.observe(o.step, o.facts)
            await trio.aclose_forcefully(conn.stream)
            raise self._interrupted_code(ex, conn, reused, str(e), state) from None
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
            # trio wraps OS and TLS errors in BrokenResourceError; the cause's errno name is the
            # only detail kept (its text could echo request bytes in exotic stacks).
            exc = self._interrupted(ctx, ex, conn, reused, "transport_error", state, _errno_name(e))
            await trio.aclose_forcefully(conn.stream)
            raise exc from None
        except BaseException as e:
            # Cancellation (or a sink/observer failure) after dispatch: the remote may be
            # running; the engine classifies by ``machine.dispatched`` (seed: "Cancellation
            # after dispatch is not a preflight error").  Only the exception's type is kept.
            obs2 = ex.abort(
                "cancelled", {"during": state["during"], "local_error": type(e).__name__}
            )
            if obs2 is not None:
                ctx.observe(obs2.step, obs2.facts)
            await trio.aclose_forcefully(conn.stream)
            raise
        assert head_obs is not None and head_obs.status is not None
        if ex.reusable:
            conn.h11.start_next_cycle()
            self._release(conn)
        else:
            await trio.aclose_forcefully(conn.stream)
        hop_summary["status"] = head_obs.status
        return _HopResult(
            status=head_obs.status,
            reason=head_obs.reason,
            headers=list(head_obs.headers),
            hop_summary=hop_summary,
            peer=conn.peer,
            body_bytes=ex.body_bytes_received,
            body_sha256=sha.hexdigest(),
            buffered_body=bytes(buffered) if plan.disposition == "follow" else None,
            buffered_complete=buffered_complete,
        )

    def _plan(
        self,
        request: HttpRequest,
        plan: _Plan,
        method: str,
        target: _Url,
        head: Observation,
        conn: _Connection,
        redirects: int,
        redactor: Redactor,
    ) -> None:
        """Decide at the response head where its body goes (before any byte of it arrives)."""
        assert head.status is not None
        cls = classify_response(head.status, head.headers, via_forward_proxy=conn.forward_proxy)
        if cls.hop == "proxy":
            plan.disposition = "proxy_error"
            return
        if head.status not in REDIRECT_STATUSES or not request.follow_redirects:
            return
        location = header_value(head.headers, "location")
        if location is None:
            plan.redirect_facts = {"redirect_not_followed": {"reason": "no Location"}}
            return
        if redirects >= request.max_redirects:
            plan.redirect_facts = {
                "redirect_limit": request.max_redirects,
                "redirects": redirects,
            }
            return
        try:
            nxt = urllib.parse.urljoin(target.absolute, location.strip())
            _parse_url(nxt)
        except (_BadUrl, ValueError) as e:
            plan.redirect_facts = {"redirect_not_followed": {"reason": str(e)}}
            return
        if request.credential_query:
            nxt = _set_query(nxt, request.credential_query, [])
        nxt = urllib.parse.urldefrag(nxt).url
        new_method = method
        if (head.status == 303 and method != "HEAD") or (
            head.status in (301, 302) and method == "POST"
        ):
            new_method = "GET"
        if request.redirect_policy is None:
            decision = RedirectDecision(False, False, "no redirect policy")
        else:
            decision = request.redirect_policy(new_method, nxt)
        new_origin = _parse_url(nxt).origin
        if not decision.allowed:
            plan.redirect_facts = {
                "redirect_not_followed": {
                    "reason": redactor.scrub(decision.reason) or "policy refused",
                    "origin": new_origin,
                }
            }
            return
        plan.disposition = "follow"
        plan.next_url = nxt
        plan.next_method = new_method
        plan.keep_credential = decision.keep_credential
        plan.redirect_facts = {
            "to_origin": new_origin,
            "method": new_method,
            "credential_kept": decision.keep_credential,
        }

    async def _result(
        self,
        res: _HopResult,
        ctx: AttemptContext,
        hops: list[dict[str, Any]],
        redactor: Redactor,
        extra: Mapping[str, Any],
        *,
        sink_buffer: bool = False,
    ) -> RemoteResult:
        if sink_buffer and res.buffered_body:
            await ctx.sink("body", res.buffered_body)
        cls = classify_response(res.status, res.headers, via_forward_proxy=False)
        ps = parse_proxy_status(header_value(res.headers, "proxy-status"))
        summary = {
            "status": res.status,
            "reason": redactor.scrub(res.reason),
            "headers": [
                [n, v]
                for n, v in res.headers
                if n.lower() not in _DROP_RESPONSE_HEADERS and not redactor.contains(v)
            ],
            "http_version": "1.1",
            "hops": hops,
        }
        if sink_buffer and not res.buffered_complete:
            summary["body_truncated"] = True
        facts: dict[str, Any] = {
            "status": res.status,
            "hop": "origin",
            "remote_request_id": redactor.scrub(header_value(res.headers, "x-request-id")),
            "proxy_status": redactor.scrub(ps),
            "peer": res.peer,
            "body_bytes": res.body_bytes,
            "body_sha256": res.body_sha256,
            **redactor.scrub(dict(extra)),
        }
        assert cls.outcome is not None
        return RemoteResult(cls.outcome, cls.code, facts, summary, cls.retry_after)

    # -- connections --------------------------------------------------------------------------

    def _secret_values(self, request: HttpRequest) -> list[str]:
        vals = [v for n, v in request.headers if n.lower() in request.credential_headers]
        for v in list(vals):
            scheme, _, token = v.partition(" ")
            if scheme.lower() == "basic" and token:
                # RFC 7617: the decoded user-id:password, and the password alone, are what a
                # server that decodes the header would echo back.
                try:
                    user_pass = base64.b64decode(token.strip(), validate=True).decode("utf-8")
                except (binascii.Error, ValueError):
                    continue
                vals += [user_pass, user_pass.partition(":")[2]]
        for v in _query_values(request.url, request.credential_query):
            vals += [v, urllib.parse.quote_plus(v), urllib.parse.quote(v, safe="")]
        return vals

    def _ssl_context(self, ca_file: str | None) -> ssl.SSLContext:
        ctx = self._ssl.get(ca_file)
        if ctx is None:
            # Verification on, host name checked (create_default_context's defaults); a custom
            # CA file per target replaces the system store for that target only.
            ctx = ssl.create_default_context(cafile=ca_file)
            self._ssl[ca_file] = ctx
        return ctx

    def _release(self, conn: _Connection) -> None:
        if self._closed:
            conn.socket_stream.socket.close()
            return
        conn.idle_since = trio.current_time()
        idle = self._idle.setdefault(conn.key, [])
        idle.append(conn)
        while len(idle) > self._max_idle:
            old = idle.pop(0)
            old.socket_stream.socket.close()

    async def _acquire(
        self, request: HttpRequest, ctx: AttemptContext, hop: int, target: _Url
    ) -> tuple[_Connection, bool]:
        key: _PoolKey = (target.scheme, target.host, target.port, request.proxy, request.ca_file)
        idle = self._idle.get(key, [])
        now = trio.current_time()
        while idle:
            conn = idle.pop()  # most recently used first: least likely to have been closed
            too_old = now - conn.idle_since > self._idle_timeout
            if too_old or conn.looks_stale():
                await trio.aclose_forcefully(conn.stream)
                log.debug("discarded idle connection %s to %s", conn.id, target.origin)
                self._step(
                    ctx,
                    "stale_connection_discarded",
                    {
                        "hop": hop,
                        "connection": conn.id,
                        "reason": "idle_timeout" if too_old else "readable_while_idle",
                    },
                )
                continue
            self._step(
                ctx,
                "reuse",
                {
                    "hop": hop,
                    "connection": conn.id,
                    "origin": target.origin,
                    "requests_before": conn.requests,
                    "peer": conn.peer,
                    "via_proxy": conn.via_proxy,
                },
            )
            log.debug("reusing connection %s to %s", conn.id, target.origin)
            return conn, True
        return await self._open(request, ctx, hop, target, key), False

    def _step(self, ctx: AttemptContext, event: str, facts: Mapping[str, Any]) -> None:
        step = ctx.machine.fire(event)
        ctx.observe(step, facts)

    def _setup_failed(
        self, ctx: AttemptContext, hop: int, code: Code, stage: str, detail: str = "", **facts: Any
    ) -> Exception:
        self._step(ctx, "setup_fail", {"hop": hop, "code": code.value, "stage": stage, **facts})
        log.debug("setup failed hop=%d stage=%s code=%s", hop, stage, code.value)
        if hop > 1:
            return _HopSetupFailed(code, stage)
        # (annotated: mypy run over the source folders sees ``affidavit.*`` imports as Any)
        err: Exception = SetupError(code, stage, detail)
        return err

    async def _open(
        self, request: HttpRequest, ctx: AttemptContext, hop: int, target: _Url, key: _PoolKey
    ) -> _Connection:
        t = request.timeouts
        proxy: _Url | None = None
        if request.proxy is not None:
            try:
                proxy = _parse_url(request.proxy, schemes=frozenset({"http"}))
            except _BadUrl as e:
                raise self._setup_failed(ctx, hop, Code.PROXY_FAILED, "proxy_url", str(e)) from None
        peer_host = proxy or target
        role = "proxy" if proxy else "origin"
        # -- dns
        try:
            with trio.fail_after(t.connect):
                infos = await trio.socket.getaddrinfo(
                    peer_host.host, peer_host.port, type=trio.socket.SOCK_STREAM
                )
        except trio.TooSlowError:
            raise self._setup_failed(ctx, hop, Code.CONNECT_TIMEOUT, "dns", role=role) from None
        except OSError as e:
            raise self._setup_failed(
                ctx, hop, Code.DNS_FAILED, "dns", _errno_name(e) or "", role=role
            ) from None
        if not infos:
            raise self._setup_failed(ctx, hop, Code.DNS_FAILED, "dns", "no addresses", role=role)
        self._step(ctx, "resolve", {"hop": hop, "role": role, "addresses": len(infos)})
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
            raise self._setup_failed(
                ctx, hop, Code.CONNECT_TIMEOUT, "tcp_connect", role=role
            ) from None
        if sock is None:
            refused = isinstance(last, ConnectionRefusedError)
            code = Code.CONNECTION_REFUSED if refused else Code.SETUP_FAILED
            name = _errno_name(last) if last else ""
            raise self._setup_failed(ctx, hop, code, "tcp_connect", name or "", role=role)
        sock_stream = trio.SocketStream(sock)
        stream: trio.abc.Stream = sock_stream
        self._next_id += 1
        conn_id = f"http-{self._next_id}"
        self._step(ctx, "connect", {"hop": hop, "role": role, "connection": conn_id})
        try:
            if proxy is not None and target.scheme == "https":
                await self._tunnel(ctx, hop, stream, target, proxy, t)
            peer = None
            if target.scheme == "https":
                stream, peer = await self._tls(ctx, hop, stream, target, request.ca_file, t)
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        log.debug("opened connection %s to %s", conn_id, target.origin)
        return _Connection(
            id=conn_id,
            key=key,
            stream=stream,
            socket_stream=sock_stream,
            h11=h11.Connection(h11.CLIENT),
            peer=peer,
            via_proxy=proxy.hostport if proxy else None,
            forward_proxy=proxy is not None and target.scheme == "http",
        )

    async def _tunnel(
        self,
        ctx: AttemptContext,
        hop: int,
        stream: trio.abc.Stream,
        target: _Url,
        proxy: _Url,
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
                        headers = [
                            (n.decode("latin-1"), v.decode("latin-1")) for n, v in ev.headers
                        ]
                    elif isinstance(ev, h11.InformationalResponse):
                        continue
                    else:
                        break
        except trio.TooSlowError:
            raise self._setup_failed(ctx, hop, Code.CONNECT_TIMEOUT, "proxy_connect") from None
        except (h11.RemoteProtocolError, trio.BrokenResourceError, OSError) as e:
            raise self._setup_failed(
                ctx, hop, Code.PROXY_FAILED, "proxy_connect", _errno_name(e) or ""
            ) from None
        ps = parse_proxy_status(header_value(headers, "proxy-status"))
        ok = status is not None and 200 <= status < 300
        leftover = pconn.trailing_data[0] if ok else b""
        if not ok or leftover:
            raise self._setup_failed(
                ctx,
                hop,
                Code.PROXY_FAILED,
                "proxy_connect",
                f"proxy answered {status}" if status else "proxy closed the tunnel",
                status=status,
                proxy_status=ps,
            )
        self._step(ctx, "tunnel", {"hop": hop, "proxy": proxy.hostport, "status": status})

    async def _tls(
        self,
        ctx: AttemptContext,
        hop: int,
        stream: trio.abc.Stream,
        target: _Url,
        ca_file: str | None,
        t: Timeouts,
    ) -> tuple[trio.SSLStream[trio.abc.Stream], dict[str, Any]]:
        try:
            sslctx = self._ssl_context(ca_file)
        except (OSError, ssl.SSLError) as e:
            raise self._setup_failed(
                ctx,
                hop,
                Code.CERTIFICATE_INVALID,
                "tls_handshake",
                "CA file unusable",
                error=_errno_name(e),
            ) from None
        # https_compatible=False on purpose: a TCP FIN without TLS close_notify must not pass
        # for the end of a close-delimited body (seed: never declare a result complete without
        # "a protocol-specific close that proves completion").
        tls = trio.SSLStream(stream, sslctx, server_hostname=target.host, https_compatible=False)
        try:
            with trio.fail_after(t.connect):
                await tls.do_handshake()
        except trio.TooSlowError:
            raise self._setup_failed(ctx, hop, Code.CONNECT_TIMEOUT, "tls_handshake") from None
        except (trio.BrokenResourceError, OSError) as e:
            cause = e.__cause__ if e.__cause__ is not None else e
            if isinstance(cause, ssl.SSLCertVerificationError):
                raise self._setup_failed(
                    ctx,
                    hop,
                    Code.CERTIFICATE_INVALID,
                    "tls_handshake",
                    cause.verify_message or "certificate rejected",
                    verify_code=cause.verify_code,
                ) from None
            raise self._setup_failed(
                ctx,
                hop,
                Code.TLS_FAILED,
                "tls_handshake",
                _errno_name(e) or "",
                error=_errno_name(e),
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
        self._step(ctx, "tls", {"hop": hop, "peer": peer})
        return tls, peer

    # -- failure helpers ----------------------------------------------------------------------

    def _interrupted(
        self,
        ctx: AttemptContext,
        ex: HttpExchange,
        conn: _Connection,
        reused: bool,
        event: str,
        state: dict[str, Any],
        errname: str | None = None,
    ) -> AttemptInterrupted:
        obs = ex.abort(event, {"during": state["during"], "error": errname})
        if obs is not None:
            ctx.observe(obs.step, obs.facts)
        what = {"timed_out": "timed out", "transport_error": "transport failed"}[event]
        return self._interrupted_code(ex, conn, reused, f"{what} during {state['during']}", state)

    @staticmethod
    def _interrupted_code(
        ex: HttpExchange,
        conn: _Connection,
        reused: bool,
        detail: str,
        state: dict[str, Any],
    ) -> AttemptInterrupted:
        # The last proven boundary decides (seed): bytes of a final response arrived -> that
        # result was cut short; otherwise nothing of a result is known at all.
        code = Code.REMOTE_RESULT_INCOMPLETE if ex.response_started else Code.REMOTE_OUTCOME_UNKNOWN
        facts = {
            # Through a forward proxy our transport only ever saw the proxy's socket.
            "hop": "proxy" if conn.forward_proxy else "origin",
            "via_proxy": conn.via_proxy,
            "hop_number": ex.hop,
            "connection": conn.id,
            "reused_connection": reused,
            "during": state["during"],
            **ex.progress(),
        }
        return AttemptInterrupted(code, detail, facts)


def _errno_name(e: BaseException) -> str | None:
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
