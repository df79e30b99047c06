"""The one rule for showing text a caller or a remote chose: what the operator reads is what it is.

An agent chooses a target path, a query, headers, a body, an SSH command, a session name, a note,
an invocation id; a remote chooses its response headers and body.  Printed raw, an ESC sequence
recolours or clears the operator's terminal (or worse: sets its title, answers queries), a CR
overwrites the line that shows an outcome, a BEL rings, a bidirectional override
(U+202A-U+202E, U+2066-U+2069) turns ``bash -c 'hs.live lruc'`` around on screen (the "Trojan
Source" trick, CVE-2021-42574), a zero-width character hides in an identifier.

Every character of Unicode categories Cc (C0 and C1 controls, DEL), Cf (format: bidi controls,
zero-width characters, soft hyphen), Zl and Zp (U+2028, U+2029), Cs (a lone surrogate, as argv
bytes that are not UTF-8 arrive), Co (private use) and Cn (unassigned) -- and every character in
``INVISIBLE``: the rest of what draws nothing or a blank a reader cannot tell from a plain space
(a combining grapheme joiner, variation selectors, Hangul fillers, the blank Braille pattern,
every space but U+0020) -- and every combining mark that changes the letter it sits on or
stacks over the lines around it (an enclosing mark, an overlay such as U+0338, each mark after
the second in a row or right after an escape: ``_mark_shown``) is shown as its escape:
``\\n``, ``\\r``, ``\\t`` for those three, else ``\\uNNNN`` (``\\u001b``, ``\\u202e``) or
``\\UNNNNNNNN`` beyond the BMP.  These are JSON's own escapes (but ``\\U``), so an escape that
lands inside a JSON string still reads back as the character it stands for.  What the rule
leaves to the reader: letters of other scripts that look like Latin ones, and right-to-left
letters, which the bidi algorithm still reorders with what is around them.

``printable`` is the rule for a terminal (every human-readable line the command line prints;
``affidavit.cli`` also passes everything it writes through it, keeping only line feeds and
tabs); the web console's ``visible`` (``affidavit.console.text``) marks the same characters,
found by the same ``pieces``, in HTML.  This module imports nothing at its top: the thin
clients load it on every run.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: see affidavit/__init__.py

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping
    from typing import Any

NAMED = 20
"""Items a log line names at most (then "and N more"): a line stays a line."""

__all__ = [
    "ATTESTED",
    "INVISIBLE",
    "NAMED",
    "NO_SESSION",
    "SPACES",
    "cell",
    "escape_char",
    "json_escape",
    "named",
    "outcome_counts",
    "pieces",
    "printable",
    "session_cell",
    "shown_as_is",
    "shown_outcome",
    "utc_time",
]

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_SHOWN_ESCAPED = frozenset(("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"))

_SPACE_RANGES = (
    (0x00A0, 0x00A0),
    (0x1680, 0x1680),
    (0x2000, 0x200A),
    (0x202F, 0x202F),
    (0x205F, 0x205F),
    (0x3000, 0x3000),
)
SPACES = "".join(chr(c) for lo, hi in _SPACE_RANGES for c in range(lo, hi + 1))
"""Every space separator (Zs) but U+0020, in ``INVISIBLE``: typed text holds them (macOS's
Option+Space, French typing, pasted text), so an operator's note may (``check_note``)."""

_INVISIBLE_RANGES = (
    # Default_Ignorable_Code_Point (DerivedCoreProperties.txt, Unicode 14.0 to 16.0) outside the
    # categories above: a renderer draws nothing for them, so "dry_run\u034f" looks like
    # "dry_run" while the remote reads another key.  The rest of that property is Cf or Cn.
    (0x034F, 0x034F),  # COMBINING GRAPHEME JOINER (Mn)
    (0x115F, 0x1160),  # HANGUL CHOSEONG FILLER, HANGUL JUNGSEONG FILLER (Lo)
    (0x17B4, 0x17B5),  # KHMER VOWEL INHERENT AQ, AA (Mn)
    (0x180B, 0x180D),  # MONGOLIAN FREE VARIATION SELECTOR ONE to THREE (Mn)
    (0x180F, 0x180F),  # MONGOLIAN FREE VARIATION SELECTOR FOUR (Mn)
    (0x3164, 0x3164),  # HANGUL FILLER (Lo)
    (0xFE00, 0xFE0F),  # VARIATION SELECTOR-1 to -16 (Mn)
    (0xFFA0, 0xFFA0),  # HALFWIDTH HANGUL FILLER (Lo)
    (0xE0100, 0xE01EF),  # VARIATION SELECTOR-17 to -256 (Mn)
    # Not default-ignorable, yet blank in the fonts a terminal or browser uses.
    (0x2800, 0x2800),  # BRAILLE PATTERN BLANK (So)
    (0x16FE4, 0x16FE4),  # KHITAN SMALL SCRIPT FILLER (Mn)
    (0x1D159, 0x1D159),  # MUSICAL SYMBOL NULL NOTEHEAD (So)
    # Every space separator (Zs) but U+0020: each is a blank of some width -- U+200A is a
    # hair's -- that no reader tells from a plain space or from nothing, so "dry run" spelt
    # with U+00A0 would look like the key spelt with a space.  Shown escaped, they cost a
    # reader of French or CJK text some \u00a0 and \u3000; an approval binds exact bytes.
    *_SPACE_RANGES,
)
INVISIBLE = frozenset(chr(c) for lo, hi in _INVISIBLE_RANGES for c in range(lo, hi + 1))
"""Printable by ``str.isprintable`` and shown escaped all the same (see the module's text);
tests/broker/test_terminal_escapes.py pins it against the Unicode data."""


