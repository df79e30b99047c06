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

__all__ = [
    "BLANK_RUN",
    "LONG",
    "NO_SESSION",
    "content",
    "length_mark",
    "line_count",
    "lines_of",
    "session_name",
    "visible",
]


NO_SESSION = Markup('<em class="muted">no session</em>')
"""An action without a session: markup no name can produce (a name is text, escaped) -- ``-``
and ``(none)`` are valid names (``affidavit.session``: printable ASCII)."""


def session_name(name: str | None) -> Markup:
    """A session's name (``visible``) in a ``<code class="session">``, whose every space shows
    (console.css: ``deploy     prod`` is not ``deploy prod``), those at either end marked
    (``_edge``), or ``NO_SESSION``."""
    if name is None:
        return NO_SESSION
    core = name.strip(" ")
    if not core:
        return (
            Markup('<code class="session">')
            + _edge(name, "making up the whole name")
            + Markup("</code>")
        )
    start = name[: len(name) - len(name.lstrip(" "))]
    end = name[len(name.rstrip(" ")) :]
    return (
        Markup('<code class="session">')
        + _edge(start, "at the start of the name")
        + visible(core)
        + _edge(end, "at the end of the name")
        + Markup("</code>")
    )


def _edge(spaces: str, where: str) -> Markup:
    """Spaces at an end of a session's name, kept as spaces (a copy is the name) in a span the
    stylesheet draws on a marked ground: a space no neighbour shows is otherwise nothing on
    screen, and ``deploy`` is not ``deploy ``."""
    if not spaces:
        return Markup("")
    n = len(spaces)
    title = f"{n} space{'s' if n > 1 else ''} {where}"
    return Markup(f'<span class="edge" title="{title}">{spaces}</span>')


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
"""Blank lines in a row a content shows as they are, and copies of a line right after it; a
longer run is one marked line instead (``content``)."""


def _blank(line: str) -> bool:
    """Empty, or white space only by ``str.isspace``: spaces, tabs, and also ``\\r`` (a CRLF
    blank line), ``\\f``, ``\\v``, U+0085, U+00A0 and the other Unicode spaces and separators --
    each drawn as its escape, but still a line with nothing on it pushing the rest down."""
    return not line or line.isspace()


def _count_of(c: str, n: int) -> str:
    """``n`` of character ``c``: ``1 space``, ``50 tabs``, ``150 \\r``."""
    word = {" ": "space", "\t": "tab"}.get(c)
    return f"{n} {word}{'' if n == 1 else 's'}" if word else f"{n} {escape_char(c)}"


def _held(run: str) -> str:
    """What a run of white space held, by character in order of first appearance."""
    counts: dict[str, int] = {}
    for c in run:
        counts[c] = counts.get(c, 0) + 1
    return ", ".join(_count_of(c, n) for c, n in counts.items())


SPACE_RUN = 32
"""Spaces and tabs in a row a content's line shows as they are; a longer run is one badge
(``_line``): ``pre-wrap`` lets a run of 15,000 spaces hang off the end of its row, drawing
nothing, and ``ls`` + spaces + ``curl ... | sh`` read as two commands on two rows."""

_SPACES = re.compile(rf"[ \t]{{{SPACE_RUN + 1},}}")


def _line(line: str) -> str:
    """One line of a content: ``visible``, each run of more than ``SPACE_RUN`` spaces or tabs
    one badge saying what it held."""
    out: list[str] = []
    at = 0
    for run in _SPACES.finditer(line):
        out.append(str(visible(line[at : run.start()], True)))
        title = "spaces and tabs in a row: the download has them"
        out.append(_badge("space-run", title, _held(run.group())))
        at = run.end()
    out.append(str(visible(line[at:], True)))
    return "".join(out)


def _badge(kind: str, title: str, text: str) -> str:
    return f'<span class="{kind}" title="{escape(title)}">{escape(text)}</span>'


def line_count(text: str) -> int:
    """The lines of ``text`` as its ``<pre>`` breaks them: line feeds, and a last line without
    one."""
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def lines_of(text: str) -> str:
    """``1 line``, ``5001 lines`` (``line_count``): the approval card's size line."""
    n = line_count(text)
    return f"{n} line{'' if n == 1 else 's'}"


def content(text: str) -> Markup:
    """A content's text (an HTTP body, SSH stdin) for its ``<pre>`` on an approval card:
    ``visible`` with line feeds and tabs kept; each run of more than ``BLANK_RUN`` blank lines
    (``_blank``) drawn as one badge saying how many and what they held (``150 blank lines, 150
    \\r``), and each line repeated more than ``BLANK_RUN`` times right after itself drawn once,
    then a badge ``the line above 4999 more times``.  An agent put 150 newlines (or CRLFs, or
    5000 ``#`` lines) between ``systemctl status app.service`` and ``curl ... | sh``: the tail
    lay thousands of pixels down, where nothing said what came before it.  A badge, like the
    length mark, is no text a content can hold (markup, not copied with the text); the exact
    bytes are the download's and ``affidavit approvals show``'s."""
    lines = text.split("\n")
    if len(lines) > 1 and not lines[-1]:
        lines.pop()  # the piece after a final line feed is no line: nothing follows it
        end = "\n"
    else:
        end = ""
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        j = i + 1
        if _blank(line):
            while j < len(lines) and _blank(lines[j]):
                j += 1
            run = lines[i:j]
            if len(run) > BLANK_RUN:
                held = _held("".join(run))
                held = f", {held}" if held else ""
                title = f"{len(run)} lines of nothing but white space: the download has them"
                out.append(_badge("blank-run", title, f"{len(run)} blank lines{held}"))
            else:
                out.extend(str(visible(b, True)) for b in run)
        else:
            while j < len(lines) and lines[j] == line:
                j += 1
            shown = _line(line)
            out.append(shown)
            more = j - i - 1
            if more > BLANK_RUN:
                title = f"{more} more copies of the line above: the download has them"
                out.append(_badge("repeat-run", title, f"the line above {more} more times"))
            else:
                out.extend(shown for _ in range(more))
        i = j
    return Markup("\n".join(out) + end)
