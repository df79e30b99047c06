"""An HTTP target's settings, each declared once (``HTTP_TARGET``), and the normalized value the
engine binds (``HttpTarget``).

The URL is normalized (lower-case scheme and host -- ASCII only, no trailing dot:
``check_host`` --, default port dropped, base path without duplicate or trailing slashes) and its
origin kept with the port explicit, so that two spellings of one target bind the same snapshot
and redirects compare origins exactly.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from affidavit.adapters.filestat import read_regular
from affidavit.adapters.http.trust import TrustedCertificate, pem_certificates
from affidavit.adapters.http.urls import cleartext_hop, split_url
from affidavit.schema import (
    COMMON,
    MISSING,
    ApprovalPolicy,
    ConfigError,
    Field,
    Read,
    Schema,
    TargetSchema,
    Timeouts,
    approval_field,
    check_host,
    content,
    duration_setting,
    host_for_url,
    same,
)
from affidavit.secrets.credentials import parse_inject

from .batch import BATCH, BatchContract
from .operations import OperationsContract, parse_operations
from .params import OVERRIDE_HEADERS
from .reconcile import ReconcileQuery, parse_reconcile
from .segments import climbs

__all__ = [
    "CALLER_REFUSED",
    "CREDENTIAL_HEADERS",
    "HOP_HEADERS",
    "HTTP_TARGET",
    "RANGE_HEADERS",
    "ROUTING_HEADERS",
    "TRANSPORT_HEADERS",
    "HttpTarget",
    "IdempotencyContract",
    "header_key",
    "origin_of",
]

# Headers a caller may never set and an idempotency contract may never name: credential-bearing
# ones the broker owns, and framing/routing ones the transport owns.  ``Expect`` is the
# transport's too: it sends ``100-continue`` itself or not at all (adapters/http/exchange.py
# drops any other), so a caller's would be recorded -- fingerprint, operator view -- yet never
# sent.
TRANSPORT_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "te",
        "upgrade",
        "trailer",
        "expect",
    }
)
CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})
# Hop-by-hop headers (RFC 9110 §7.6.1) are the transport's to manage, as are framing headers.
HOP_HEADERS = frozenset({"keep-alive", "proxy-connection", "proxy-authenticate"})
# A part of the answer instead of the whole (RFC 9110 §14.2, §13.1.5): a server that echoes the
# injected credential would hand it out in windows of a few bytes, none long enough to be a
# redaction form (docs/redaction.md, "Partial answers").  Callers may not ask for them.
RANGE_HEADERS = frozenset({"range", "if-range", "request-range"})
"""``Request-Range``: the pre-RFC 7233 spelling, which Apache httpd still serves ranges for."""
# What a reverse proxy in front of the application writes, and the application trusts when it
# builds URLs or routes (Rails, Django, Symfony, Spring, ASP.NET behind a trusted proxy): the
# host, scheme, port and prefix it was reached as (a password-reset link or a redirect built
# for another host; a route mounted under another prefix), and the client address it vouches
# for (allow-lists, rate limits).  The broker is the client: none of it is the caller's to
# say.  (X-Original-URL and X-Rewrite-URL, which rewrite the path, are OVERRIDE_HEADERS.)
# Not exhaustive, and cannot be: which header an application reads its host or client from
# is its own configuration (Rails' and Django's settings, Express's "trust proxy", a CDN's
# name) -- these are the names proxies, CDNs and frameworks write or read by default.
ROUTING_HEADERS = frozenset(
    {
        "forwarded",
        "x-forwarded-host",
        "x-forwarded-port",
        "x-forwarded-prefix",
        "x-forwarded-proto",
        "x-forwarded-scheme",
        "x-forwarded-ssl",
        "x-forwarded-for",
        "x-forwarded-server",
        "x-forwarded-uri",
        "x-real-ip",
        "x-original-host",
        "x-original-uri",
        "x-host",
        "x-http-host-override",
        "x-envoy-original-path",
        "x-url-scheme",
        "front-end-https",
        "true-client-ip",
        "cf-connecting-ip",
        "x-client-ip",
        "x-cluster-client-ip",
        "client-ip",
    }
)
CALLER_REFUSED = (
    CREDENTIAL_HEADERS
    | TRANSPORT_HEADERS
    | HOP_HEADERS
    | OVERRIDE_HEADERS
    | RANGE_HEADERS
    | ROUTING_HEADERS
)
"""Every header a caller may not set whatever the target (``action.py`` adds the injected and
the idempotency header), and an idempotency contract may not name."""


def header_key(name: str) -> str:
    """A header name as servers may read it: case-insensitively (RFC 9110 §5.1), surrounding
    whitespace dropped, and ``_`` as ``-`` -- CGI, WSGI and nginx map ``X-Api-Key`` and
    ``X_Api_Key`` to the same ``HTTP_X_API_KEY``, so either one shadows the injected header."""
    return name.strip().lower().replace("_", "-")


TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# RFC 3986 pchar + "/" (a base path carries no query or fragment)
_PATH_CHARS = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@/%]*")
_DEFAULT_PORT = {"http": 80, "https": 443}


@dataclass(frozen=True)
class IdempotencyContract:
    """The target's documented deduplication contract (seed, "Idempotency is defined by the
    remote contract"): the header it reads, the scope it deduplicates in, how long it keeps keys."""

    header: str
    scope: str
    retention_s: float