def escape_char(c: str) -> str:
    """How the one character ``c`` is shown when it must not act (``\\u001b``)."""
    code = ord(c)
    return _NAMED.get(c) or (f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")


def _mark_shown(c: str, run: int, after_escape: bool) -> bool:
    """Whether the combining mark ``c``, the ``run``-th of a row, is shown as its escape: an
    enclosing mark (Me) or an overlay (combining class 1: U+0334-U+0338, U+20D2...) changes the
    letter it sits on (``0`` + U+0338 looks like a slashed zero, ``=`` + U+0338 like ``\u2260``);
    from the third in a row on, a stack paints over the lines around it; after an escape it
    would sit on the escape's last digit."""
    import unicodedata

    return (
        run > 2 or after_escape or unicodedata.category(c) == "Me" or unicodedata.combining(c) == 1
    )


def pieces(text: str, keep: str = "") -> Iterator[tuple[str, bool]]:
    """``text`` cut into runs of plain text ``(run, False)`` and single characters that must be
    shown escaped ``(char, True)``; the characters in ``keep`` (``"\\n"``) count as plain."""
    import unicodedata

    start = 0
    run = 0  # combining marks in a row so far
    escaped = False  # whether the character before was shown escaped
    for i, c in enumerate(text):
        if c in keep:
            run, escaped = 0, False
            continue
        if c.isprintable() and c not in INVISIBLE:
            # the fast path: isprintable is false for every category escaped
            if c < "\u0300" or unicodedata.category(c)[0] != "M":
                run, escaped = 0, False
                continue
            run += 1
            if not _mark_shown(c, run, escaped):
                continue
        else:
            run = 0
            if not (c in _NAMED or c in INVISIBLE or unicodedata.category(c) in _SHOWN_ESCAPED):
                escaped = False
                continue
        if start < i:
            yield text[start:i], False
        yield c, True
        start = i + 1
        escaped = True
    if start < len(text):
        yield text[start:], False


def shown_as_is(text: str) -> bool:
    """Whether ``text`` holds nothing ``printable`` would escape: at C speed when it is
    printable and holds no character of ``INVISIBLE`` and no combining mark; text with a mark
    is read through ``pieces``."""
    if not text.isprintable():
        return False
    if text.isascii():
        return True
    if not INVISIBLE.isdisjoint(text):
        return False
    return _marks().isdisjoint(text) or not any(escaped for _, escaped in pieces(text))


_MARKS: list[frozenset[str]] = []


def _marks() -> frozenset[str]:
    """Every combining mark (category M), built on first use from the Unicode data of planes
    0, 1 and 14, where every one is (the test of every code point in
    tests/broker/test_terminal_escapes.py holds ``shown_as_is`` to ``pieces``): ~30 ms."""
    if not _MARKS:
        import unicodedata

        planes = (*range(0x20000), *range(0xE0000, 0xF0000))
        _MARKS.append(frozenset(c for c in map(chr, planes) if unicodedata.category(c)[0] == "M"))
    return _MARKS[0]


def printable(text: str, keep: str = "") -> str:
    """``text`` with every character that could act on a terminal, or disguise what it shows,
    escaped; the characters in ``keep`` (``"\\n\\t"`` for multi-line output) stay as they are."""
    probe = text
    for c in keep:
        probe = probe.replace(c, "")
    if shown_as_is(probe):
        return text  # the fast path, at C speed: most output has nothing to escape
    return "".join(escape_char(p) if escaped else p for p, escaped in pieces(text, keep))


def cell(value: object, width: int, right: bool = False) -> str:
    """``value`` as one column of a text table, ``width`` characters wide (``right``: aligned
    right), so that it can never look like more than one cell, nor (uncut) like another value:

    - shown quoted as a JSON string (``"nightly batch"``) when it holds a space, a ``"`` or a
      backslash, or anything ``printable`` escapes: inside the quotes every escape is JSON's
      (a character beyond the BMP as its surrogate pair), so the cell reads back with
      ``json.loads``; unquoted, a cell is the value itself (the six characters ``\\u00a0``
      are quoted, ``"\\\\u00a0"``, a real U+00A0 is ``"\\u00a0"``);
    - longer than ``width``, cut in its middle with ``...``: both ends show, so
      ``payments-production`` and ``payments-prod-eu`` stay two names (two that differ only in
      the part cut out still look alike: ``--json`` has them whole).

    A caller's session name of 255 characters padded with spaces forged the PHASE and OUTCOME
    columns of ``affidavit actions`` before.  The last column of a row may take
    ``cell(value, 0)``: never cut."""
    text = str(value)
    if " " in text or '"' in text or "\\" in text or not shown_as_is(text):
        text = text.replace("\\", "\\\\").replace('"', '\\"')
        shown = ((_NAMED.get(p) or json_escape(p)) if e else p for p, e in pieces(text))
        text = '"' + "".join(shown) + '"'
    if width and len(text) > width:
        head = (width - 2) // 2
        tail = max(width - 3 - head, 0)
        text = text[:head] + "..." + (text[-tail:] if tail else "")
    return text.rjust(width) if right else text.ljust(width)


ATTESTED = "operator_attested"
"""``evidence.source`` of a record whose outcome an operator attested (``EvidenceSource``'s
value, written out: the thin client imports no contract; tests/journal/test_view_tables.py
checks they agree)."""


def shown_outcome(outcome: str, evidence: Mapping[str, Any] | None) -> str:
    """A record's outcome as a table shows it, from its JSON: ``committed (attested)`` when it
    rests on an operator's attestation, not on the remote's answer (``statemachine.attested``)."""
    if isinstance(evidence, dict) and evidence.get("source") == ATTESTED:
        return f"{outcome} (attested)"
    return outcome


def outcome_counts(entry: dict[str, Any]) -> list[tuple[str, int]]:
    """A sessions entry's outcome counts as a table shows them, by outcome: those an operator
    attested apart (``committed(attested)``), the rest under the outcome alone -- each once."""
    attested = entry.get("attested") or {}
    out: list[tuple[str, int]] = []
    for outcome, n in sorted(entry["outcomes"].items()):
        proven = n - attested.get(outcome, 0)
        if proven:
            out.append((outcome, proven))
        if attested.get(outcome):
            out.append((f"{outcome}(attested)", attested[outcome]))
    return out


NO_SESSION = "-"
"""A table's session cell for an action without one: a session *named* ``-`` (a valid name:
``affidavit.session``) is shown quoted, ``"-"`` (``session_cell``)."""


def session_cell(name: str | None, width: int) -> str:
    """``cell`` of a session's name, or ``NO_SESSION`` for none: a name that would show as that
    (``-``), or as nothing (an empty one, which no caller can give), is quoted as a JSON string,
    so the bare ``-`` means no session and nothing else."""
    if name is None:
        return cell(NO_SESSION, width)
    if name in (NO_SESSION, ""):
        return f'"{name}"'.ljust(width)
    return cell(name, width)


def json_escape(c: str) -> str:
    """The one character ``c`` as a JSON string's ``\\uXXXX`` escape (beyond the BMP, its
    surrogate pair: ``\\U`` is no JSON)."""
    code = ord(c)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


ECHO = 64
"""Characters of the caller's own text an answer quotes at most (``echoed``; the daemon's
``named``): an id the broker gives has 30; a 10 000-character path segment was echoed whole."""


def echoed(text: str) -> str:
    """The caller's ``text`` (an id it sent) as a message quotes it: anything unprintable
    escaped (``printable``), and cut to ``ECHO`` characters, ``...`` marking the cut -- the
    same words embedded and through the daemon."""
    shown = printable(text)
    return shown if len(shown) <= ECHO else shown[: ECHO - 3] + "..."


def utc_time(at: object, fmt: str) -> str:
    """``at`` (seconds since the epoch, a journal row's) as UTC in ``fmt``.  A value no clock
    shows -- infinite, NaN, past the platform's range: a row someone altered -- is shown as
    itself, marked, never an exception; anything but a number is ``-``."""
    from datetime import UTC, datetime

    if isinstance(at, bool) or not isinstance(at, int | float):
        return "-"
    try:
        return datetime.fromtimestamp(at, UTC).strftime(fmt)
    except (OverflowError, ValueError, OSError):
        return f"{at!r} (not a time)"


def named(items: list[str], limit: int = NAMED) -> str:
    """``items`` comma-separated, the first ``limit`` of them, then "and N more" if any."""
    more = len(items) - limit
    return ", ".join(items[:limit]) + (f" and {more} more" if more > 0 else "")
