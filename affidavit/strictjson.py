"""JSON read strictly: what Python's parser takes but JSON's readers disagree on is refused --
and written compactly (``compact_encoder``: the journal's chain and the config's fingerprints).

A field named twice in one object (Python keeps the last; a policy proxy reading the first
sees another action than the broker performs), ``NaN``/``Infinity``/``-Infinity`` (no JSON
number, RFC 8259: another reader refuses them or reads them otherwise), and numbers Python reads
otherwise than other readers or not at all: one beyond a double's range (``1e400``, read as
infinity) and an integer longer than ``INT_DIGITS`` (4300, Python's default bound, whatever
the process sets; another reader takes it as a double).  ``loads`` raises ``DuplicateField``
with the field's path, or ``NotJsonNumber``; any other fault is the parser's ``ValueError``.
``loads_bytes`` reads a body as ``json.loads`` reads bytes, raises ``TooDeep`` (a
``RecursionError``) for one nested deeper than ``BODY_DEPTH`` levels, and ``NotText`` for JSON text
holding bytes that are no text in its encoding (invalid UTF-8 inside a string: one reader
replaces them, another refuses the body).  The action parser
(``affidavit.protocols.actions.strict_json``), the MCP proxy's transport and the HTTP bodies
that decide something (``protocols.http.selectors``, ``batch``) read with it.  A leaf importing
only the standard library's ``json``, ``math``, ``re`` and ``sys``: the MCP proxy and
the thin clients load no broker code (tests/mcp/test_modes.py).
"""

from __future__ import annotations

import json
import json.encoder
import math
import re
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = [
    "ACTION_NODES",
    "MEMBER_NAME",
    "DuplicateField",
    "Members",
    "NotJsonNumber",
    "NotText",
    "TooDeep",
    "TooLarge",
    "compact_encoder",
    "loads",
    "loads_bytes",
    "members",
    "prescan",
]

_VISIBLE = re.compile(r"[\x21-\x7e]+")

ACTION_NODES = 10_000
"""Values (objects, arrays, scalars) an action may hold in all (``protocols.actions.MAX_NODES``):
here, in a leaf, so that the MCP proxy's transport answers with the same bound."""


class DuplicateField(ValueError):
    """An object names a field twice; ``path`` is where (``action.headers.X``)."""

    what = "is given twice in one object (each field once)"

    def __init__(self, path: str) -> None:
        super().__init__(f"{path}: {self.what}")
        self.path = path


class NotJsonNumber(ValueError):
    """``NaN``, ``Infinity`` or ``-Infinity`` (``name``), or a number readers disagree on."""

    def __init__(self, name: str, what: str | None = None) -> None:
        self.name = name
        self.what = what or f"holds {name}, which is not a JSON number"
        super().__init__(self.what)


class NotText(ValueError):
    """JSON text holding bytes that are no text in its encoding (``loads_bytes``)."""

    what = "holds bytes that are not text in its encoding (UTF-8, -16 or -32)"

    def __init__(self) -> None:
        super().__init__(self.what)


BODY_DEPTH = 500
"""Levels ``loads_bytes`` reads a body nested to at most: deeper is ``TooDeep``, whatever the
call stack (Python's parser recurses per level and gave up past ~1000 less the frames already
used: a body read 60 frames down failed where the same body read directly parsed)."""


class TooDeep(RecursionError):
    """JSON text nested deeper than ``BODY_DEPTH`` (``loads_bytes``): a ``RecursionError``, as
    the parser's own giving up is, but at one depth wherever it is read."""

    what = f"nests deeper than {BODY_DEPTH} levels"

    def __init__(self) -> None:
        super().__init__(self.what)


class _Duplicate(Exception):
    pass


def _no_constant(name: str) -> Any:
    raise NotJsonNumber(name)


def _finite(text: str) -> float:
    value = float(text)
    if value in (math.inf, -math.inf):
        raise NotJsonNumber("a number", "holds a number beyond a double's range (read as infinity)")
    return value


