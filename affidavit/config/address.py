"""The operator console's address, ``"HOST:PORT"``: loopback unless explicitly allowed.

Read where it is given -- ``[service] console`` (a config error at that field) and
``affidavit serve --console`` (a usage error) -- by this one function.  The console is an
operator channel over plain HTTP: on any other address its login links, session cookies and
CSRF tokens would cross a network in clear, so there it is served only behind a TLS proxy
(``served_through_tls``; docs/console.md, "Security model")."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

__all__ = [
    "console_address",
    "console_origin",
    "is_loopback",
    "public_origin",
    "served_through_tls",
]


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback IP address: in 127.0.0.0/8, or ``::1`` (a zone, ``%lo``,
    changes nothing).  A name is not (``localhost`` is for ``console_address`` to turn into
    127.0.0.1: the console binds addresses), nor an IPv4-mapped ``::ffff:127.0.0.1``: Python
    3.13 counts those as loopback and 3.11 does not (gh-117566), and one rule -- the stricter
    -- judges the console's address in the config, at ``affidavit serve`` and in the console
    itself (``affidavit.console.app``) on every Python; write 127.0.0.1."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return False
    return ip.is_loopback


def console_address(text: str, allow_remote: bool = False) -> tuple[str, int]:
    """``(host, port)`` of ``"HOST:PORT"`` (``"[::1]:PORT"`` for IPv6; ``localhost`` is
    127.0.0.1); ``ValueError`` saying what to fix."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f'expected "HOST:PORT" (for example "127.0.0.1:8470"), got {text!r}')
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host == "localhost":
        host = "127.0.0.1"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"{host!r} is not an IP address (name one: 127.0.0.1 or ::1)") from None
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"port {port_text!r}: expected a number from 0 to 65535")
    if not allow_remote and not is_loopback(host):
        raise ValueError(
            f"{host} is not a loopback address: the console serves operators on this machine "
            "only, unless [service] console_allow_remote = true (then put TLS in front of it)"
        )
    return host, int(port_text)


def served_through_tls(host: str, public: str | None) -> None:
    """``ValueError`` unless a console bound to ``host`` is on loopback or is served through
    TLS: its public origin (``[service] console_public_origin``) ``https://``.  Over plain HTTP
    to the network a sniffer on the way reads the login link, the session cookie (not
    ``Secure``) and the CSRF token -- and approves requests with them."""
    if is_loopback(host) or (public or "").startswith("https://"):
        return
    raise ValueError(
        f"{host} is not a loopback address and the console speaks plain HTTP: serve it "
        "through a TLS proxy and set [service] console_public_origin to its https:// origin "
        f"(got {'none' if public is None else repr(public)}), or bind it to loopback and use "
        "an SSH tunnel"
    )


def console_origin(host: str, port: int) -> str:
    """``http://HOST:PORT`` (IPv6 in brackets): the console's base URL."""
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def public_origin(text: str) -> str:
    """``[service] console_public_origin`` as browsers send it in ``Origin``: a scheme, a host
    and perhaps a port -- no path, no user -- lower-cased, without the scheme's default port
    (a browser sends ``https://console.example`` for ``https://console.example:443``, and
    ``Host: console.example``: kept, every form would be refused); ``ValueError`` saying what
    to fix.  A name beyond ASCII is refused, not converted: browsers send its IDNA form
    (``xn--bcher-kva.example``), whose rules (UTS #46) Python's ``idna`` codec does not follow
    -- write that form.  Port 0 is no port a browser can reach."""
    parts = urlsplit(text)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.username is not None
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or port in (-1, 0)
    ):
        raise ValueError(
            f'expected an origin such as "https://console.example:8443" (scheme, host, '
            f"optional port; no path), got {text!r}"
        )
    host = parts.hostname  # lower-cased; an IPv6 address without its brackets
    if not host.isascii():
        raise ValueError(
            f"{text!r}: write the host name as browsers send it, in its IDNA (punycode) form "
            '("xn--...")'
        )
    host = f"[{host}]" if ":" in host else host
    default = {"http": 80, "https": 443}[parts.scheme]
    return f"{parts.scheme}://{host}" + ("" if port in (None, default) else f":{port}")
