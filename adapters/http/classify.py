"""Pure classification of a *complete* final response, plus the small parsers it needs.

Seed, "A complete remote result determines the execution outcome": a complete 401/403 is an
authoritative rejection; 429/503 may permit backoff with the server's Retry-After; a complete 500
is *known* (the application may have changed state first) — committed, never "failed to
execute"; a complete 3xx that is the result (a redirect not followed) is committed with
``REMOTE_REDIRECTED``: the server's complete answer, which does not say whether it acted on
the request -- a 304 too, unless it answers a conditional GET or HEAD (RFC 9110 §15.4.5).
Seed, "Connection setup needs a precise end point": a proxy's complete error is certainty about
the proxy's own attempt, not about the origin; its hop is recorded and the origin's outcome stays
unknown (RFC 9209 Proxy-Status says where forwarding failed).
"""

from __future__ import annotations

import email.utils
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from affidavit.statemachine import Code, Outcome

__all__ = [
    "NOT_CONDITIONAL",
    "REDIRECT_STATUSES",
    "Classification",
    "Redactor",
    "classify_response",
    "evidence_from",
    "header_value",
    "is_conditional",
    "is_proxy_answer",
    "parse_proxy_status",
    "parse_retry_after",
]

THROTTLE_STATUSES = frozenset({429, 503})
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
"""A final response with one of these is a redirect: followed (``redirects.py``) or, as the
result, ``REMOTE_REDIRECTED``."""
NOT_MODIFIED = 304
"""RFC 9110 §15.4.5: the answer to a conditional GET or HEAD the caller made (its own
``If-None-Match`` / ``If-Modified-Since``): the representation it holds is current -- the one
3xx that asks nothing further of the client.  To any other request it is no answer
(``NOT_CONDITIONAL``)."""
_MAKES_304: Final = frozenset({"if-none-match", "if-modified-since"})
"""The preconditions a 304 answers (RFC 9110 §13.1.2/3, §15.4.5).  ``If-Match`` and
``If-Unmodified-Since`` fail with 412, never 304; ``If-Range`` gives 200 or 206."""
NOT_CONDITIONAL: Final = (
    "a 304 answers only a conditional GET or HEAD (If-None-Match, If-Modified-Since); the "
    "request sent was not one, so the 304 is no answer to it"
)
"""``redirect_not_followed.reason`` of a 304 to any other request (``classify_response``):
stable text."""


@dataclass(frozen=True, slots=True)
class Classification:
    hop: str
    """"origin" or "proxy" — which hop produced the evidence."""
    outcome: Outcome | None
    """committed / rejected for an origin response; None when a proxy produced it (unknown)."""
    code: Code | None
    retry_after: float | None = None
    reason: str | None = None
    """Why a 3xx with no reason of its own is the result (``NOT_CONDITIONAL``), else None."""


def header_value(headers: Iterable[tuple[str, str]], name: str) -> str | None:
    """All values of ``name`` joined with ", " (RFC 9110 §5.3), or None.  A plain loop: a
    response is asked for a few fields (proxy-status, retry-after, x-request-id, location),
    and a list comprehension's frame each was most of the cost (issue 15)."""
    vals = None
    for n, v in headers:
        if n.lower() == name:
            if vals is None:
                vals = [v]
            else:
                vals.append(v)
    return ", ".join(vals) if vals is not None else None


_DELTA_SECONDS = re.compile(r"[0-9]{1,15}")


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """RFC 9110 §10.2.3: delta-seconds or an HTTP-date; None when absent or unparseable.
    delta-seconds is ASCII digits (RFC 9110 §1.2: ``1*DIGIT``), up to 15 of them (as
    ``_INT``'s): ``str.isdigit`` took "²" -- a latin-1 byte h11 passes -- which ``int`` refuses,
    and a long run overflowed ``float``: an exception out of a complete response's
    classification made a recorded answer an unknown outcome."""
    if value is None:
        return None
    value = value.strip()
    if _DELTA_SECONDS.fullmatch(value):
        return float(int(value))
    if value.isdigit():  # a digit run too long or not ASCII: no HTTP-date either
        return None
    try:  # OverflowError: a year of many digits ("Sun, 06 Nov 99999999999999 ...")
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # asctime form carries no zone; HTTP-dates are GMT (RFC 9110 §5.6.7)
        return None
    now = time.time() if now is None else now
    return max(0.0, when.timestamp() - now)