INT_DIGITS = 4300
"""Digits of the longest integer read (Python's default ``sys.get_int_max_str_digits()``; another
reader takes a longer one as a double): the project's bound, whatever the process sets
(``PYTHONINTMAXSTRDIGITS=0`` lifts Python's)."""


def _int_what() -> str:
    return f"holds an integer of more than {INT_DIGITS} digits, which JSON readers read differently"


def _int(text: str) -> int:
    if len(text) > INT_DIGITS and len(text.lstrip("-")) > INT_DIGITS:
        raise NotJsonNumber("an integer", _int_what())
    try:
        return int(text)
    except ValueError:  # a process bound below ours: not read, never taken for "no JSON"
        raise NotJsonNumber("an integer", "holds an integer longer than Python reads") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _Duplicate
    return obj


def loads(text: str, root: str | None = "", *, finite: bool = True) -> Any:
    """``json.loads(text)``, strictly (the module docstring); a duplicate's path starts at
    ``root``.  ``finite`` False reads ``1e400`` as infinity, as Python does: a caller's action,
    whose fields refuse a non-finite number each at its own path (``INVALID_FIELD`` at
    ``body``, ``timeout``, ``headers.X``), which a refusal of the whole text would not name.
    The path is found by a second parse, only once a duplicate is known: the common case pays
    one length check per object.  ``root`` None: no path (``DuplicateField.path`` empty) and no
    second parse -- for a reader that only needs to know the body is unreadable
    (tests/benchmarks/strict_bodies.py: a 4.9 MB body with a duplicate 0.066 s, 0.190 s with
    its path)."""
    try:
        return json.loads(
            text,
            object_pairs_hook=_unique_keys,
            parse_constant=_no_constant,
            parse_float=_finite if finite else None,
            # Python's own bound, when it is ours, costs nothing (a hook per integer: 15%).
            parse_int=None if sys.get_int_max_str_digits() == INT_DIGITS else _int,
        )
    except _Duplicate:
        # The path costs a second parse (3x the first: a hook per object): only when asked.
        raise DuplicateField("" if root is None else _duplicate_path(text, root)) from None
    except (json.JSONDecodeError, NotJsonNumber):
        raise
    except ValueError:  # int() of a number longer than Python converts: INT_DIGITS
        raise NotJsonNumber("an integer", _int_what()) from None


def loads_bytes(body: bytes, root: str | None = "") -> Any:
    """``loads`` of ``body`` decoded as ``json.loads`` decodes bytes (UTF-8, -16 or -32, a UTF-8
    BOM skipped); ``NotText`` when it holds
    bytes that are no text in that encoding and is JSON apart from them -- else its fault."""
    encoding = json.detect_encoding(body)
    try:
        # Strictly: an encoded lone surrogate (b"\xed\xa0\x80") is no text either -- json.loads
        # passes it, another reader replaces or refuses it.
        text = body.decode(encoding)
    except UnicodeDecodeError:
        _shallow(loads, body.decode(encoding, "surrogateescape"), root)  # no JSON: its fault
        raise NotText() from None
    return _shallow(loads, text, root)


def _shallow(read: Callable[[str, str | None], Any], text: str, root: str | None) -> Any:
    """``read(text, root)``, unless ``text`` nests deeper than ``BODY_DEPTH`` (``TooDeep``),
    wherever on the call stack it is read.  The value read is measured (an iterative walk over
    its containers: 0.01 s over 100,000 results, where ``prescan`` of the text took 0.3 s); the
    text only when the parser gave up -- it may have given up on a shallower text for want of
    stack, and then the parser's ``RecursionError`` stands."""
    try:
        doc = read(text, root)
    except TooDeep:
        raise
    except RecursionError:
        try:
            prescan(text, BODY_DEPTH, sys.maxsize)
        except TooLarge:
            raise TooDeep() from None
        raise
    if isinstance(doc, dict | list) and _deeper(doc, BODY_DEPTH):
        raise TooDeep()
    return doc


