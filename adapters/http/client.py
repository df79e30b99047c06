"""The trio driver: ``HttpClient.perform`` runs one attempt -- connection setup, the exchange,
redirects -- and turns the final response into a ``RemoteResult``.

It drives ``HttpExchange`` (sans-IO, ``machine.py``) and never decides an outcome itself: a
failure is classified by the last boundary the ``ProtocolMachine`` proved (adapters/base.py).
The parts: ``pool.py`` (keep-alive connections), ``connect.py`` (DNS, TCP, proxy tunnel, TLS),
``exchange.py`` (one hop: the gate, the request, the response), ``redirects.py`` (what a 3xx
leads to), ``urls.py`` and ``request.py`` (what the driver is asked to do).

Nothing here logs, raises or returns a header value, a URL query or a response body
(``Redactor`` scrubs what must be returned; exception details are fixed texts and errno names).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Final

from affidavit.adapters.base import AttemptContext, AttemptInterrupted, RemoteResult, SetupError
from affidavit.statemachine import Code

from .classify import Redactor, classify_response, evidence_from, header_value, parse_proxy_status
from .connect import HopSetupFailed
from .exchange import HopRefused, HopResult, exchange
from .pool import Pool
from .redirects import REFUSED_WITHOUT_CREDENTIAL, Plan, carries_credential, next_hop
from .request import HttpRequest, secret_values
from .urls import BadUrl, cleartext_hop, parse_url

__all__ = ["HttpClient"]

log = logging.getLogger("affidavit.adapters.http")

_DROP_RESPONSE_HEADERS: Final = frozenset({"set-cookie", "set-cookie2"})


class HttpClient:
    """Owns the connection pool; one per broker.  ``async with HttpClient() as c:`` closes it.

    ``max_per_origin`` caps the idle connections kept per pool key (scheme, host, port, proxy,
    CA file); ``idle_timeout`` discards pooled connections idle longer than that.  The default
    ``max_per_origin`` covers 64 concurrent calls to one origin: with 16, three calls in four
    reconnected (tests/benchmarks/http_overhead.py).  The default ``idle_timeout`` stays below
    the 5 s after which common servers (Node, Apache) close an idle connection without saying
    so: reusing one as its FIN arrives leaves a request ``unknown`` that was never processed (a
    ``Keep-Alive: timeout=N`` hint shortens it further: ``pool.idle_limit``)."""

    def __init__(self, *, max_per_origin: int = 64, idle_timeout: float = 4.0) -> None:
        self._pool = Pool(max_per_origin=max_per_origin, idle_timeout=idle_timeout)

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
        await self._pool.aclose()

    def idle_connections(self) -> int:
        """How many connections sit in the pool (diagnostics and tests)."""
        return self._pool.idle_connections()

    async def perform(self, request: HttpRequest, ctx: AttemptContext) -> RemoteResult:
        """One attempt: the request, then each redirect hop its policy allows, to a result."""
        if self._pool.closed:
            raise SetupError(Code.SETUP_FAILED, "pool", "client is closed")
        redactor = Redactor(secret_values(request))
        method = request.method.upper()
        url = request.url
        headers = list(request.headers)
        body = request.body
        credential = first_credential = carries_credential(request)
        hops: list[dict[str, Any]] = []
        redirects = 0
        # The last followed 3xx answering a request that carried the credential (any, when the
        # caller's carried none): that hop's result, the chain up to it, the redirects before
        # it.  It is the result when a later hop is refused or cannot be set up (one rule for
        # both: an answer to a request the credential did not reach is no answer to the
        # caller's).
        credited: tuple[HopResult, list[dict[str, Any]], int] | None = None
        hop = 1
        while True:
            try:
                target = parse_url(url)
            except BadUrl as e:
                if hop == 1:
                    raise SetupError(Code.SETUP_FAILED, "url", str(e)) from None
                raise AssertionError("redirect target was validated before following") from e
            plan = Plan(credential_dropped=first_credential and not credential)
            try:
                res = await exchange(
                    self._pool,
                    request,
                    ctx,
                    hop,
                    method,
                    target,
                    headers,
                    body,
                    redactor,
                    plan,
                    redirects,
                )
            except HopRefused as e:
                # A hop without the credential refused: that answers a request the caller did
                # not make (no 401 there is "these credentials were rejected").  The result is
                # the last complete 3xx to a request that carried the credential -- never a
                # 3xx of a hop it did not reach (target -> other origin -> back into scope
                # without the header: the other origin's 307 answered no request of the
                # caller's).  The refusing hop is named beside it, not in ``hops`` (the chain
                # to the result: engine/readable.py reads its last origin).
                assert credited is not None  # a refusal needs a dropped credential: hop 1 had it
                stood, chain, before = credited
                facts = {
                    "redirects": before,
                    "redirect_not_followed": {"reason": REFUSED_WITHOUT_CREDENTIAL, **e.summary},
                }
                return await _result(
                    stood, ctx, chain, redactor, facts, request.trust_cleartext, sink_buffer=True
                )
            except HopSetupFailed as e:
                # The next request was never written (seed: each redirect hop is its own
                # dispatch boundary), so a complete 3xx stands as the result: as for a refusal,
                # the last one to a request that carried the credential.  Not merely the one
                # before: target 307 -> other origin 307 -> back to the target, whose
                # connection's peer spoke first -- the other origin's 307 answered a request
                # without the credential, no request of the caller's.
                assert credited is not None  # a later hop's setup failed: hop 1 was followed
                stood, chain, before = credited
                facts = {
                    "redirects": before,
                    "redirect_not_followed": {"hop": hop, "code": e.code.value, "stage": e.stage},
                }
                return await _result(
                    stood, ctx, chain, redactor, facts, request.trust_cleartext, sink_buffer=True
                )
            # Whether this hop's request held the credential: only an answer to one that did
            # is the target's word (engine/readable.py, ``from_elsewhere``).
            res.hop_summary["credential_sent"] = credential
            if hop > 1:
                # A followed hop's path (the caller's own is in the action): what a reader says
                # answered instead (reconcile: "answered by a redirect to PATH").  Never its
                # query -- a remote's Location may carry tokens there --, and scrubbed of any
                # form of the credential a kept-credential Location may echo.
                res.hop_summary["path"] = hop_path(target.path_query, redactor.scrub)
            hops.append(res.hop_summary)
            if plan.disposition == "proxy_error":
                ps = redactor.scrub_parsed(
                    parse_proxy_status(header_value(res.headers, "proxy-status"))
                )
                via = res.hop_summary["via_proxy"]
                raise AttemptInterrupted(
                    Code.REMOTE_OUTCOME_UNKNOWN,
                    "a proxy answered with its own error; the origin's outcome is unknown",
                    facts={
                        "hop": "proxy",
                        "status": res.status,
                        "proxy_status": ps,
                        "via_proxy": via,
                        "hops": hops,
                        "evidence_from": evidence_from(
                            "proxy", proxy=via, status=res.status, proxy_status=ps
                        ),
                    },
                )
            if plan.disposition != "follow":
                extra = {"redirects": redirects, **plan.redirect_facts}
                return await _result(res, ctx, hops, redactor, extra, request.trust_cleartext)
            assert plan.next_url is not None
            redirects += 1
            step = ctx.machine.fire("follow_redirect")
            ctx.observe(step, {"hop": hop, "status": res.status, **plan.redirect_facts})
            log.debug("following redirect hop=%d to %s", hop + 1, parse_url(plan.next_url).origin)
            if credential or not first_credential:  # (a request without one: every 3xx)
                credited = (res, list(hops), redirects - 1)
            nxt = next_hop(request, plan, method, headers, body)
            method, url, headers, body = nxt.method, nxt.url, nxt.headers, nxt.body
            credential = nxt.credential
            hop += 1


HOP_PATH_MAX = 200
"""Longest followed hop's path kept in ``hops[].path`` (and so in a reconcile reason)."""


