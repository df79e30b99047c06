"""Text a caller or a remote chose, rendered so that what the operator reads is what it is.

The rule is ``affidavit.text``'s, the same one the command line prints by: control characters,
bidirectional overrides and isolates (U+202A-U+202E, U+2066-U+2069), zero-width and other format
characters (Unicode categories Cc, Cf, Zl, Zp, and the unassigned, surrogate and private-use
ones), and the invisible or blank characters of other categories (``affidavit.text.INVISIBLE``:
U+034F, variation selectors, Hangul fillers, every space but U+0020) can make a string display
as something else: ``U+202E`` turns ``bash -c 'hs.live lruc'`` around on screen (the "Trojan
Source" trick, CVE-2021-42574), ``dry_run\\u034f`` looks like ``dry_run``.  Each one is shown as
its escape (``\\u202e``) in a marked span instead, and so is a combining mark that changes its
letter (``0`` + U+0338) or stacks past two: no control, invisible character or mark an agent
writes can reorder, hide or fake what an operator approves (lookalike letters of other scripts
and right-to-left letters remain the reader's to judge).
"""

from __future__ import annotations

from markupsafe import Markup, escape

from affidavit.text import escape_char, pieces

__all__ = ["LONG", "NO_SESSION", "length_mark", "session_name", "visible"]


NO_SESSION = Markup('<em class="muted">no session</em>')
"""An action without a session: markup no name can produce (a name is text, escaped) -- ``-``
and ``(none)`` are valid names (``affidavit.session``: printable ASCII)."""


def session_name(name: str | None) -> Markup:
    """A session's name (``visible``), or ``NO_SESSION``."""
    return NO_SESSION if name is None else visible(name)


def _mark(c: str) -> str:
    return f'<span class="ctl" title="U+{ord(c):04X}">{escape_char(c)}</span>'


def visible(value: object, multiline: bool = False) -> Markup:
    """``value`` as escaped HTML with every invisible or reordering character shown as its
    escape; ``multiline`` keeps line feeds and tabs as they are (for a ``<pre>`` body)."""
    keep = "\n\t" if multiline else ""
    return Markup(
        "".join(_mark(p) if marked else str(escape(p)) for p, marked in pieces(str(value), keep))
    )


LONG = 256
"""Characters past which a value on an approval card is marked with its length: a URL or a
header value an agent pads to thousands of characters wraps over many lines (console.css breaks
it anywhere), and the mark, before it, says how much there is to read before approving it."""


def length_mark(value: object) -> Markup:
    """``(6047 characters)`` in a marked span when ``value`` is longer than ``LONG``, else
    nothing: the template puts it before the value's element, never inside it, and the
    stylesheet draws it as a badge that is not selected with the value (copying a header value
    took the mark with it, and a value can hold that text itself)."""
    n = len(str(value))
    return Markup(f'<span class="long">({n} characters)</span>') if n > LONG else Markup("")