def _deeper(doc: Any, limit: int) -> bool:
    """Whether ``doc`` holds containers more than ``limit`` levels deep (``doc`` is level 1),
    level by level."""
    level, frontier = 1, [doc]
    while frontier:
        if level > limit:
            return True
        below = []
        for c in frontier:
            for v in c.values() if type(c) is dict else c:
                if type(v) is dict or type(v) is list:
                    below.append(v)
        level, frontier = level + 1, below
    return False


class _Dup:
    """``_duplicate_path``'s marker: where, below the object being built, a name repeats."""

    __slots__ = ("path",)

    def __init__(self, path: str) -> None:
        self.path = path


def _duplicate_path(text: str, root: str) -> str:
    """The path of the first field named twice (``action.headers.X``, ``action.list[2].k``).
    A name that is not short visible ASCII ends the path at its object (a name is never echoed
    whole)."""

    def step(key: str) -> str | None:
        return f".{key}" if _VISIBLE.fullmatch(key) and len(key) <= 64 else None

    def found(value: Any) -> str | None:
        if isinstance(value, _Dup):
            return value.path
        if isinstance(value, list):
            for i, item in enumerate(value):
                inner = found(item)
                if inner is not None:
                    return f"[{i}]{inner}"
        return None

    def hook(pairs: list[tuple[str, Any]]) -> Any:
        seen: set[str] = set()
        for key, value in pairs:
            inner = found(value)
            if inner is not None:
                here = step(key)
                return _Dup(here + inner if here is not None else "")
            if key in seen:
                return _Dup(step(key) or "")
            seen.add(key)
        return dict(pairs)

    top = found(json.loads(text, object_pairs_hook=hook))
    return root + (top or "")


def compact_encoder(*, sort_keys: bool, allow_nan: bool) -> Callable[[Any], str]:
    """``json.dumps(value, sort_keys=..., separators=(",", ":"), ensure_ascii=False,
    allow_nan=...)``, byte for byte, without building a ``JSONEncoder`` per call: the C encoder
    is made once (the same call ``JSONEncoder.iterencode`` makes) -- about 4x faster on the
    journal's hot path (two encodings per appended row) and half the cost of fingerprinting a
    request, which every call does (issue 15)."""
    enc = json.JSONEncoder(
        sort_keys=sort_keys, separators=(",", ":"), ensure_ascii=False, allow_nan=allow_nan
    )
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # no C accelerator: the plain encoder, same output
        return enc.encode
    # markers=None: no circular-reference bookkeeping (a cycle raises RecursionError instead of
    # ValueError; callers treat both as "not JSON").
    c_encode = make(None, enc.default, json.encoder.encode_basestring, None, ":", ",",
                    sort_keys, False, allow_nan)  # fmt: skip

    def encode(value: Any) -> str:
        return "".join(c_encode(value, 0))

    return encode


class TooLarge(ValueError):
    """JSON text nested too deep or holding too many values (``prescan``), before any parse."""

    def __init__(self, what: str, deep: bool, at: int) -> None:
        super().__init__(what)
        self.what = what
        self.deep = deep
        """Refused for its nesting (else for its count of values)."""
        self.at = at
        """Where in the text the bound was passed."""