# -- RFC 9209 Proxy-Status: an RFC 8941 structured-field list of items with parameters --------

_TOKEN = re.compile(r"[A-Za-z*][A-Za-z0-9:/!#$%&'*+\-.^_`|~]*")
_KEY = re.compile(r"[a-z*][a-z0-9_\-.*]*")
_INT = re.compile(r"-?\d{1,15}")


class _SfError(ValueError):
    pass


def _bare_item(s: str, i: int) -> tuple[Any, int]:
    if i < len(s) and s[i] == '"':
        out = []
        i += 1
        while i < len(s):
            c = s[i]
            if c == "\\" and i + 1 < len(s) and s[i + 1] in '"\\':
                out.append(s[i + 1])
                i += 2
            elif c == '"':
                return "".join(out), i + 1
            elif c == "\\" or not (" " <= c <= "~"):
                raise _SfError("bad string")
            else:
                out.append(c)
                i += 1
        raise _SfError("unterminated string")
    if s.startswith("?1", i) or s.startswith("?0", i):
        return s[i + 1] == "1", i + 2
    m = _INT.match(s, i)
    if m and not (m.end() < len(s) and s[m.end()] == "."):
        return int(m.group()), m.end()
    m = _TOKEN.match(s, i)
    if m:
        return m.group(), m.end()
    raise _SfError("bad item")


def parse_proxy_status(value: str | None) -> list[dict[str, Any]] | None:
    """Parse a Proxy-Status field into ``[{"proxy": name, "error": …, "received_status": …,
    "details": …, "next_hop": …}, …]`` (nearest-to-origin last).  None when absent;
    ``[{"malformed": True}]`` when it does not parse (the header still proves a proxy spoke)."""
    if value is None:
        return None
    s = value
    i, n = 0, len(s)
    members: list[dict[str, Any]] = []
    try:
        while True:
            while i < n and s[i] in " \t":
                i += 1
            if i >= n:
                break
            item, i = _bare_item(s, i)
            if not isinstance(item, str):
                raise _SfError("proxy name must be a token or string")
            entry: dict[str, Any] = {"proxy": item}
            while i < n and s[i] == ";":
                i += 1
                while i < n and s[i] == " ":
                    i += 1
                m = _KEY.match(s, i)
                if not m:
                    raise _SfError("bad key")
                key, i = m.group(), m.end()
                val: Any = True
                if i < n and s[i] == "=":
                    val, i = _bare_item(s, i + 1)
                entry[key.replace("-", "_")] = val
            members.append(entry)
            while i < n and s[i] in " \t":
                i += 1
            if i >= n:
                break
            if s[i] != ",":
                raise _SfError("expected comma")
            i += 1
    except _SfError:
        return [{"malformed": True}]
    return [
        {
            k: v
            for k, v in m.items()
            if k in {"proxy", "error", "received_status", "details", "next_hop", "rcode"}
        }
        for m in members
    ]


def proxy_generated(
    status: int, proxy_status: Sequence[dict[str, Any]] | None, *, via_forward_proxy: bool
) -> bool:
    """Did an intermediary generate this response about its own attempt?  The rule
    (docs/proxies.md):

    * any Proxy-Status member with an ``error`` (RFC 9209 §2.1.1) — wherever it arrived from;
    * a malformed Proxy-Status — some proxy spoke, and we cannot tell what it said;
    * through a forward (non-tunnel) proxy, a 4xx or a 5xx that nothing attributes to the
      origin.  The only attribution a plain-HTTP proxy can give is RFC 9209's
      ``received-status`` equal to the status (the proxy says it relayed the next hop's own
      answer); a proxy's own error page carries none, so it is never taken for the origin's
      result.  Proxies answer for themselves with 5xx (tinyproxy's ``500 Unable to connect``)
      and with 4xx too: 407, tinyproxy's and Squid's ``403`` for a denied or filtered request,
      Privoxy's ``404`` for an unknown domain, a rate-limiting egress proxy's ``429`` -- and
      some only after forwarding (Squid's ``403`` for ``reply_body_max_size`` or
      ``http_reply_access``, once the origin has answered), so such a 4xx proves neither the
      origin's rejection nor that the origin was never reached.  Headers do not tell them
      apart: a ``Via`` or a proxy's error-page marker can be sent by the origin too.  A 2xx or
      3xx is relayed as the origin's.  Through a CONNECT tunnel the origin's response is
      TLS-authenticated end to end and needs no attribution."""
    if proxy_status and any("error" in m or m.get("malformed") for m in proxy_status):
        return True
    if via_forward_proxy and status >= 400:
        relayed = any(m.get("received_status") == status for m in proxy_status or ())
        return not relayed
    return False


