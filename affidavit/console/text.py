"""Text a caller or a remote chose, rendered so that what the operator reads is what it is.

Control characters, bidirectional overrides and isolates (U+202A-U+202E, U+2066-U+2069),
zero-width and other format characters (Unicode categories Cc, Cf, Zl, Zp, and the unassigned,
surrogate and private-use ones) can make a string display as something else: ``U+202E`` turns
``bash -c 'hs.live lruc'`` around on screen (the "Trojan Source" trick, CVE-2021-42574).  Each
one is shown as its escape (``\\u202e``) in a marked span instead, so nothing an agent writes can
reorder, hide or fake what an operator approves.
"""

from __future__ import annotations

import unicodedata

from markupsafe import Markup, escape

__all__ = ["visible"]

_SHOWN_AS = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_INVISIBLE = frozenset(("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"))


def _mark(c: str) -> str:
    code = ord(c)
    name = _SHOWN_AS.get(c) or (f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
    return f'<span class="ctl" title="U+{code:04X}">{name}</span>'


def visible(value: object, multiline: bool = False) -> Markup:
    """``value`` as escaped HTML with every invisible or reordering character shown as its
    escape; ``multiline`` keeps line feeds and tabs as they are (for a ``<pre>`` body)."""
    text = str(value)
    out: list[str] = []
    start = 0
    for i, c in enumerate(text):
        if c.isprintable():
            continue  # the fast path: isprintable is false for every category marked
        if multiline and c in "\n\t":
            continue
        if unicodedata.category(c) in _INVISIBLE or c in _SHOWN_AS:
            out.append(str(escape(text[start:i])))
            out.append(_mark(c))
            start = i + 1
    out.append(str(escape(text[start:])))
    return Markup("".join(out))
