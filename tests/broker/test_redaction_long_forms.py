"""Audit 54b, F3 and F4, at the ``Redactor``: forms the audit found leaking.

F4: a value over ``LONG_VALUE`` bytes -- an AWS session token, ~800 base64 characters with
``/ + =`` -- echoed by PHP's ``json_encode`` (``\\/``), URL-encoded (``%2F %2B %3D``, either hex
case) or ``quote_plus``'d.  F3: a non-ASCII value's UTF-8 bytes read as latin-1 (Python's
http.server, WSGI) and written as UTF-8, as JSON ``\\u00c3`` escapes or percent-encoded.  And
F2's distinction: a form of a value under 8 bytes alone is ``short_echoed``, never ``echoed``.
"""

from __future__ import annotations

import base64
import json
import random
import re
import urllib.parse
from collections.abc import Callable

import pytest

from affidavit.secrets.redaction import LONG_VALUE, Redactor


def _token() -> str:
    rng = random.Random(54)
    while True:
        tok = "IQoJb3JpZ2luX2VjE" + base64.b64encode(rng.randbytes(600)).decode() + "CANARY=="
        if all(c in tok for c in "/+="):
            return tok


TOKEN = _token()
assert len(TOKEN) > LONG_VALUE

LONG_ECHOES: dict[str, Callable[[str], str]] = {
    "raw": lambda t: t,
    "php_json_encode": lambda t: json.dumps(t).replace("/", "\\/"),
    "json_u_escaped_solidus": lambda t: json.dumps(t).replace("/", "\\u002F"),
    "urlencode_upper_hex": lambda t: urllib.parse.quote(t, safe=""),
    "urlencode_lower_hex": lambda t: urllib.parse.quote(t, safe="").replace("%2F", "%2f"),
    "quote_plus": urllib.parse.quote_plus,
    "urlencode_slash_kept": lambda t: urllib.parse.quote(t, safe="/"),
}


def _redact(values: list[bytes], data: bytes) -> tuple[bytes, Redactor]:
    r = Redactor(values)
    return r.feed(data) + r.flush(), r


@pytest.mark.parametrize("name", sorted(LONG_ECHOES))
def test_a_long_token_echoed_escaped_is_redacted(name: str) -> None:
    echo = LONG_ECHOES[name](TOKEN).encode()
    out, r = _redact([TOKEN.encode(), b"Bearer " + TOKEN.encode()], b'{"echo": ' + echo + b"}")
    assert b"CANARY" not in out and TOKEN[:20].encode() not in out, out[:80]
    assert out.startswith(b'{"echo": ') and b"[REDACTED]" in out
    assert r.echoed and not r.short_echoed


def test_a_long_token_echo_split_across_feeds_is_redacted() -> None:
    echo = urllib.parse.quote(TOKEN, safe="").encode()
    data = b"before " * 2000 + echo + b" after"
    r = Redactor([TOKEN.encode()])
    out = b"".join(r.feed(data[i : i + 97]) for i in range(0, len(data), 97)) + r.flush()
    assert out == b"before " * 2000 + b"[REDACTED] after"


PASSWORD = "pässwörd-Ünïcode-CANARY"
MISREAD = PASSWORD.encode().decode("latin-1")  # 'pÃ¤sswÃ¶rd-...'

MISREAD_ECHOES: dict[str, Callable[[str], bytes]] = {
    "utf8": lambda s: s.encode(),
    "json_ascii": lambda s: json.dumps(s).encode(),
    "json_ascii_upper_hex": lambda s: re.sub(
        r"\\u00(..)", lambda m: "\\u00" + m[1].upper(), json.dumps(s)
    ).encode(),
    "percent": lambda s: urllib.parse.quote(s).encode(),
}


@pytest.mark.parametrize("name", sorted(MISREAD_ECHOES))
def test_a_non_ascii_password_read_as_latin1_is_redacted(name: str) -> None:
    echo = MISREAD_ECHOES[name](MISREAD)
    values = [b"alice:" + PASSWORD.encode(), PASSWORD.encode()]
    out, r = _redact(values, b'{"password": ' + echo + b"}")
    assert b"CANARY" not in out.upper() and b"[REDACTED]" in out, out
    assert r.echoed


def test_a_short_value_alone_is_no_proven_echo() -> None:
    values = [b"alice:2024", b"2024", b"Basic " + base64.b64encode(b"alice:2024")]
    out, r = _redact(values, b'{"date": "2024-12-07"}')
    assert out == b'{"date": "[REDACTED]-12-07"}'
    assert r.short_echoed and not r.echoed
    out, r = _redact(values, b'{"user": "alice:2024", "year": 2024}')
    assert out == b'{"user": "[REDACTED]", "year": [REDACTED]}'
    assert r.echoed and r.short_echoed
