"""Text for a terminal: journal values escaped so they cannot drive it.

A session, an invocation id or a message in the journal came from a caller or a remote (or from
whoever could write the file).  Printed raw, an ESC sequence recolours or clears the operator's
terminal, a CR overwrites the line that shows an outcome, a bidi override reorders it.  Views
print them escaped: ``\\xNN`` for C0/C1 controls and DEL, ``\\uNNNN`` for format and separator
characters (bidi overrides, zero-width characters, U+2028/2029).
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["printable"]

_SUSPECT = re.compile(r"[^\x20-\x7e]")
"""Anything outside printable ASCII is looked at; ``_escape`` keeps ordinary letters."""


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    if ord(c) <= 0xFF and unicodedata.category(c) == "Cc":
        return f"\\x{ord(c):02x}"
    if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"):
        return f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}"
    return c


def printable(text: str) -> str:
    """``text`` with every character that could act on a terminal escaped."""
    return text if text.isascii() and text.isprintable() else _SUSPECT.sub(_escape, text)