@dataclass(frozen=True)
class HttpTarget:
    name: str
    url: str
    """Normalized: lower-case scheme and host, port only when not the default, base path."""
    origin: str
    """``scheme://host:port`` with the port always explicit (IPv6 hosts in brackets)."""
    base_path: str
    """``""`` or ``/segment...`` without a trailing slash; prefixed to every action path."""
    methods: frozenset[str]
    idempotent: frozenset[str]
    credential: str
    inject: str
    ca_file: Path | None
    proxy: str | None
    trust_forward_proxy: Literal[True] | None
    """True: the operator accepts an ``http://`` target's forward proxy, which sees the request
    (credential included) in clear and could write any answer itself: its 2xx/3xx count as the
    origin's (docs/proxies.md).  None otherwise (unset: not part of the snapshot)."""
    trust_cleartext: Literal[True] | None
    """True: the operator accepts an ``http://`` url whose host is not loopback -- the credential
    and every answer cross the network in clear, readable and forgeable on the way
    (docs/security.md, "Cleartext targets").  None otherwise (unset: not in the snapshot)."""
    escaped_query_values: Literal[True] | None
    """True: the operator's callers pass URL- or JSON-valued query parameters whose escaped
    ``&``/``;``/``=`` may spell an override or the credential's name, and no hop in front of
    the application forwards the query percent-decoded: those separators are the values' own
    (``params.check_query``).  None otherwise (unset, the default: not in the snapshot) -- a
    query whose decoding makes such a name is refused, as a hop that decodes it would read it."""
    follow_redirects: bool
    redirect_origins: frozenset[str]
    """Other origins a followed redirect may go to (normalized ``scheme://host:port``), never
    with the credential.  Empty: only the target's own origin."""
    max_body: int
    budget: int
    timeout: Timeouts
    max_result: int | None
    """``max_result`` as set (None: the default, ``affidavit.schema.result_limit``)."""
    idempotency: IdempotencyContract | None
    operations: OperationsContract | None
    """How a 202's job is read and its status resource queried (``operations.py``)."""
    batch: BatchContract | None
    """How a batch request names its items and a response their results (``batch.py``)."""
    approval: ApprovalPolicy | None
    """Which actions wait for an operator's yes (``affidavit.schema.approval``)."""
    reconcile: ReconcileQuery | None
    """The query that settles an unknown outcome (``reconcile.py``)."""
    kind: Literal["http"] = "http"

    @property
    def scheme(self) -> str:
        return self.origin.split("://", 1)[0]

    @property
    def host(self) -> str:
        """Host name or IP literal (IPv6 without brackets)."""
        hostport = self.origin.split("://", 1)[1]
        return hostport.rsplit(":", 1)[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.origin.rsplit(":", 1)[1])


