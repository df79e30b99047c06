"""URLs as the driver needs them: scheme, host, port and request target, origin and authority,
and the credential query parameter taken off or put back.

Error texts name the problem, never the URL: its query may carry the credential.
"""

from __future__ import annotations

import functools
import ipaddress
import re
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = [
    "BadUrl",
    "Url",
    "cleartext_hop",
    "drop_fragment",
    "join_url",
    "loopback_host",
    "parse_url",
    "query_values",
    "set_query",
    "split_url",
]


@dataclass(frozen=True, slots=True)
class Url:
    scheme: str
    host: str
    port: int
    path_query: str = field(repr=False)
    """The request target; the credential query parameter (if any) is in it: not in ``repr``."""

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


class BadUrl(ValueError):
    pass


_VISIBLE_ASCII = re.compile(r"[\x21-\x7e]+")

split_url: Callable[[str], urllib.parse.SplitResult] = getattr(
    urllib.parse.urlsplit, "__wrapped__", urllib.parse.urlsplit
)
"""``urlsplit`` without its cache.  CPython keeps the last 128 URLs ``urlsplit`` was given in a
module-level ``lru_cache``; a URL that carries a secret -- the credential (``query:``
injection) or a Location that may echo it -- would outlive its use there (docs/security.md,
"Credential lifetime"; a journal URL's password: ``journal/backend.split_url``).  Every split
of such a URL goes through this one; where no cache wraps ``urlsplit``, it is the function
itself."""


def parse_url(url: str, *, schemes: frozenset[str] = frozenset({"http", "https"})) -> Url:
    """``BadUrl`` unless ``url`` is an absolute http(s) URL without userinfo, written in visible
    ASCII only.  A redirect's Location is the one URL a remote writes: a space or control
    character would not encode in a request line, and a non-ASCII host would be compared by
    one IDNA standard (the target's policy, IDNA 2003) and resolved by another (trio, UTS 46):
    ``faß`` is ``fass`` to one and ``xn--fa-hia`` to the other.  A host ending in ``.`` is
    refused too, as a target's url refuses it (``affidavit.schema.check_host``): the policy
    would compare the name without the dot while the connection resolved ``intranet.``, not
    the ``intranet`` the target names (no search list), and sent the dotted name as SNI."""
    if not _VISIBLE_ASCII.fullmatch(url):
        raise BadUrl("URL must be visible ASCII")
    try:
        parts = split_url(url)
        port = parts.port
    except ValueError as e:
        raise BadUrl("URL does not parse") from e
    scheme = parts.scheme.lower()
    if scheme not in schemes:
        raise BadUrl("URL scheme must be " + " or ".join(sorted(schemes)))
    if not parts.hostname:
        raise BadUrl("URL has no host")
    if parts.hostname.endswith("."):
        raise BadUrl("URL host must not end in a dot")
    if parts.username is not None or parts.password is not None:
        raise BadUrl("URL must not carry userinfo")
    path = parts.path or "/"
    pq = f"{path}?{parts.query}" if parts.query else path
    return Url(scheme, parts.hostname, port or (443 if scheme == "https" else 80), pq)


@functools.lru_cache(maxsize=256)  # a host name is no secret; asked once per direct answer
def loopback_host(host: str) -> bool:
    """``localhost``, an address in 127.0.0.0/8 or ``::1`` (an IPv4-mapped 127.x too): a host
    whose traffic does not leave the machine, the one place plain HTTP carries a credential
    without ``trust_cleartext`` (docs/security.md, "Cleartext targets")."""
    if host.lower() == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


@functools.lru_cache(maxsize=256)  # an origin and a proxy are no secret; asked once per call
def cleartext_hop(origin: str, proxy: str | None) -> bool:
    """Whether a request to ``origin`` (``scheme://host:port``) leaves the machine in clear:
    an ``http://`` origin whose first hop -- the forward ``proxy`` (``http://host:port``) if
    there is one, else the origin's host -- is not loopback (``loopback_host``).  A loopback
    origin reached through a remote proxy crosses the network to that proxy in clear.  Kept
    per (origin, proxy): a call's answer asks it of its own origin every time (the client's
    ``_attribution``), and parsing the same origin again was ~12 us of the loop's work after
    the response (issue 15, c=1).  What is kept is configured: a target's origin and proxy, a
    hop's origin, a redirect's only once its policy allowed it (the target's own or one in
    ``redirect_origins``) -- never a Location a remote wrote.  A URL that does not parse
    raises and is not kept -- an ``https://`` origin's too, and its proxy: both are parsed
    before anything is answered."""
    url = parse_url(origin)
    hop = parse_url(proxy) if proxy is not None else url
    return url.scheme == "http" and not loopback_host(hop.host)


def query_values(url: str, name: str | None) -> list[str]:
    if not name:
        return []
    q = split_url(url).query
    return [v for k, v in urllib.parse.parse_qsl(q, keep_blank_values=True) if k == name]


def set_query(
    url: str, name: str, values: list[str], same: Callable[[str], bool] | None = None
) -> str:
    """``url`` with every ``name`` parameter removed -- and every one ``same`` says a server
    reads as ``name`` (``HttpRequest.credential_query_names``) --, then ``values`` appended
    under ``name``."""
    parts = split_url(url)
    pairs = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    kept = [(k, v) for k, v in pairs if k != name and not (same is not None and same(k))]
    kept += [(name, v) for v in values]
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(kept)))


def join_url(base: str, reference: str) -> str:
    """``urljoin(base, reference)``, urllib's split cache emptied after it: ``urljoin`` splits
    both through the cached ``urlsplit``, and here the base is the request URL (the credential
    in its query) and the reference a Location (which may echo it)."""
    try:
        return urllib.parse.urljoin(base, reference)
    finally:
        _forget_splits()


def drop_fragment(url: str) -> str:
    """``urldefrag(url).url``, urllib's split cache emptied after it (as ``join_url``)."""
    try:
        return urllib.parse.urldefrag(url).url
    finally:
        _forget_splits()


def _forget_splits() -> None:
    clear = getattr(urllib.parse.urlsplit, "cache_clear", None)
    if clear is not None:
        clear()
