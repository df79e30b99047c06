"""Redirects: decided at a response's head (before any byte of its body), followed as a new hop.

Design notes, "Redirect hops": each followed hop is a new dispatch boundary with its own durable
evidence.  The target's policy decides whether to follow and whether the credential goes along;
a 3xx that is not followed is the result.  The credential query parameter never reaches the
policy or the evidence.

Only the caller's request is followed, as the caller made it, and never sent again where that
could repeat its effect: a redirect RFC 9110 would answer with a GET without content (303 after
anything but GET/HEAD, 301/302 after a POST) is not followed, nor a 301/302 of a method other
than GET, HEAD or one the target declares idempotent (``_resends``).  The 3xx is then the
server's complete answer to the request sent; whether the server acted on the request is not
recorded (a 303 suggests it did, a 301 that it did not) -- and a GET's 404, or a second
PATCH's 409, would have been read as the rejection of a request that may have been carried
out.  And a hop sent without the credential (another origin, or outside the base path) that is
refused (4xx, 429, 503) decides nothing of the caller's action: the last 3xx to a request that
carried the credential stands as the result (``client.py``).
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Final

from affidavit.statemachine import Outcome

from .classify import (
    REDIRECT_STATUSES,
    Redactor,
    classify_response,
    header_value,
    is_proxy_answer,
)
from .machine import Observation
from .request import HttpRequest, RedirectDecision
from .urls import (
    BadUrl,
    Url,
    cleartext_hop,
    drop_fragment,
    join_url,
    parse_url,
    query_values,
    set_query,
)

__all__ = [
    "CHANGES_REQUEST",
    "CLEARTEXT_REFUSED",
    "REDIRECT_STATUSES",
    "REFUSED_WITHOUT_CREDENTIAL",
    "RESENDS_REQUEST",
    "NextHop",
    "Plan",
    "carries_credential",
    "next_hop",
    "plan_response",
]

CHANGES_REQUEST: Final = (
    "the redirect would change the request (a GET without its content): the 3xx answers the "
    "request sent"
)
"""``redirect_not_followed.reason`` of a 303 (or a POST's 301/302): stable text."""

RESENDS_REQUEST: Final = (
    "a 301 or 302 is followed only for GET, HEAD or a method the target declares idempotent: "
    "the request sent again could repeat its effect; the 3xx answers the request sent"
)
"""``redirect_not_followed.reason`` of a 301/302 to a PUT, PATCH, DELETE...: stable text."""

REFUSED_WITHOUT_CREDENTIAL: Final = (
    "the next hop, sent without the credential, was refused: its answer says nothing of the "
    "request sent with it"
)
"""``redirect_not_followed.reason`` when the 3xx stands because that hop was refused (its hop,
method, origin and status beside it): stable text."""


@dataclass
class Plan:
    """What to do with the response being read, decided at its head."""

    disposition: str = "sink"  # sink | follow | proxy_error | refused
    credential_dropped: bool = False
    """Set before the hop: the request carried the credential and this hop does not."""
    next_url: str | None = None
    keep_credential: bool = False
    redirect_facts: dict[str, Any] = field(default_factory=dict)


CLEARTEXT_REFUSED = "plain HTTP off the machine without trust_cleartext"
"""``redirect_not_followed.reason`` of a Location to an ``http://`` origin whose first hop is
not loopback, for a target without ``trust_cleartext``: stable text."""


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
    if plan.credential_dropped and _refusal(head, forward_proxy):
        # The exchange stops at this head (its body is never read, the connection closed:
        # exchange.py, ``HopRefused``): the result is the 3xx before it.
        plan.disposition = "refused"
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
        # The exact name only: the policy sees the other spellings (and refuses them, where
        # it is the broker's); ``next_hop`` drops them all before the credential goes back.
        nxt = set_query(nxt, request.credential_query, [])
    nxt = drop_fragment(nxt)
    new_origin = parse_url(nxt).origin
    if _switches_to_get(head.status, method):
        plan.redirect_facts = {
            "redirect_not_followed": {
                "reason": CHANGES_REQUEST,
                "origin": new_origin,
                "method": "GET",
            }
        }
        return
    if _resends(head.status, method, request.idempotent_methods):
        plan.redirect_facts = {
            "redirect_not_followed": {
                "reason": RESENDS_REQUEST,
                "origin": new_origin,
                "method": method,
            }
        }
        return
    if request.redirect_policy is None:
        decision = RedirectDecision(False, False, "no redirect policy")
    else:
        decision = request.redirect_policy(method, nxt)
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
    if (
        decision.allowed
        and not request.trust_cleartext
        and cleartext_hop(new_origin, request.proxy)
    ):
        # An answer from plain HTTP off the machine is anyone's on the path: taken as the
        # origin's only on the operator's word (``trust_cleartext``), never because a listed
        # origin happened to be http:// (docs/security.md, "Cleartext targets").
        decision = RedirectDecision(False, False, CLEARTEXT_REFUSED)
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
    plan.keep_credential = decision.keep_credential
    plan.redirect_facts = {
        "to_origin": new_origin,
        "method": method,
        "credential_kept": decision.keep_credential,
    }


def _switches_to_get(status: int, method: str) -> bool:
    """RFC 9110 §15.4.4: a 303 is followed with GET (HEAD stays HEAD); §15.4.2/3: user agents
    turn a POST into a GET after 301/302.  Either drops the content: another request."""
    return (status == 303 and method not in ("GET", "HEAD")) or (
        status in (301, 302) and method == "POST"
    )


def _resends(status: int, method: str, idempotent: frozenset[str]) -> bool:
    """RFC 9110 §15.4.2/3: a 301 or 302 says the resource moved, not that the request was not
    carried out -- post/redirect/get answers an applied ``PATCH /orders/7`` with ``302`` to
    ``/orders/7``.  Sent again there, the request may take effect twice, and the second answer
    (a 409) would decide the first's outcome.  So only a request the target declares safe to
    repeat follows one (``idempotent``; GET and HEAD, whose 301/302 is what following
    redirects is for).  A 307 or 308 is followed with any method the policy allows: it exists
    to ask for the same request, unchanged, at the Location (§15.4.8/9; design notes,
    "Redirect hops")."""
    return status in (301, 302) and method not in ("GET", "HEAD") and method not in idempotent


def _refusal(head: Observation, forward_proxy: bool) -> bool:
    """Whether the response, as the result, would be a rejection (``classify_response``)."""
    assert head.status is not None
    cls = classify_response(head.status, head.headers, via_forward_proxy=forward_proxy)
    return cls.outcome is Outcome.REJECTED


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
    credential: bool
    """Whether this request holds the credential."""


def next_hop(
    request: HttpRequest,
    plan: Plan,
    method: str,
    headers: list[tuple[str, str]],
    body: bytes,
) -> NextHop:
    """The request of the hop ``plan`` follows: the same method and content (a redirect that
    would change them is not followed), the credential kept or dropped as the policy decided."""
    assert plan.next_url is not None
    if plan.keep_credential:
        url = plan.next_url
        if request.credential_query:
            url = set_query(
                plan.next_url,
                request.credential_query,
                query_values(request.url, request.credential_query),
                request.credential_query_names,
            )
    else:
        url = plan.next_url
        headers = [(n, v) for n, v in headers if n.lower() not in request.credential_headers]
    return NextHop(method, url, headers, body, _carries(request, url, headers))


def _carries(request: HttpRequest, url: str, headers: list[tuple[str, str]]) -> bool:
    """Whether a hop's request holds the credential: a credential header, or the query value
    (a hop back into scope after one that dropped the header gets only the query back)."""
    if any(n.lower() in request.credential_headers for n, _ in headers):
        return True
    return bool(request.credential_query and query_values(url, request.credential_query))


def carries_credential(request: HttpRequest) -> bool:
    """Whether the caller's request (the first hop) holds the credential."""
    return _carries(request, request.url, request.headers)