def parse_url(
    value: str, schemes: tuple[str, ...]
) -> tuple[str, str, int, str, urllib.parse.SplitResult]:
    """``(scheme, host, port, path, parts)`` of an absolute URL.  ``ValueError``'s message
    leaves the URL's name out: the config reports it at the setting's field path
    (``targets.x.url: must start with ...``), which names it already."""
    if any(c.isspace() for c in value):
        raise ValueError("must not contain whitespace")
    parts = split_url(value)  # a redirect's Location too (origin_of): it may echo the credential
    scheme = parts.scheme.lower()
    if scheme not in schemes:
        raise ValueError("must start with " + " or ".join(f"{s}://" for s in schemes))
    if "@" in parts.netloc:
        # Credentials in a URL end up in logs, snapshots and journal rows.
        raise ValueError("must not embed user:password; use `credential`")
    if not parts.hostname:
        raise ValueError("has no host")
    try:
        port = parts.port
    except ValueError:
        raise ValueError("has an invalid port") from None
    host = check_host(parts.hostname)
    if port == 0:
        raise ValueError("has an invalid port")
    return scheme, host, port or _DEFAULT_PORT[scheme], parts.path, parts


def origin_of(url: str) -> str:
    """The normalized origin ``scheme://host:port`` of an absolute http(s) URL, as targets'
    ``origin`` and ``redirect_origins`` are stored.  Raises ``ValueError`` for anything else."""
    scheme, host, port, _path, _parts = parse_url(url, ("http", "https"))
    return f"{scheme}://{host_for_url(host)}:{port}"


# --- field parsers, in declaration order --------------------------------------------------------


def _url(r: Read) -> str:
    raw: str = r.string()
    try:
        scheme, host, port, path, parts = parse_url(raw, ("http", "https"))
    except ValueError as exc:
        raise r.error(str(exc)) from None
    if parts.query or parts.fragment or "?" in raw or "#" in raw:
        raise r.error("must not have a query or fragment")
    if not _PATH_CHARS.fullmatch(path):
        raise r.error("base path has characters that need percent-encoding")
    why = climbs(path)  # every action path is appended to it: the same rule (segments.py),
    # a "%" that is no escape included
    if why is not None:
        raise r.error(f"base path {why}")
    segments = [s for s in path.split("/") if s]
    base_path = "/" + "/".join(segments) if segments else ""
    netloc = host_for_url(host) + ("" if port == _DEFAULT_PORT[scheme] else f":{port}")
    return f"{scheme}://{netloc}{base_path}"


_UNCARRIED_METHODS: Final = {
    "CONNECT": "opens a tunnel, which the broker cannot carry as a request",
    "TRACE": "would echo the injected credential back (RFC 9110 §9.3.8: no sensitive fields "
    "in a TRACE request)",
}
"""Methods a target may not list, each with why.  A 2xx to CONNECT turns the connection into a
tunnel (RFC 9110 §9.3.6), whose bytes are no HTTP/1.1 response with an end -- the exchange
could never complete (adapters/http/machine.py, ``_refuse_paused``).  (The other way to switch
protocols, an ``Upgrade`` header, is in ``TRANSPORT_HEADERS``: no caller or injection sets it.)
TRACE's answer is the request head as received (§9.3.8: "A client MUST NOT generate fields in a
TRACE request containing sensitive data that might be disclosed by the response", stored
credentials the example): the broker injects the credential into every request, so the
redactor would be the only protection left.  An action's method must be one the target lists
(``action.parse``), as must a redirect hop's and a reconciliation query's: none can be
either."""


def _methods(r: Read) -> frozenset[str]:
    items = r.string_list()
    if r.default is MISSING and not items:  # a required list of methods may not be empty
        raise r.error("must list at least one method")
    out = set()
    for i, m in enumerate(items):
        if not TOKEN.fullmatch(m):
            raise r.error("is not an HTTP method token", f"[{i}]")
        why = _UNCARRIED_METHODS.get(m.upper())
        if why is not None:
            raise r.error(f"{m.upper()} {why}", f"[{i}]")
        out.add(m.upper())
    return frozenset(out)


def _inject(r: Read) -> str:
    """The injection scheme; ``header:NAME`` never a header a caller may not set but for the
    end-to-end credential headers (``Authorization`` with a scheme of the service's own,
    ``Cookie``): not ``Proxy-Authorization`` (a forward proxy on an http:// target consumes it:
    the credential goes to the proxy, never the origin), a hop-by-hop or framing header, not
    ``Expect``, ``Range``, a method or path override, a routing header a reverse proxy
    writes (``Forwarded``), ``Via`` (each proxy appends to it or rewrites it), nor
    ``Content-Type`` or ``Location`` (a body's media type, a response header: no service
    reads a credential there) -- names compared as servers read them (``header_key``)."""
    inject: str = r.string()
    try:
        kind, name = parse_inject(inject)
    except ValueError as exc:
        raise r.error(str(exc)) from None
    if kind == "header" and name and header_key(name) in _INJECT_REFUSED:
        raise r.error(
            f"header:{name} is a hop-by-hop, proxy, framing, range, override, routing or "
            "content header (one a proxy or the transport consumes or rewrites, or a server "
            "reads as other than a credential): inject into an end-to-end header "
            "(header:X-Api-Key, bearer, basic)"
        )
    return inject


