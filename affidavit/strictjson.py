"""JSON read strictly: what Python's parser takes but JSON's readers disagree on is refused --
and written compactly (``compact_encoder``: the journal's chain and the config's fingerprints).

A field named twice in one object (Python keeps the last; a policy proxy reading the first
sees another action than the broker performs) and ``NaN``/``Infinity``/``-Infinity`` (no JSON
number, RFC 8259: another reader refuses them or reads them otherwise).  ``loads`` raises
``DuplicateField`` with the field's path, or ``NotJsonNumber``; any other fault is the parser's
``ValueError``.  The action parser (``affidavit.protocols.actions.strict_json``) and the MCP
proxy's transport read with it.  A leaf importing only ``json`` and ``re``: the MCP proxy and
the thin clients load no broker code (tests/mcp/test_modes.py).
"""

from __future__ import annotations

import json
import json.encoder
import re
from collections.abc import Callable
from typing import Any

__all__ = ["DuplicateField", "NotJsonNumber", "compact_encoder", "loads"]

_VISIBLE = re.compile(r"[\x21-\x7e]+")


class DuplicateField(ValueError):
    """An object names a field twice; ``path`` is where (``action.headers.X``)."""

    what = "is given twice in one object (each field once)"

    def __init__(self, path: str) -> None:
        super().__init__(f"{path}: {self.what}")
        self.path = path


class NotJsonNumber(ValueError):
    """``NaN``, ``Infinity`` or ``-Infinity`` (``name``)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.what = f"holds {name}, which is not a JSON number"
        super().__init__(self.what)


class _Duplicate(Exception):
    pass


def _no_constant(name: str) -> Any:
    raise NotJsonNumber(name)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _Duplicate
    return obj


def loads(text: str, root: str = "") -> Any:
    """``json.loads(text)``, strictly (the module docstring); a duplicate's path starts at
    ``root``.  The path is found by a second parse, only once a duplicate is known: the common
    case pays one length check per object."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except _Duplicate:
        raise DuplicateField(_duplicate_path(text, root)) from None


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