# One token of JSON text after what lies between tokens (JSON's whitespace, commas, colons --
# skipped uncounted): the opening quote of a string, an opening or a closing bracket, or a run
# of anything else (a number, true/false/null -- or junk, which the parser then refuses).  Each
# is matched where the last ended, the gap by one run of a character set: searching for a token
# with a negated set among the alternatives took 0.9 s over 16 MB of commas.
_TOKEN = re.compile(
    r"[ \t\n\r,:]*+"
    r'(?:(?P<string>")|(?P<open>[\[{])|(?P<close>[\]}])|(?P<scalar>[^ \t\n\r,:\[\]{}"]++))'
)
_STRING_BODY = re.compile(r'(?:[^"\\]++|\\.)*+', re.DOTALL)
_NAME_END = re.compile(r"[ \t\n\r]*+:")
SCAN_CHUNK = 1 << 20
"""Characters of a string ``prescan`` skips in one call of the regex engine, which holds the
GIL throughout: 16 MB of escapes (0.3 s) is scanned in steps of about 20 ms, so a worker thread
scanning it lets the event loop run between them."""


def _string_end(text: str, pos: int) -> int:
    """Just after the closing quote of the string whose body starts at ``pos``, or the end."""
    end = len(text)
    while True:
        at = pos
        skipped = _STRING_BODY.match(text, pos, pos + SCAN_CHUNK)  # None never: ``*+``
        pos = at if skipped is None else skipped.end()
        if pos >= end or text[pos] == '"' or pos == at:
            return pos + 1


def prescan(text: str, max_depth: int, max_nodes: int, pos: int = 0) -> None:
    """Refuse (``TooLarge``) the JSON value starting at ``pos`` when nested deeper than
    ``max_depth`` or holding more than ``max_nodes`` values, before a parser has built anything
    (or recursed: Python's ends in a RecursionError past ~1000 levels).  Values are counted as
    ``actions.check_shape`` counts them: one per opening bracket, string that is no field name,
    and scalar outside strings; nothing is kept of a token.

    It stops, leaving the text to the parser (which then refuses it, at its own line and
    column), at the end of that value or the first token no JSON text has there: a closing
    bracket with none open, a second value after the whole first one, more field names than
    values before them.  The parser then fails at or before that token, so it never builds more
    than was counted; and the loop takes at most about ``3 * max_nodes`` tokens whatever the
    text (each adds a value or a name, or closes a bracket a value opened), plus one step per
    ``SCAN_CHUNK`` of a string: 16 MB of ``[][]...`` was 8M tokens before (3.5 s on the daemon's
    event loop)."""
    depth = values = names = 0
    while (m := _TOKEN.match(text, pos)) is not None:
        kind, pos = m.lastgroup, m.end()
        if kind == "close":
            depth -= 1
            if depth < 0:
                return
            continue
        if depth == 0 and values:
            return
        if kind == "string":
            pos = _string_end(text, pos)
            if _NAME_END.match(text, pos) is not None:
                names += 1
                if names > values:
                    return
                continue
        values += 1
        if values > max_nodes:
            raise TooLarge(f"holds more than {max_nodes} values", deep=False, at=pos)
        if kind == "open":
            depth += 1
            if depth > max_depth:
                raise TooLarge(f"nests deeper than {max_depth} levels", deep=True, at=pos)


MEMBER_STRINGS = 50_000
"""Strings ``members`` steps over at most (about 50 ms): a message's own members come first in
every client seen; ``members`` says when it stopped there (``Members.end`` ``cut``)."""

MEMBER_NAME = 256
"""Characters of a member's name (as JSON) ``members`` decodes at most: JSON-RPC's own are
short, even escaped; a longer one is no name read (None)."""

_SPACE = re.compile(r"[ \t\n\r]*+")
_VALUE_AT = re.compile(r"[ \t\n\r]*+:[ \t\n\r]*+")


class Members(NamedTuple):
    """What ``members`` read: the members, and how the reading ended."""

    found: list[tuple[str | None, int]]
    """(the name, or None when it is no valid JSON string or longer than ``MEMBER_NAME``
    characters; where its value starts), in order."""
    end: str
    """``closed``: the object ended, nothing but whitespace after it; ``more``: something
    follows its end (a second value), or it never ends -- no JSON text; ``cut``: stopped after
    ``MEMBER_STRINGS`` strings, members may be unread; ``none``: ``text`` is no object."""