def _ca_file(r: Read) -> Path | None:
    raw = r.string()
    if not raw:
        return None
    if not r.values["origin"].startswith("https://"):
        raise r.error("only applies to an https:// url")
    ca_file = r.resolve_path(raw)
    if not ca_file.is_file():
        raise r.error(f"file not found: {ca_file}")
    # Read as each handshake will read it (adapters/http/trust.py): a bundle in a format the
    # driver never loads is refused here, with its field, not at every call.  (A file that
    # cannot be read now, or holds no certificate, fails its calls naming ca_file, as a file
    # edited after the load does.)
    try:
        pem_certificates(read_regular(ca_file)[0])
    except TrustedCertificate as exc:
        raise r.error(str(exc)) from None
    except (OSError, ValueError):
        pass
    return ca_file


def _proxy(r: Read) -> str | None:
    raw = r.string()
    if not raw:
        return None
    try:
        _, host, port, path, parts = parse_url(raw, ("http",))
    except ValueError as exc:
        raise r.error(str(exc)) from None
    if path not in ("", "/") or parts.query or parts.fragment:
        raise r.error("must be http://host:port with no path")
    return f"http://{host_for_url(host)}:{port}"


FORWARD_PROXY_UNTRUSTED = (
    "through an http:// target's proxy the request goes as plain HTTP to a forward proxy: it "
    "sees the credential and can write any answer itself, and its 2xx or 3xx would count as "
    "the origin's result; set trust_forward_proxy = true to accept that, or use an https:// "
    "target (a CONNECT tunnel: TLS to the origin through the proxy)"
)
FORWARD_REDIRECT_UNTRUSTED = (
    "a redirect to this http:// origin goes through the target's proxy as plain HTTP, to a "
    "forward proxy: it sees the credential and can write any answer itself, and its 2xx or 3xx "
    "would count as the origin's result; set trust_forward_proxy = true to accept that, or list "
    "only https:// origins (reached through a CONNECT tunnel, as the target's url is)"
)


def _trust_forward_proxy(r: Read) -> Literal[True] | None:
    """A forward proxy (an ``http://`` target's ``proxy``) only with ``trust_forward_proxy =
    true``: nothing authenticates its answers (docs/proxies.md, "The rule")."""
    trusted = r.boolean()
    forward = r.values["proxy"] is not None and r.values["origin"].startswith("http://")
    if forward and not trusted:
        raise ConfigError(r.section.path("proxy"), FORWARD_PROXY_UNTRUSTED)
    if trusted and r.values["proxy"] is None:
        raise r.error("only applies to a target with a proxy")
    # An https:// url's trust is checked with redirect_origins (an http:// one is forwarded).
    return True if trusted else None


CLEARTEXT_UNTRUSTED = (
    "an http:// url whose first hop (its proxy if set, else its host) is not loopback sends "
    "the credential in clear over the network, where anyone on the path reads it and can write "
    "the answer; set trust_cleartext = true to accept that, or use https://"
)


def _trust_cleartext(r: Read) -> Literal[True] | None:
    """An ``http://`` url whose first hop is off the machine (``cleartext_hop``: the proxy if
    set, else the host) only with ``trust_cleartext = true``, as a forward proxy needs
    ``trust_forward_proxy`` (the credential is injected into every request: every target has
    one).  Whether the setting applies at all is checked with ``redirect_origins``: a listed
    ``http://`` origin off the machine is followed only with it (adapters/http/redirects.py)."""
    trusted = r.boolean()
    if cleartext_hop(r.values["origin"], r.values["proxy"]) and not trusted:
        raise ConfigError(r.section.path("url"), CLEARTEXT_UNTRUSTED)
    return True if trusted else None


