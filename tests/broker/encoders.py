"""The encoders a server may echo a secret in: every form docs/redaction.md promises to remove.
Shared by the unit tests (test_redaction.py) and the end-to-end property test
(test_redaction_e2e.py).  Each takes the value and a hypothesis ``DataObject`` for the choices an
encoder leaves open (which bytes to escape, which hex case)."""

from __future__ import annotations

import base64
import json
import urllib.parse
from collections.abc import Callable

from hypothesis import strategies as st

__all__ = ["ENCODERS", "SECRETS", "SECRET_CHARS", "Encoder"]

Encoder = Callable[[bytes, st.DataObject], bytes]

# Characters that every encoding treats differently, plus a few ordinary ones and non-ASCII.
SECRET_CHARS = st.sampled_from([*'+/=%"\\ &?#:@~_-.aZ9', "é", "€", "😀", "\u2028"])
SECRETS = st.lists(SECRET_CHARS, min_size=4, max_size=14).map(lambda cs: "".join(cs).encode())


def _percent_any(value: bytes, data: st.DataObject) -> bytes:
    """Each byte literal or %XX with either hex case: percent-encoding with any safe set."""
    out = []
    for b in value:
        if data.draw(st.booleans()):
            hx = b"%02X" % b
            out.append(b"%" + (hx.lower() if data.draw(st.booleans()) else hx))
        else:
            out.append(bytes([b]))
    return b"".join(out)


def _json_any(value: bytes, data: st.DataObject) -> bytes:
    """Each character literal, its short JSON escape or ``\\uXXXX`` (surrogate pair beyond the
    BMP) with either hex case; characters JSON requires escaped are always escaped."""
    out = []
    for ch in value.decode("utf-8"):
        short = {'"': '\\"', "\\": "\\\\", "/": "\\/", "\n": "\\n", "\t": "\\t"}.get(ch)
        mode = data.draw(st.integers(0, 2))
        if mode == 1 and short:
            out.append(short)
        elif mode == 2 or ch in '"\\' or ord(ch) < 0x20:
            units = ch.encode("utf-16-be")
            esc = "".join(f"\\u{units[i]:02x}{units[i + 1]:02x}" for i in range(0, len(units), 2))
            out.append(esc.upper().replace("\\U", "\\u") if data.draw(st.booleans()) else esc)
        else:
            out.append(ch)
    return "".join(out).encode("utf-8")


ENCODERS: dict[str, Encoder] = {
    "raw": lambda v, d: v,
    "percent_any_safe_set": _percent_any,
    "quote": lambda v, d: urllib.parse.quote_from_bytes(
        v, safe=d.draw(st.sampled_from(["", "/", "/+=:@"]))
    ).encode(),
    "quote_plus": lambda v, d: urllib.parse.quote_plus(v).encode(),
    "base64": lambda v, d: base64.b64encode(v),
    "base64_unpadded": lambda v, d: base64.b64encode(v).rstrip(b"="),
    "base64_url": lambda v, d: base64.urlsafe_b64encode(v),
    "base64_url_unpadded": lambda v, d: base64.urlsafe_b64encode(v).rstrip(b"="),
    "base64_percent": lambda v, d: urllib.parse.quote_from_bytes(
        base64.b64encode(v), safe=""
    ).encode(),
    "json_dumps": lambda v, d: json.dumps(v.decode(), ensure_ascii=d.draw(st.booleans())).encode(),
    "json_php_slashes": lambda v, d: json.dumps(v.decode()).replace("/", "\\/").encode(),
    "json_any_escapes": _json_any,
    "json_of_base64": lambda v, d: (
        json.dumps(base64.b64encode(v).decode()).replace("/", "\\/").encode()
    ),
    "hex": lambda v, d: v.hex().encode(),
    "hex_upper": lambda v, d: v.hex().upper().encode(),
}
