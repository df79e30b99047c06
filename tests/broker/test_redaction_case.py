"""Canaries: a credential echoed with its letters' case changed is redacted from bodies too.

An error page that upper-cases the request line (``AUTHORIZATION: BEARER SK_LIVE_...``), a
log that lower-cases it, a hex dump in mixed case: a case-folded token still carries nearly all
its entropy.  A value of ``MIN_ANY_CASE`` bytes or more is matched in every form with its
letters in either case; a shorter one keeps its forms' case in bodies (docs/redaction.md).
Each echo is checked whole, and streamed with a cut at every position of it.
"""

from __future__ import annotations

import base64
import itertools
import json
import random
import urllib.parse
from collections.abc import Callable

import pytest

from affidavit.secrets.redaction import LONG_VALUE, MIN_ANY_CASE, REDACTED, Redactor

B64_TOKEN = b"sk_live_Ab3Xy9Zq+Cd7/Ef8Gh=="
URL_TOKEN = b"Zt-Q7pLm_V2xKw9-Rb4_nY"
HEX_TOKEN = b"9F86d081884C7d659A2fEAa0c55Ad015"

_TOKENS = {"base64": B64_TOKEN, "urlsafe": URL_TOKEN, "mixed_hex": HEX_TOKEN}


def _flip(data: bytes, seed: int) -> bytes:
    """Each ASCII letter's case flipped at random (a fixed seed: reproducible)."""
    rnd = random.Random(seed)
    return bytes(
        c ^ 0x20 if chr(c).isalpha() and c < 0x80 and rnd.random() < 0.5 else c for c in data
    )


_CASES: dict[str, Callable[[bytes], bytes]] = {
    "upper": bytes.upper,
    "lower": bytes.lower,
    "flip1": lambda v: _flip(v, 1),
    "flip2": lambda v: _flip(v, 2),
}


def _chunked(r: Redactor, data: bytes, cuts: list[int]) -> bytes:
    bounds = [0, *sorted(cuts), len(data)]
    return b"".join(r.feed(data[a:b]) for a, b in itertools.pairwise(bounds)) + r.flush()


def _assert_redacted(values: list[bytes], body: bytes, echo: bytes) -> None:
    """``echo`` is gone from ``body`` redacted whole and streamed with every single cut (and
    a pair of cuts inside the echo), and both give the same bytes."""
    whole = Redactor(values).sub(body)
    assert REDACTED in whole
    assert echo not in whole
    at = body.index(echo)
    cuts = [[i] for i in range(len(body) + 1)] + [[at + 3, at + len(echo) - 2]]
    for cut in cuts:
        assert _chunked(Redactor(values), body, cut) == whole, cut
    for token in values:
        for folded in (token.lower(), token.upper()):
            assert folded not in whole.lower().replace(REDACTED.lower(), b"")


# A hex token lower- or upper-cased whole was matched before (``_case_free``); mixed, it was not.
_RAW = [(n, c) for n in sorted(_TOKENS) for c in sorted(_CASES)]
_RAW = [(n, c) for n, c in _RAW if n != "mixed_hex" or c.startswith("flip")]


@pytest.mark.parametrize(("name", "case"), _RAW)
def test_a_case_changed_raw_echo_is_redacted_from_a_body(name: str, case: str) -> None:
    token = _TOKENS[name]
    injected = b"Bearer " + token
    echo = _CASES[case](injected)
    body = b"HTTP/1.1 401\r\nREQUEST LINE: GET / " + echo + b"\r\n\r\nbye"
    _assert_redacted([token, injected], body, echo)
    assert Redactor([token, injected]).sub(body).endswith(b"[REDACTED]\r\n\r\nbye")


_FORMS: dict[str, Callable[[bytes], bytes]] = {
    "base64": base64.b64encode,
    "base64_url": base64.urlsafe_b64encode,
    "hex": lambda v: v.hex().encode(),
    "percent": lambda v: urllib.parse.quote_from_bytes(v, safe="").encode(),
    "json": lambda v: json.dumps(v.decode()).replace("/", "\\/").encode(),
}


# The hex of an alphanumeric value has no letter to change the case of.
_DERIVED = [
    (n, f) for n in sorted(_TOKENS) for f in sorted(_FORMS) if (n, f) != ("mixed_hex", "hex")
]


