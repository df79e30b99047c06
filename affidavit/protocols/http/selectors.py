"""Where a value sits in an HTTP message: ``json:/pointer`` (RFC 6901, into a JSON body) or
``header:Name`` -- the language of the ``operations`` and ``batch`` settings.

A malformed selector is a ``ConfigError`` naming the setting (``targets.jobs.operations.id``):
an operation whose job id is read from the wrong place would be tracked on a guess.

Bodies are read strictly (``affidavit.strictjson``): every value read here decides something --
a batch item's outcome, a reconciliation verdict, a job's id or state -- and a body holding a
field twice (``{"status": 200, "status": 400}``: Python keeps the last, other readers the
first), ``NaN``, ``1e400`` (infinity to Python), an integer of more than 4300 digits or invalid
UTF-8 inside a string says different things to different readers, or nothing to Python's.
Such a body is ``UNREADABLE``: no selector finds anything in it, and whoever would decide from
it decides nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from affidavit.schema import Read
from affidavit.strictjson import DuplicateField, NotJsonNumber, NotText, loads_bytes

__all__ = [
    "ABSENT",
    "UNREADABLE",
    "Selector",
    "json_body",
    "parse_selector",
    "pointer",
    "scalar",
    "select",
    "selector_field",
]

ABSENT: Final[Any] = object()
"""What a selector finds where the message has no such value."""

UNREADABLE: Final[Any] = object()
"""``json_body`` of JSON that readers disagree on (a field named twice, ``NaN``, a number or
bytes Python's parser does not read as others do, nesting it gives up on): no selector finds
anything in it (the module docstring)."""

_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 §5.1 token

MAX_SCALAR = 256
"""Longest text kept from a selected value (a job id, a status): it lands in journal attrs."""


@dataclass(frozen=True)
class Selector:
    source: str
    """``json`` or ``header``"""
    path: str
    """An RFC 6901 JSON pointer, or a header name"""

    def __str__(self) -> str:
        return f"{self.source}:{self.path}"


def pointer(text: str) -> tuple[str, ...]:
    """The reference tokens of an RFC 6901 JSON pointer; ``ValueError`` if it is malformed."""
    if text == "":
        return ()
    if not text.startswith("/"):
        raise ValueError('a JSON pointer is "" or starts with "/"')
    tokens = text[1:].split("/")
    out = []
    for token in tokens:
        # RFC 6901 §3: "~" only as "~0" (for "~") or "~1" (for "/").
        rest = token.replace("~0", "").replace("~1", "")
        if "~" in rest:
            raise ValueError('"~" must be followed by 0 or 1 in a JSON pointer')
        out.append(token.replace("~1", "/").replace("~0", "~"))
    return tuple(out)


def parse_selector(text: str, sources: Iterable[str]) -> Selector:
    allowed = tuple(sources)
    source, colon, path = text.partition(":")
    if not colon or source not in allowed:
        forms = " or ".join(f"{s}:{'/POINTER' if s == 'json' else 'NAME'}" for s in allowed)
        raise ValueError(f"must be {forms}")
    if source == "json":
        pointer(path)
    elif not _HEADER_NAME.fullmatch(path):
        raise ValueError("is not an HTTP header name")
    return Selector(source, path)


def selector_field(*sources: str) -> Any:
    """A ``Field`` parser for a selector setting restricted to ``sources``."""

    def parse(r: Read) -> Selector | None:
        raw = r.string(max_len=1024)
        if raw is None:
            return None
        try:
            return parse_selector(raw, sources)
        except ValueError as exc:
            raise r.error(str(exc)) from None

    return parse


def json_body(body: bytes | None) -> Any:
    """The body as JSON read strictly; ``ABSENT`` when there is none or it is no JSON text,
    ``UNREADABLE`` when it is JSON that readers disagree on (the module docstring)."""
    if not body:
        return ABSENT
    try:
        return loads_bytes(body, None)  # no duplicate's path: nobody is told it
    except (DuplicateField, NotJsonNumber, NotText, RecursionError):
        return UNREADABLE
    except ValueError:  # no JSON text
        return ABSENT


def resolve(doc: Any, tokens: tuple[str, ...]) -> Any:
    """RFC 6901 evaluation; ``ABSENT`` where the document has no such value."""
    for token in tokens:
        if isinstance(doc, Mapping):
            if token not in doc:
                return ABSENT
            doc = doc[token]
        elif isinstance(doc, list):
            # An array index: "0" or digits without a leading zero (RFC 6901 §4).
            if not token.isdigit() or (len(token) > 1 and token[0] == "0"):
                return ABSENT
            i = int(token)
            if i >= len(doc):
                return ABSENT
            doc = doc[i]
        else:
            return ABSENT
    return doc


def select(sel: Selector, headers: Iterable[Any], doc: Any) -> Any:
    """The selected value: all values of a header joined with ", " (RFC 9110 §5.3), or the
    pointer's value in ``doc`` (already parsed with ``json_body``)."""
    if sel.source == "header":
        name = sel.path.lower()
        values = [str(v) for n, v in headers if str(n).lower() == name]
        return ", ".join(values) if values else ABSENT
    if doc is ABSENT or doc is UNREADABLE:
        return ABSENT
    return resolve(doc, pointer(sel.path))


def scalar(value: Any) -> str | int | None:
    """A selected value fit for the journal: a string (at most ``MAX_SCALAR`` characters) or an
    integer; None for anything else (absent, null, a boolean, an object, a list, a float)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value:
        return value[:MAX_SCALAR]
    return None