def _redirect_origins(r: Read) -> frozenset[str]:
    out: set[str] = set()
    first_http: int | None = None
    for i, raw in enumerate(r.string_list()):
        try:
            _s, _h, _p, path, parts = parse_url(raw, ("http", "https"))
            normalized = origin_of(raw)
        except ValueError as exc:
            raise r.error(str(exc), f"[{i}]") from None
        if path not in ("", "/") or parts.query or parts.fragment:
            raise r.error("must be an origin: scheme://host[:port] with no path", f"[{i}]")
        out.add(normalized)
        if first_http is None and normalized.startswith("http://"):
            first_http = i
    if out and not r.values["follow_redirects"]:
        raise r.error("only applies with follow_redirects = true")
    proxy = r.values["proxy"]
    if r.values["trust_cleartext"] and not any(
        cleartext_hop(o, proxy) for o in (r.values["origin"], *out)
    ):
        raise ConfigError(
            r.section.path("trust_cleartext"),
            "only applies to an http:// url or redirect origin whose first hop (the proxy if "
            "set, else the host) is not loopback",
        )
    # A redirect to an http:// origin goes through the target's proxy as a forward proxy too.
    if r.values["proxy"] is not None and not r.values["origin"].startswith("http://"):
        if first_http is not None and not r.values["trust_forward_proxy"]:
            raise r.error(FORWARD_REDIRECT_UNTRUSTED, f"[{first_http}]")
        if r.values["trust_forward_proxy"] and first_http is None:
            raise ConfigError(
                r.section.path("trust_forward_proxy"),
                "only applies to a forward proxy: an http:// url or redirect origin with a proxy",
            )
    return frozenset(out)


def _idempotency_header(r: Read) -> str:
    """The header the service reads its key from: no header a caller may not set (the broker
    sends this one with the recorded key), names compared as servers read them
    (``header_key``: ``X_Api_Key`` is the injected ``X-Api-Key``)."""
    header: str = r.string(max_len=128)
    if not TOKEN.fullmatch(header):
        raise r.error("is not an HTTP header name")
    assert r.outer is not None
    inject_kind, inject_name = parse_inject(r.outer.values["inject"])
    key = header_key(header)
    if key in _REFUSED_KEYS or (
        inject_kind == "header" and inject_name and key == header_key(inject_name)
    ):
        raise r.error(
            "names a header the broker, the transport or the request line owns (names compare "
            'case-insensitively, and "_" as "-")'
        )
    return header


_REFUSED_KEYS: Final = frozenset(map(header_key, CALLER_REFUSED))
_INJECT_REFUSED: Final = (_REFUSED_KEYS - {"authorization", "cookie"}) | {
    "via",  # each proxy on the way appends to it or rewrites it
    "content-type",  # the body's media type: the credential would replace it
    "location",  # a response header: no server reads a request's as a credential
}
"""The headers ``inject = "header:NAME"`` may not name (``_inject``)."""


def _scope(contract: IdempotencyContract | None) -> str | None:
    """What a key is deduplicated within: a query for it asks within this scope."""
    return None if contract is None else contract.scope


IDEMPOTENCY = Schema(
    IdempotencyContract,
    (
        Field("header", _idempotency_header, doc="the header the service reads the key from"),
        Field("scope", lambda r: r.string(max_len=256), doc="what it deduplicates within"),
        Field("retention_s", duration_setting, key="retention", doc="how long it keeps a key"),
    ),
)