@pytest.mark.parametrize(("name", "form"), _DERIVED)
def test_a_case_changed_derived_form_is_redacted_from_a_body(name: str, form: str) -> None:
    """The forms already matched (base64, hex, percent-encoding, JSON escapes) changed in case:
    a percent escape's hex digits keep their meaning, only the letters around them change."""
    token = _TOKENS[name]
    written = _FORMS[form](token)
    echoes = {_CASES[case](written) for case in ("upper", "lower", "flip1")} - {written}
    assert echoes
    for echo in sorted(echoes):
        _assert_redacted([token], b"<p>" + echo + b"</p>", echo)


def test_a_short_value_keeps_its_case_in_bodies_and_not_in_short_text() -> None:
    """Under ``MIN_ANY_CASE`` bytes a case-folded match is plausibly chance: a body keeps it."""
    short = b"xYz12q7"
    assert len(short) < MIN_ANY_CASE
    r = Redactor([short])
    assert r.sub(b"a " + short + b" b") == b"a [REDACTED] b"
    for other in (short.upper(), short.lower()):
        assert r.sub(b"a " + other + b" b") == b"a " + other + b" b"
        assert r.scrub_text(f"a {other.decode()} b") == "a [REDACTED] b"
    # Next to a long value matched in any case, at the same first letter.
    both = Redactor([short, b"xYz12q7-Long-Token"])
    assert both.sub(b"XYZ12Q7 XYZ12Q7-LONG-TOKEN xYz12q7") == b"XYZ12Q7 [REDACTED] [REDACTED]"


def test_a_long_value_and_a_pem_line_are_redacted_in_any_case() -> None:
    """A value over ``LONG_VALUE`` (a JWT) and a PEM body line are matched raw and as whole
    base64 only, but those in any case too: a log that upper-cases a JWT still leaks it."""
    jwt = b"eyJhbGciOiJIUzI1NiJ9." + b"eyJzdWIiOiJhZ2VudCJ9Tm9wZVN0aWxsU2VjcmV0" * 4 + b".sIg_Xy-9z"
    assert len(jwt) > LONG_VALUE
    for echo in (jwt.upper(), jwt.lower(), _flip(jwt, 3), base64.b64encode(jwt).swapcase()):
        _assert_redacted([jwt], b"log: " + echo + b" end", echo)
    line = b"b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW"
    pem = b"-----BEGIN OPENSSH PRIVATE KEY-----\n" + line + b"\n-----END OPENSSH PRIVATE KEY-----\n"
    _assert_redacted([pem], b"$ cat key | tr a-z A-Z\n" + line.upper() + b"\n", line.upper())


def _escaped_whole(data: bytes, style: str) -> bytes:
    """Every byte of ``data`` (ASCII) written as an escape: ``%XX`` or ``\\uXXXX``."""
    if style == "percent":
        return b"".join(b"%%%02X" % c for c in data)
    return b"".join(b"\\u%04x" % c for c in data)


@pytest.mark.parametrize(
    ("name", "style"), [(n, s) for n in sorted(_TOKENS) for s in ("percent", "json")]
)
def test_a_case_changed_echo_written_in_escapes_is_redacted_from_a_body(
    name: str, style: str
) -> None:
    """The value's case changed first, then written escaped -- a page that upper-cases the
    request line and then percent-encodes (or JSON-escapes) every byte of it: ``%53%4B...`` is
    ``SK...``, the letters of ``sk_live_...`` in the other case.  An escape of a letter in the
    other case is that letter in the other case (each escape alone, and one in the middle of a
    literal run)."""
    token = _TOKENS[name]
    for case in ("upper", "lower", "flip1"):
        changed = _CASES[case](token)
        if changed == token:
            continue
        echo = _escaped_whole(changed, style)
        _assert_redacted([token], b"<p>" + echo + b"</p>", echo)
        mid = len(changed) // 2
        one = changed[:mid] + _escaped_whole(changed[mid : mid + 1], style) + changed[mid + 1 :]
        _assert_redacted([token], b"<p>" + one + b"</p>", one)


def test_a_short_value_in_short_text_is_matched_with_letters_escaped_in_the_other_case() -> None:
    """Short text matches a value's letters in either case however short (a header a proxy
    rewrote, a Location a parser lower-cased): written escaped too -- ``%58`` is the ``X`` of
    ``xYz12q7``.  A body keeps a short value's case, escaped or not."""
    short = b"xYz12q7"
    r = Redactor([short])
    for echo in ("%58Yz12q7", "x\\u0079z12q7", "\\u0058\\u0079Z12Q7", "%58%79%5A12%51%37"):
        # (Replaced whole when percent-decoding shows the value: ``holds``.)
        assert r.scrub_text(f"a {echo} b") in ("a [REDACTED] b", "[REDACTED]"), echo
        assert r.sub(f"a {echo} b".encode()) == f"a {echo} b".encode(), echo