def hop_path(path_query: str, scrub: Callable[[str], str]) -> str:
    """A followed hop's path as recorded: no query, no ``;`` parameters (``;jsessionid=...``:
    a session token in the path), ``scrub``-bed of the credential's forms, at most
    ``HOP_PATH_MAX`` characters (then ending ``...[cut]``)."""
    # Scrubbed before the parameters go: a credential holding a ``;`` echoed in the path,
    # cut at it first, would no longer be whole for ``scrub`` to find, and its head would stay.
    path = scrub(path_query.partition("?")[0])
    path = "/".join(seg.partition(";")[0] for seg in path.split("/"))
    if len(path) > HOP_PATH_MAX:
        path = path[: HOP_PATH_MAX - 8] + "...[cut]"
    return path


async def _result(
    res: HopResult,
    ctx: AttemptContext,
    hops: list[dict[str, Any]],
    redactor: Redactor,
    extra: Mapping[str, Any],
    trust_cleartext: bool,
    *,
    sink_buffer: bool = False,
) -> RemoteResult:
    """The final response as the attempt's result: classified, summarised and scrubbed."""
    if sink_buffer and res.buffered_body:
        await ctx.sink("body", res.buffered_body)
    proxy_status = parse_proxy_status(header_value(res.headers, "proxy-status"))
    cls = classify_response(
        res.status,
        res.headers,
        via_forward_proxy=False,
        conditional=res.conditional,
        proxy_status=proxy_status,
    )
    ps = redactor.scrub_parsed(proxy_status)
    summary = {
        "status": res.status,
        "reason": redactor.scrub(res.reason),
        "headers": [
            [n, v]
            for n, v in res.headers
            if n.lower() not in _DROP_RESPONSE_HEADERS and not redactor.contains(v)
        ],
        "http_version": res.http_version,
        "hops": hops,
    }
    if sink_buffer and not res.buffered_complete:
        summary["body_truncated"] = True
    facts: dict[str, Any] = {
        "status": res.status,
        "hop": "origin",
        "remote_request_id": redactor.scrub(header_value(res.headers, "x-request-id")),
        "proxy_status": ps,
        "evidence_from": evidence_from(
            "origin",
            proxy=res.hop_summary["via_proxy"],
            status=res.status,
            proxy_status=ps,
            # a word: judged on what was sent
            attribution=_attribution(res, proxy_status, trust_cleartext),
        ),
        "peer": res.peer,
        "body_bytes": res.body_bytes,
        "body_sha256": res.body_sha256,
        **redactor.scrub(dict(extra)),
    }
    if res.head_echoed:  # the word ``progress`` says on an early end; ``delivery._commit``
        facts["received_withheld"] = res.head_echoed
    if cls.reason is not None:  # a 3xx result with no redirect reason of its own (a 304)
        facts["redirect_not_followed"] = {"reason": cls.reason}
    assert cls.outcome is not None
    retry = cls.retry_after  # a number (the schema's): a credential echoed in it is dropped
    if retry is not None and (
        redactor.number(retry) or redactor.contains(header_value(res.headers, "retry-after") or "")
    ):
        retry = None
    return RemoteResult(cls.outcome, cls.code, facts, summary, retry, res.hop_summary["hop"])


def _attribution(
    res: HopResult, proxy_status: list[dict[str, Any]] | None, trust_cleartext: bool
) -> str | None:
    """What attributes a complete answer nothing authenticates to the origin (docs/proxies.md,
    "The evidence"): through a forward proxy only the proxy's socket was observed, so the record
    says on whose word it is the origin's -- the proxy's RFC 9209 ``received-status``, or the
    operator's trust in the proxy (``trust_forward_proxy``, which a broker target needs for a
    forward proxy); straight from an ``http://`` origin off the machine, the operator's trust
    in the network on the way -- ``trusted_cleartext`` only when the target gave it
    (``trust_cleartext``, which such a target needs; a redirect there without it is not
    followed: redirects.py, ``CLEARTEXT_REFUSED``)."""
    origin: str = res.hop_summary["origin"]
    if not origin.startswith("http:"):
        return None  # TLS authenticates the origin's answer (directly or through a tunnel)
    if res.hop_summary["via_proxy"] is None:
        if not cleartext_hop(origin, None) or not trust_cleartext:
            return None  # loopback; or the driver used on its own, asked for no such trust
        return "trusted_cleartext"
    if any(m.get("received_status") == res.status for m in proxy_status or ()):
        return "received_status"
    return "trusted_forward_proxy"
