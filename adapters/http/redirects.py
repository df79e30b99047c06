"""Redirects: decided at a response's head (before any byte of its body), followed as a new hop.

Design notes, "Redirect hops": each followed hop is a new dispatch boundary with its own durable
evidence.  The target's policy decides whether to follow and whether the credential goes along;
a 3xx that is not followed is the result.  The credential query parameter never reaches the
policy or the evidence.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Final

from .classify import Redactor, header_value, is_proxy_answer
from .machine import Observation
from .request import HttpRequest, RedirectDecision
from .urls import BadUrl, Url, drop_fragment, join_url, parse_url, query_values, set_query

__all__ = ["REDIRECT_STATUSES", "NextHop", "Plan", "next_hop", "plan_response"]

REDIRECT_STATUSES: Final = frozenset({301, 302, 303, 307, 308})
_CONTENT_HEADERS: Final = frozenset({"content-type", "content-encoding", "content-language"})


@dataclass
class Plan:
    """What to do with the response being read, decided at its head."""

    disposition: str = "sink"  # sink | follow | proxy_error
    next_url: str | None = None
    next_method: str = ""
    keep_credential: bool = False
    redirect_facts: dict[str, Any] = field(default_factory=dict)


def plan_response(
    request: HttpRequest,
    plan: Plan,
    method: str,
    target: Url,
    head: Observation,
    forward_proxy: bool,
    redirects: int,
    redactor: Redactor,
) -> None:
    """Decide at the response head where its body goes (before any byte of it arrives)."""
    assert head.status is not None
    if is_proxy_answer(head.status, head.headers, via_forward_proxy=forward_proxy):
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
        nxt = join_url(target.absolute, location.strip())
        parse_url(nxt)
    except (BadUrl, ValueError) as e:
        plan.redirect_facts = {"redirect_not_followed": {"reason": str(e)}}
        return
    if request.credential_query:
        nxt = set_query(nxt, request.credential_query, [])
    nxt = drop_fragment(nxt)
    new_method = method
    if (head.status == 303 and method != "HEAD") or (
        head.status in (301, 302) and method == "POST"
    ):
        new_method = "GET"
    if request.redirect_policy is None:
        decision = RedirectDecision(False, False, "no redirect policy")
    else:
        decision = request.redirect_policy(new_method, nxt)
    new_origin = parse_url(nxt).origin
    if (
        decision.allowed
        and not decision.keep_credential
        and _carries_secret(request, redactor, nxt)
    ):
        # A login redirect quoting the request URL back ("?return_to=...api_key=..."), or a
        # server echoing a header into the Location -- as written, base64'd into a ``state``,
        # hex-dumped, case-changed: following it would send the credential where the policy
        # said it must not go.
        decision = RedirectDecision(False, False, "the Location carries the credential")
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


def _carries_secret(request: HttpRequest, redactor: Redactor, url: str) -> bool:
    """The URL holds a credential value as written or after up to three rounds of
    percent-decoding (a URL quoted inside a query parameter, maybe twice); and, where the
    request names the check (the broker's binding does), in any of the redaction forms."""
    if request.credential_echo is not None and request.credential_echo(url):
        return True
    for _ in range(4):
        if redactor.contains(url):
            return True
        decoded = urllib.parse.unquote_plus(url)
        if decoded == url:
            return False
        url = decoded
    return False


@dataclass(frozen=True)
class NextHop:
    """The next hop's request; a kept credential is in ``url`` and ``headers``: not in ``repr``."""

    method: str
    url: str = field(repr=False)
    headers: list[tuple[str, str]] = field(repr=False)
    body: bytes


def next_hop(
    request: HttpRequest,
    plan: Plan,
    method: str,
    headers: list[tuple[str, str]],
    body: bytes,
) -> NextHop:
    """The request of the hop ``plan`` follows: method and content rewritten as RFC 9110 says,
    the credential kept or dropped as the policy decided."""
    assert plan.next_url is not None
    if plan.next_method != method:
        # RFC 9110 §15.4.4 (303) and §15.4.2/3 (POST after 301/302): GET, no content.
        body = b""
        headers = [(n, v) for n, v in headers if n.lower() not in _CONTENT_HEADERS]
    if plan.keep_credential:
        url = plan.next_url
        if request.credential_query:
            url = set_query(
                plan.next_url,
                request.credential_query,
                query_values(request.url, request.credential_query),
            )
    else:
        url = plan.next_url
        headers = [(n, v) for n, v in headers if n.lower() not in request.credential_headers]
    return NextHop(plan.next_method, url, headers, body)