def evidence_from(
    hop: str,
    *,
    proxy: str | None = None,
    status: int | None = None,
    proxy_status: list[dict[str, Any]] | None = None,
    attribution: str | None = None,
) -> dict[str, Any]:
    """Which hop produced an attempt's evidence (seed: "Record which hop produced the
    evidence"): ``origin`` or ``proxy``, the proxy used (``host:port``), the status that hop
    answered, the parsed Proxy-Status and, for a forward proxy's answer taken as the origin's,
    what attributes it (``received_status`` or ``trusted_forward_proxy``), each only when known.
    Secret-free: the caller scrubs ``proxy_status``."""
    out: dict[str, Any] = {"hop": hop}
    if proxy is not None:
        out["proxy"] = proxy
    if status is not None:
        out["status"] = status
    if proxy_status is not None:
        out["proxy_status"] = proxy_status
    if attribution is not None:
        out["attribution"] = attribution
    return out


def is_proxy_answer(
    status: int, headers: Sequence[tuple[str, str]], *, via_forward_proxy: bool
) -> bool:
    """``classify_response(...).hop == "proxy"``: the one question a response head is asked
    before its body (the exchange's proxy judge, the redirect plan), without the rest of the
    classification -- Retry-After parsed, a ``Classification`` built -- twice per response
    (issue 15)."""
    ps = parse_proxy_status(header_value(headers, "proxy-status"))
    return proxy_generated(status, ps, via_forward_proxy=via_forward_proxy)


_PARSE: Any = object()
"""``classify_response``'s ``proxy_status`` left out: parsed from the headers."""


def is_conditional(method: str, headers: Iterable[tuple[str, str]]) -> bool:
    """Whether a request sent with ``method`` and ``headers`` is one a 304 may answer: a GET
    or HEAD with an ``If-None-Match`` or ``If-Modified-Since`` that is not empty (RFC 9110
    §15.4.5).  Names as sent, case aside: a name a server might read as one of them (``_`` for
    ``-``) does not count -- its 304 is then an error, never a clean result claimed on a
    guess."""
    if method.upper() not in ("GET", "HEAD"):
        return False
    return any(n.lower() in _MAKES_304 and v.strip() for n, v in headers)


def classify_response(
    status: int,
    headers: Sequence[tuple[str, str]],
    *,
    via_forward_proxy: bool,
    conditional: bool = False,
    now: float | None = None,
    proxy_status: Any = _PARSE,
) -> Classification:
    """Classify a complete final response (seed table; see module docstring).
    ``conditional``: the request it answers was conditional (``is_conditional``) -- only then
    is a 304 a clean result.  ``proxy_status``: the response's Proxy-Status as
    ``parse_proxy_status`` returns it, when the caller parsed it already (the driver's result
    does: once per response, not twice)."""
    ps = (
        parse_proxy_status(header_value(headers, "proxy-status"))
        if proxy_status is _PARSE
        else proxy_status
    )
    if proxy_generated(status, ps, via_forward_proxy=via_forward_proxy):
        return Classification("proxy", None, None)
    if status == NOT_MODIFIED and not conditional:
        # RFC 9110 §15.4.5: "a conditional GET or HEAD request has been received and would
        # have resulted in a 200 (OK) response if it were not for the fact that the condition
        # evaluated to false" -- a request that was not one gets no answer from it.  Complete
        # and the origin's, so committed, as any 3xx result: no success, and whether the
        # server acted on the request is not recorded -- look before sending it again.
        return Classification(
            "origin", Outcome.COMMITTED, Code.REMOTE_REDIRECTED, None, NOT_CONDITIONAL
        )
    if 300 <= status < 400 and status != NOT_MODIFIED:
        # RFC 9110 §15.4: a 3xx says "further action needs to be taken by the user agent in order
        # to fulfill the request".  Complete, so committed -- but no success: whether the server
        # acted on the request is not recorded (a 303 suggests it did, a 301 or 307 that it did
        # not), so a caller branching on the error reads this one.  Every 3xx but a 304 to a
        # conditional request (above): the ones never followed too -- 300 (a choice left to
        # the client), 305 and 306 (deprecated, reserved) and any unregistered one, which §15
        # has a client treat as 300.
        return Classification("origin", Outcome.COMMITTED, Code.REMOTE_REDIRECTED)
    if 200 <= status < 400:
        # A success's Retry-After changes nothing of its own hint, but a batch's throttled
        # items take the time it specifies (statemachine/batch.py, ``items_view``).
        retry = parse_retry_after(header_value(headers, "retry-after"), now=now)
        return Classification("origin", Outcome.COMMITTED, None, retry)
    if status in THROTTLE_STATUSES:
        retry = parse_retry_after(header_value(headers, "retry-after"), now=now)
        return Classification("origin", Outcome.REJECTED, Code.REMOTE_THROTTLED, retry)
    if 400 <= status < 500:
        return Classification("origin", Outcome.REJECTED, Code.REMOTE_REJECTED)
    # Other 5xx (and anything stranger): the application answered completely, it may have
    # changed state before doing so — known, not retryable by status alone.
    return Classification("origin", Outcome.COMMITTED, Code.REMOTE_ERROR)