def _balanced(levels: int) -> str:
    """A bracketed group nested at most ``levels`` deep holding no string (brackets' kinds
    unmatched: only depth counts), as a regex; possessive, so a failed try never backtracks."""
    inner = r"[^\[\]{}]"
    group = rf"[\[{{]{inner}*+[\]}}]"
    for _ in range(levels - 1):
        group = rf"[\[{{](?:{inner}++|{group})*+[\]}}]"
    return group


# A stretch ``_closing`` takes in one step: groups that close all they open (with what lies
# between them: no change of depth, whatever the depth), else a run of opening or of closing
# brackets.  Per bracket, 16 MiB of ``[[[...]]]`` took 3.1 s, of ``[[],[],...]`` 1.8 s.
# The innermost pair is tried first: ``[[],[],...]`` in half the time.
_EVEN = rf"(?:{_balanced(1)}|{_balanced(4)})"
_RUN = re.compile(rf"(?P<even>{_EVEN}(?:[^\[\]{{}}]*+{_EVEN})*+)|(?P<open>[\[{{]+)|[\]}}]+")


def _closing(text: str, pos: int, end: int, depth: int) -> int | None:
    """Just after the bracket in ``text[pos:end]`` (no string there) that brings ``depth`` to 0,
    or None when none does.  Read by runs (``_RUN``) in windows of ``SCAN_CHUNK`` characters, so
    that a worker thread reading it lets the event loop run between them; a stretch a window's
    edge cuts is read in two, which comes to the same depth."""
    for start in range(pos, end, SCAN_CHUNK):
        for m in _RUN.finditer(text, start, min(end, start + SCAN_CHUNK)):
            if m.lastgroup == "even":
                continue
            run = m.end() - m.start()
            if m.lastgroup == "open":
                depth += run
            elif run >= depth:
                return m.start() + depth
            else:
                depth -= run
    return None


def members(text: str, pos: int = 0, until: int | None = None) -> Members:
    """The members of the JSON object ``text`` holds, read without parsing their values -- what
    reads a message's ``id`` when the whole would overflow a parser.  Nesting between strings is
    counted by ``str.count`` (100,000 levels in about a millisecond), strings are stepped over
    one by one, at most ``MEMBER_STRINGS`` of them.  Stops at the first bracket that closes the
    object: a member after it belongs to no object of ``text`` (``end`` ``more``).  ``pos``:
    where the object starts (a member's value: ``end`` is then ``more``, ``text`` goes on).
    ``until``: no member whose name starts after it is read (``end`` ``cut`` if the object is
    still open there)."""
    first = _TOKEN.match(text, pos)
    if first is None or first.lastgroup != "open" or text[first.end() - 1] != "{":
        return Members([], "none")
    stop = len(text) if until is None else until
    found: list[tuple[str | None, int]] = []
    depth, pos = 1, first.end()
    for _ in range(MEMBER_STRINGS):
        quote = text.find('"', pos, stop)
        end = stop if quote < 0 else quote  # no string between: every bracket counts
        closes = text.count("]", pos, end) + text.count("}", pos, end)
        if closes >= depth and (closed := _closing(text, pos, end, depth)) is not None:
            whole = _SPACE.match(text, closed).end() == len(text)  # type: ignore[union-attr]
            return Members(found, "closed" if whole else "more")
        depth += text.count("[", pos, end) + text.count("{", pos, end) - closes
        if quote < 0:
            return Members(found, "more" if until is None else "cut")  # never closed
        pos = _string_end(text, quote + 1)
        if depth == 1 and (value_at := _VALUE_AT.match(text, pos)) is not None:
            try:  # a long one would be decoded in one call, holding the GIL: 0.12 s
                name = json.loads(text[quote:pos]) if pos - quote <= MEMBER_NAME else None
            except ValueError:
                name = None
            found.append((name if isinstance(name, str) else None, value_at.end()))
    return Members(found, "cut")
