"""Value checks more than one protocol's settings use: durations and host names."""

from __future__ import annotations

import ipaddress
import math
import re

from .fields import Read

__all__ = [
    "MAX_DURATION",
    "check_host",
    "duration_setting",
    "host_for_url",
    "host_setting",
    "parse_duration",
]

_HOST_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_\-]{0,61}[A-Za-z0-9_])?"
_HOSTNAME = re.compile(rf"(?=.{{1,253}}$){_HOST_LABEL}(?:\.{_HOST_LABEL})*")
_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)([dhms]))+")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([dhms])")
_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
MAX_DURATION = 36500 * 86400.0
"""100 years: any longer setting is a mistake, and a time that far ahead no longer fits a date
(a reconcile's "query again after" named by a 10^9-day settle window raised after the query)."""


def parse_duration(value: object, *, zero: bool = False) -> float:
    """``"24h"``, ``"90m"``, ``"1h30m"``, ``"7d"``, ``"45s"`` or a number of seconds; positive,
    or with ``zero=True`` also ``0`` / ``"0s"``; at most ``MAX_DURATION``."""
    if isinstance(value, bool):
        raise ValueError('must be a duration like "24h" or a number of seconds')
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and _DURATION.fullmatch(value.strip()):
        seconds = sum(float(n) * _UNITS[u] for n, u in _DURATION_PART.findall(value))
    else:
        raise ValueError('must be a duration like "24h" or a number of seconds')
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not zero):
        raise ValueError("must be a positive duration" if not zero else "must not be negative")
    if seconds > MAX_DURATION:
        raise ValueError("must be at most 100 years (36500d)")
    return seconds


def duration_setting(r: Read, *, zero: bool = False) -> float:
    """A ``Field`` parser for a duration setting (``parse_duration``; ``zero``: ``0`` allowed),
    refused at the field's path with ``parse_duration``'s words."""
    try:
        return parse_duration(r.raw(), zero=zero)
    except ValueError as exc:
        raise r.error(str(exc)) from None


def check_host(host: str) -> str:
    """Validate and normalize a host name or IP literal (names lower-cased): the one rule for
    every host a setting names -- an HTTP target's url, its proxy and redirect origins, an SSH
    target's host -- and for a redirect's Location (``origin_of``).

    A name beyond ASCII is refused, not converted: Python's ``idna`` codec is IDNA 2003, which
    maps ``faß.de`` to ``fass.de`` and drops a joiner (``ab\u200dc`` is ``abc``), where
    registries and browsers (IDNA 2008, UTS #46) mean ``xn--fa-hia.de`` -- another domain, which
    would get the credential.  The operator writes the ``xn--`` form.  A trailing dot is refused
    too: ``intranet.`` is another DNS query than ``intranet`` (no search list), and ``localhost.``
    no name TLS may send (RFC 6066 §3: no trailing dot in SNI) -- compared without it and
    connected to with it, one name would be two hosts."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    if not host.isascii():
        raise ValueError(NON_ASCII_HOST)
    if host.endswith("."):
        raise ValueError(TRAILING_DOT_HOST)
    if not _HOSTNAME.fullmatch(host):
        raise ValueError("is not a valid host name")
    return host.lower()


NON_ASCII_HOST = (
    'has a host name beyond ASCII: write its IDNA 2008 form ("xn--...", as a registry or '
    "browser shows it); the broker does not convert names (Python's codec is IDNA 2003, which "
    "maps some to another domain: faß.de to fass.de)"
)
TRAILING_DOT_HOST = (
    'has a host name ending in ".": write it without the dot (a resolver looks the dotted '
    "name up without its search list, and TLS may not send it)"
)


def host_for_url(host: str) -> str:
    """An IPv6 literal in brackets, anything else as it is."""
    return f"[{host}]" if ":" in host else host


def host_setting(r: Read) -> str:
    """A ``Field`` parser for a host name or IP address setting (normalized by ``check_host``)."""
    try:
        return check_host(r.string(max_len=253))
    except ValueError as exc:
        raise r.error(str(exc)) from None
