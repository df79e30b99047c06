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

import re

from markupsafe import Markup, escape

from affidavit.text import escape_char, pieces

__all__ = ["BLANK_RUN", "LONG", "NO_SESSION", "content", "length_mark", "session_name", "visible"]


NO_SESSION = Markup('<em class="muted">no session</em>')
"""An action without a session: markup no name can produce (a name is text, escaped) -- ``-``
and ``(none)`` are valid names (``affidavit.session``: printable ASCII)."""


def session_name(name: str | None) -> Markup:
    """A session's name (``visible``) in a ``<code class="session">``, whose every space shows
    (console.css: ``deploy     prod`` is not ``deploy prod``), or ``NO_SESSION``."""
    if name is None:
        return NO_SESSION
    return Markup('<code class="session">') + visible(name) + Markup("</code>")


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


BLANK_RUN = 3
"""Blank lines in a row (empty, or spaces and tabs only) a content shows as they are; a longer
run is one marked line instead (``content``)."""

_BLANK_LINE = re.compile(r"[ \t]*")


def content(text: str) -> Markup:
    """A content's text (an HTTP body, SSH stdin) for its ``<pre>`` on an approval card:
    ``visible`` with line feeds and tabs kept, and each run of more than ``BLANK_RUN`` blank
    lines drawn as one badge saying how many there are (``150 blank lines``).  An agent put
    150 newlines between ``systemctl status app.service`` and ``curl ... | sh``: the tail lay
    2768 px down, where nothing said the blank lines were there.  The badge, like the length
    mark, is no text a content can hold (markup, not copied with the text); the exact bytes are
    the download's and ``affidavit approvals show``'s."""
    lines = text.split("\n")
    out: list[str] = []
    blank: list[str] = []

    def flush() -> None:
        if len(blank) > BLANK_RUN:
            chars = sum(len(b) for b in blank)
            extra = f", {chars} spaces or tabs" if chars else ""
            out.append(
                f'<span class="blank-run" title="{len(blank)} lines of nothing but spaces and '
                f'tabs: the download has them">{len(blank)} blank lines{extra}</span>'
            )
        else:
            out.extend(str(visible(b, True)) for b in blank)
        blank.clear()

    last = len(lines) - 1
    for i, line in enumerate(lines):
        # The piece after a final line feed is no line: nothing follows it.
        if _BLANK_LINE.fullmatch(line) and not (i == last and i > 0 and not line):
            blank.append(line)
            continue
        flush()
        out.append(str(visible(line, True)))
    flush()
    return Markup("\n".join(out))
