"""Whether a URL path may climb out of the path it is appended to (a target's base path, or the
base path a redirect's credential is scoped to): ``climbs(route)`` says why, or None.

A server removes "." and ".." segments (RFC 3986 §5.2.4), but it reads a segment its own way
first.  So a segment is refused when *any* reading on the way to the remote's file system or
router is "." or ".."; the broker cannot know which reading the server makes, so it takes
every one of these:

* percent-decoded once (the ordinary server), or again (a proxy that decodes, then the
  application: ``%252e%252e`` is ``%2e%2e``, then ``..``) -- up to ``MAX_DECODES`` times; a
  segment that would still decode further is refused (no caller needs five layers of escapes);
* split on ``/`` and ``\\`` once decoded (``..%2Fadmin`` is ``../admin`` to a server that
  decodes ``%2F``, or ``%5C`` on Windows/IIS);
* up to its first ``;`` (Tomcat, Jetty and Spring drop path parameters before normalizing:
  ``..;x`` is ``..``), up to its first NUL (C code ends the string there: ``..%00x``) and up to
  a decoded ``?`` or ``#`` (a proxy that decodes and forwards the path unescaped -- Apache
  mod_rewrite ``[P]`` with ``$1``, CVE-2024-38474's class -- sends ``..%3Fx`` as ``..?x``: the
  parent, and a query);
* NFKC-normalized (full-width ``．．`` U+FF0E, ``‥`` U+2025, full-width ``／`` and ``＼``) and
  without whitespace, control or format characters anywhere (``..%20``, ``.%20.``, ``..%09``,
  ``.%C2%AD.``: Windows drops trailing spaces from a name, other code strips or ignores them);
  where NFKC makes escapes of its own (full-width ``％２ｅ`` is ``%2e``), the NFKC form is
  decoded too -- two readings out of each, so at most ``2 ** MAX_DECODES`` at the last depth.

Decoding is strict UTF-8: an escape sequence that is not UTF-8 -- an overlong ``%C0%AE`` is "."
to a lenient decoder (old IIS, Java's modified UTF-8) -- is refused at whatever depth it appears,
rather than guessed at.  IIS's ``%u002e`` is refused as written (a "%" without two hex digits:
``bad_percent``, the one check of it, which the query is held to as well) and decoded where a
decoding produced it (``%25u002e``).

Only a segment that *becomes* "." or ".." is refused: ``...``, ``a..b``, ``.well-known``,
``a%2Fb``, ``a%3F..`` and ``%2541`` (a literal ``%41``) pass.
"""

from __future__ import annotations

import re
import unicodedata
import urllib.parse

__all__ = [
    "BAD_PERCENT",
    "DOT_SEGMENT",
    "MAX_DECODES",
    "NOT_UTF8",
    "TOO_DEEP",
    "bad_percent",
    "climbs",
]

MAX_DECODES = 4
"""How many times over a segment is percent-decoded and checked."""

DOT_SEGMENT = (
    'must not contain "." or ".." segments, as any server may read one (percent-encoded, '
    'once or more; with ";" parameters, NUL, a "?" or "#", spaces; full-width)'
)
NOT_UTF8 = 'has percent-escapes that are not UTF-8 (an overlong "%C0%AE" is "." to some servers)'
TOO_DEEP = f"has a segment percent-encoded more than {MAX_DECODES} times over"
BAD_PERCENT = 'has a "%" not followed by two hex digits (IIS reads "%u002e" as ".")'

_PLAIN = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@/]*")
"""A route that holds nothing to decode or normalize: each segment is read as written."""
_ESCAPE = re.compile(r"%(?:[0-9A-Fa-f]{2}|[uU][0-9A-Fa-f]{4})")
_IIS_ESCAPE = re.compile(r"%[uU]([0-9A-Fa-f]{4})")
"""IIS's own escape: refused as sent (``BAD_PERCENT``); decoded when a decoding produced it."""
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_SEPARATORS = re.compile(r"[/\\]")
_END = re.compile("[;\x00?#]")
"""Where a name ends: a path parameter (Tomcat, Jetty, Spring), C's NUL, and -- once decoded
-- a query or a fragment (a proxy that decodes, then forwards the path unescaped: Apache
mod_rewrite's ``[P]`` with ``$1`` sends ``..%3Fx`` as ``..?x``, which the backend reads as
``..`` and a query; CVE-2024-38474's class)."""
_DOTS = (".", "..")
_INVISIBLE = frozenset({"Cc", "Cf"})


def climbs(route: str) -> str | None:
    """Why ``route`` (a URL path, without its query) may reach outside the path it is appended
    to -- one of ``DOT_SEGMENT``, ``NOT_UTF8``, ``TOO_DEEP``, ``BAD_PERCENT`` -- or None."""
    if _PLAIN.fullmatch(route):  # the common path: nothing to decode (issue 15)
        plain = any(s.partition(";")[0] in _DOTS for s in route.split("/"))
        return DOT_SEGMENT if plain else None
    why = bad_percent(route)
    if why is not None:
        return why
    for segment in route.split("/"):
        why = _segment(segment)
        if why is not None:
            return why
    return None


def bad_percent(text: str) -> str | None:
    """``BAD_PERCENT`` if ``text`` (a path, a query) has a "%" that is no escape, else None:
    the one check, for a query too, where no segment is read (``action.py``)."""
    return BAD_PERCENT if _BAD_ESCAPE.search(text) else None


def _segment(text: str) -> str | None:
    # Each depth's readings: the text as decoded, and its NFKC form where NFKC makes escapes
    # of its own (full-width "％２ｅ" is "%2e" to a server that normalizes, then decodes).
    # At most two readings from each: 2**MAX_DECODES at the last depth, each decoded once.
    readings = [text]  # a list, not a set: which refusal is named must not vary by hash
    for depth in range(MAX_DECODES + 1):
        if any(_reads_as_dots(r) for r in readings):
            return DOT_SEGMENT
        further: dict[str, None] = {}
        for reading in readings:
            for form in dict.fromkeys((reading, unicodedata.normalize("NFKC", reading))):
                if not _ESCAPE.search(form):
                    continue
                if depth == MAX_DECODES:
                    return TOO_DEEP
                try:
                    further[_decode(form)] = None
                except UnicodeError:  # not UTF-8, or an IIS escape of a lone surrogate
                    return NOT_UTF8
        if not further:
            return None
        readings = list(further)
    raise AssertionError("unreachable")  # pragma: no cover


def _decode(text: str) -> str:
    text = _IIS_ESCAPE.sub(lambda m: chr(int(m[1], 16)), text)
    return urllib.parse.unquote_to_bytes(text).decode("utf-8")


def _reads_as_dots(text: str) -> bool:
    """Some part of ``text`` (one segment at one depth of decoding) reads as "." or ".."."""
    for part in _SEPARATORS.split(unicodedata.normalize("NFKC", text)):
        name = _END.split(part, 1)[0]
        if "." in name and _visible(name) in _DOTS:
            return True
    return False


def _visible(name: str) -> str:
    """``name`` without whitespace, control (Cc) and format (Cf: soft hyphen, zero-width
    space, BOM, ...) characters."""
    return "".join(c for c in name if not (c.isspace() or unicodedata.category(c) in _INVISIBLE))