HTTP_TARGET = TargetSchema(
    "http",
    HttpTarget,
    (
        Field(
            "url",
            _url,
            doc="`http(s)://host[:port][/base/path]` — no user:password, query or fragment; "
            "the base path is held to the rule of an action's path "
            "([below](#a-path-stays-under-the-base-path): no `.`/`..` segment in any reading, "
            "escapes UTF-8)",
        ),
        Field("origin", lambda r: origin_of(r.values["url"]), key=None, account=same),
        # The base path names the tenant at many services (Twilio's /Accounts/AC..., Jira's
        # /ex/jira/<cloudId>): a query under another one asks another account.
        Field(
            "base_path",
            lambda r: urllib.parse.urlsplit(r.values["url"]).path,
            key=None,
            account=same,
        ),
        Field(
            "methods",
            _methods,
            doc="methods callers may send (normalized to upper case); not `CONNECT` (a tunnel) "
            "or `TRACE` (it echoes the credential)",
        ),
        Field(
            "idempotent",
            _methods,
            default=[],
            doc="methods **this service** treats as idempotent (see below)",
        ),
        *COMMON,
        Field(
            "inject",
            _inject,
            default="bearer",
            doc="`bearer`, `basic`, `header:NAME` or `query:NAME`",
        ),
        Field(
            "ca_file",
            _ca_file,
            default=None,
            shown="system trust",
            doc="PEM bundle to trust instead (https only; must exist; `CERTIFICATE` blocks, not "
            "`TRUSTED CERTIFICATE`)",
            trust_anchor="CA file",
            account=content,  # whom it trusts is what it holds
        ),
        Field(
            "proxy",
            _proxy,
            default=None,
            doc="`http://host:port` proxy (no credentials in the URL): a CONNECT tunnel for an "
            "https:// url; for an http:// url a forward proxy, only with `trust_forward_proxy`",
            # A trusted forward proxy's answers count as the origin's: another one answers for
            # another account.  (A CONNECT proxy is included too: it costs an attestation.)
            account=same,
        ),
        Field(
            "trust_forward_proxy",
            _trust_forward_proxy,
            default=False,
            unset_omitted=True,
            doc="`true`: accept a forward proxy -- the `proxy` of an http:// url or of an "
            "http:// redirect origin -- which sees the credential and whose 2xx/3xx count as "
            "the origin's (see [proxies](proxies.md))",
        ),
        Field(
            "trust_cleartext",
            _trust_cleartext,
            default=False,
            unset_omitted=True,
            doc="`true`: accept plain HTTP off the machine -- an http:// url or redirect origin "
            "whose first hop (the proxy if set, else the host) is not loopback (127.0.0.0/8, "
            "`::1`, `localhost`): the credential and the answers cross the network in clear (see "
            "[security](security.md#cleartext-targets))",
        ),
        Field(
            "escaped_query_values",
            lambda r: True if r.boolean() else None,
            default=False,
            unset_omitted=True,
            doc="`true`: this target's callers pass URL- or JSON-valued query parameters whose "
            "escaped `%26`, `%3B` and `%3D` may spell a method/path override or the "
            "credential's parameter (`url=...%26_method%3Dx`), and no proxy or gateway in front "
            "of the application forwards the query percent-decoded: those are values' own. "
            "Unset, a query whose decoding (up to 4 times) makes such a name is refused, as such "
            "a hop would read it; an escaped `?` in the path is checked either way (see "
            "[security](security.md#what-a-callers-request-may-not-say))",
        ),
        Field(
            "follow_redirects",
            Read.boolean,
            default=False,
            doc="follow redirects, re-validating every hop; a redirect that would change the "
            "request (a 303, a POST's 301/302: a GET without the content) is not followed, "
            "nor a 301/302 of a method other than GET, HEAD or one in `idempotent` (it "
            "would be sent again), and a hop sent without the credential that refuses (4xx, "
            "429, 503) decides nothing: the complete 3xx is the result either way, "
            "`REMOTE_REDIRECTED` ([design notes](design-notes.md#redirect-hops))",
        ),
        Field(
            "redirect_origins",
            _redirect_origins,
            default=[],
            doc="other origins (`scheme://host[:port]`) a followed redirect may reach; the "
            "credential is never sent there. Any other origin is not followed: the complete 3xx "
            "is the result",
        ),
        Field(
            "max_body",
            lambda r: r.integer(0, 1 << 40),
            default=1024 * 1024,
            doc="request body limit in bytes (`PAYLOAD_LIMIT` above it)",
        ),
        Field(
            "idempotency",
            IDEMPOTENCY.parse_optional_table,
            default=None,
            doc="`{ header, scope, retention }`: the service's documented key-deduplication "
            "contract",
            account=_scope,
        ),
        Field(
            "operations",
            parse_operations,
            default=None,
            unset_omitted=True,
            doc="`{ id, status_url, status, succeeded, failed }`: a complete 202 accepts a job, "
            "tracked as an operation (see below)",
        ),
        Field(
            "batch",
            BATCH.parse_optional_table,
            default=None,
            unset_omitted=True,
            doc="`{ items, request_items, item_id, item_status, ok, rejected, atomic }`: an "
            "outcome per item of a batch (see below)",
        ),
        approval_field("methods"),
        Field(
            "reconcile",
            parse_reconcile,
            default=None,
            unset_omitted=True,
            doc="`{ method, path, committed_if, rejected_if, settle }`: the query that settles an "
            "unknown outcome (see [approvals](approvals.md#reconciliation))",
        ),
    ),
)
