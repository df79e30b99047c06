"""What the HTTP driver is asked to do: ``HttpRequest`` with its ``Timeouts`` and redirect
policy (built by the broker's HTTP binding, credential already injected)."""

from __future__ import annotations

import base64
import binascii
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field

from .urls import query_values

__all__ = ["HttpRequest", "RedirectDecision", "Timeouts", "secret_values"]


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
    credential_query_names: Callable[[str], bool] | None = field(default=None, repr=False)
    """Whether a query parameter name (percent-decoded once) is one a server may read as
    ``credential_query`` (another case, ``.`` for ``_``, ``NAME[]``: the broker's
    ``params.credential_spelling``): a followed hop's query loses every such name before the
    credential is put back (``redirects.next_hop``).  None: the exact name only."""
    ca_file: str | None = None
    ca_sha256: str | None = None
    """``sha256:<hex>`` of the ``ca_file`` bytes the call was validated with (the digest its
    recorded account holds): the pool key holds it, and a handshake finding other bytes in the
    file refuses the call before anything is sent (``connect._tls``).  None: the file as it is
    at the handshake (the driver used on its own)."""
    proxy: str | None = None
    """``http://host:port``: a forward proxy for http:// URLs, a CONNECT tunnel for https://."""
    trust_cleartext: bool = False
    """The operator accepts plain HTTP off the machine (``trust_cleartext``): a redirect to an
    ``http://`` origin whose first hop (the proxy, else the host) is not loopback is followed
    only with it, and an answer so received is attributed ``trusted_cleartext``."""
    follow_redirects: bool = False
    redirect_policy: Callable[[str, str], RedirectDecision] | None = None
    """(method, absolute url) -> decision; the url passed has the credential query removed."""
    max_redirects: int = 5
    idempotent_methods: frozenset[str] = frozenset()
    """Upper-case methods the target declares idempotent: a 301 or 302 is followed, the request
    sent again to its Location, only for these, GET and HEAD (``redirects.py``)."""
    timeouts: Timeouts = field(default_factory=Timeouts)
    expect_continue: bool = False
    credential_echo: Callable[[str], bool] | None = field(default=None, repr=False)
    """Whether a URL a remote wrote holds any form of the credential (base64, hex, percent
    encoding, any case: the broker's redaction forms).  A Location that does is not followed
    (redirects.py); without it only the values as written, percent-decoded, are looked for."""


def secret_values(request: HttpRequest) -> list[str]:
    """Every form in which the injected credential could come back in a response: the header
    values, a Basic credential decoded, the query value raw and percent-encoded."""
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
    for v in query_values(request.url, request.credential_query):
        vals += [v, urllib.parse.quote_plus(v), urllib.parse.quote(v, safe="")]
    return vals