_AUTH_SCHEMES = frozenset({"bearer", "basic"})
"""The scheme words of the ``Authorization`` values the broker injects (not secret)."""


class Redactor:
    """Knows the credential's values (from the injected headers / query) and keeps them out of
    everything the adapter hands back: summaries, facts, exception text."""

    MIN_LEN = 4

    def __init__(self, secrets: Iterable[str]) -> None:
        vals: set[str] = set()
        for s in secrets:
            s = s.strip()
            if len(s) >= self.MIN_LEN:
                vals.add(s)
            # "Bearer <token>": the token alone is the secret too -- the scheme word is not
            # (else a 401's "WWW-Authenticate: Bearer ..." would be withheld as an echo).
            parts = s.split()
            if len(parts) > 1 and parts[0].lower() in _AUTH_SCHEMES:
                parts = parts[1:]
            for part in parts:
                if len(part) >= self.MIN_LEN:
                    vals.add(part)
        self._values = sorted(vals, key=len, reverse=True)

    def number(self, value: float) -> bool:
        """Whether ``value`` -- a number parsed from the remote's words: a Proxy-Status
        ``received-status`` or ``rcode`` (up to 15 digits), a ``Retry-After`` -- may be a
        credential echoed: its decimal form holds a secret, or its digits (at least
        ``MIN_LEN``) are part of one (a leading zero parsed away, a long secret cut) -- fewer
        digits too when, with the zeros parsing took away (up to ``MIN_LEN``), they are:
        ``received-status=00042`` is 42, the secret "00042"'s digits."""
        text = str(int(value)) if type(value) is float and value.is_integer() else str(value)
        if self.contains(text) or self.contains(str(value)):
            return True
        digits = text.lstrip("-")
        if len(digits) < self.MIN_LEN:
            digits = digits.rjust(self.MIN_LEN, "0")
        return any(digits in v for v in self._values)

    def contains(self, text: str) -> bool:
        for v in self._values:  # noqa: SIM110 (a loop: no generator frame for ``any``, issue 15)
            if v in text:
                return True
        return False

    def scrub(self, value: Any) -> Any:
        """Replace any string containing a secret, recursively through lists and dicts."""
        if isinstance(value, str):
            return "[redacted]" if self.contains(value) else value
        if isinstance(value, dict):
            return {k: self.scrub(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.scrub(v) for v in value]
        return value

    def scrub_parsed(self, value: Any) -> Any:
        """``scrub`` of what was parsed from the remote's words (``parse_proxy_status``): a
        number too -- ``received_status``, ``rcode`` -- is ``[redacted]`` when it may be a
        credential echoed (``number``).  Not ``scrub``'s rule: the broker's own counts (bytes,
        hops) are no echo, and one that happened to be part of a secret would be lost."""
        if type(value) is int or type(value) is float:
            return "[redacted]" if self.number(value) else value
        if isinstance(value, dict):
            return {k: self.scrub_parsed(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.scrub_parsed(v) for v in value]
        return self.scrub(value)
