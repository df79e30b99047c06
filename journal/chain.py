"""Canonical row bytes and the hash chain (``verify.py`` walks it).

Seed, "Audit integrity and outcome evidence solve different problems": a hash chain confirms that
recorded events were not altered later.  Each row's hash is

    SHA-256(prev_hash_bytes || canonical_row_bytes)        (genesis prev_hash: 64 zeros)

where the canonical bytes cover every column except ``hash`` and ``prev_hash`` (which is the
prefix).  Sealed blobs enter as their SHA-256, so the chain covers them without the key and
checking the chain needs no key at all.

Each backend's schema (``sqlite_schema.py``, ``postgres.py``) makes a fork or a gap impossible
-- ``seq`` is the primary key and a trigger refuses a row that does not extend the chain by
exactly one -- and refuses updates and deletes of rows and checkpoints.  ``EVENT_COLUMNS`` is
the column order every backend stores and ``verify`` reads; nothing here knows a database.
"""

from __future__ import annotations

import hashlib
import json
import json.encoder
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from affidavit.strictjson import compact_encoder

__all__ = [
    "EVENT_COLUMNS",
    "GENESIS",
    "canonical_json",
    "check_row",
    "compact_json",
    "json_string",
    "row_digest",
    "row_hash",
]

GENESIS = "0" * 64
EVENT_COLUMNS = (
    "seq, at, invocation_id, session_id, kind, source, observer, observer_seq, attrs, "
    "payload, audit, prev_hash, hash"
)


canonical_json: Callable[[Mapping[str, Any] | Any], str] = compact_encoder(
    sort_keys=True, allow_nan=False
)
"""Sorted keys, no whitespace, no NaN: one byte string per value."""

compact_json: Callable[[Any], str] = compact_encoder(sort_keys=False, allow_nan=True)
"""``json.dumps(value, separators=(",", ":"), ensure_ascii=False)``: keys in their order."""

_encode_row = compact_json
json_string: Callable[[str], str] = json.encoder.encode_basestring
_string = json_string
"""What ``compact_json`` writes for a ``str`` (``ensure_ascii=False``): the C function its encoder
calls for each string."""
_sha256 = hashlib.sha256


def row_digest(
    prev: bytes,
    seq: int,
    at: float,
    invocation_id: str,
    session_id: str | None,
    kind: str,
    source: str,
    observer: str | None,
    observer_seq: int | None,
    attrs: str,
    payload: bytes | None,
    audit: bytes | None,
) -> bytes:
    """The row's hash as 32 bytes, given the previous row's as 32 bytes (the writer keeps the
    head's digest, so it never parses hex on the hot path).

    The canonical bytes are ``compact_json`` of the row's columns as a list.  For the column
    types the writer stores (exact ``int``, finite ``float``, ``str``, None) they are written
    here directly, each as that encoder writes it -- ``int.__repr__``, ``float.__repr__``, the
    C string encoder -- about 1 us less per row than encoding the list (issue 15: once per row
    in the single writer, and again per row by ``verify``).  Anything else (a column someone
    altered: a bool, a NaN, a str subclass...) takes ``compact_json`` itself, so the bytes are
    the encoder's in every case (tests/journal/test_chain.py)."""
    p = None if payload is None else _sha256(payload).hexdigest()
    a = None if audit is None else _sha256(audit).hexdigest()
    if (
        type(seq) is int
        and type(at) is float
        and at - at == 0.0  # finite: compact_json writes NaN and Infinity by name
        and type(invocation_id) is str
        and type(kind) is str
        and type(source) is str
        and type(attrs) is str
        and (session_id is None or type(session_id) is str)
        and (observer is None or type(observer) is str)
        and (observer_seq is None or type(observer_seq) is int)
    ):
        canonical = (
            f"[{seq},{at!r},{_string(invocation_id)},"
            f"{'null' if session_id is None else _string(session_id)},"
            f"{_string(kind)},{_string(source)},"
            f"{'null' if observer is None else _string(observer)},"
            f"{'null' if observer_seq is None else observer_seq},{_string(attrs)},"
            f"{'null' if p is None else _string(p)},{'null' if a is None else _string(a)}]"
        )
    else:
        canonical = _encode_row(
            [seq, at, invocation_id, session_id, kind, source, observer, observer_seq, attrs, p, a]
        )
    return _sha256(prev + canonical.encode("utf-8")).digest()


def _prev_bytes(prev_hash: str) -> bytes:
    try:
        return bytes.fromhex(prev_hash)
    except (TypeError, ValueError):
        return str(prev_hash).encode("utf-8", "surrogatepass")


def row_hash(
    prev_hash: str,
    seq: int,
    at: float,
    invocation_id: str,
    session_id: str | None,
    kind: str,
    source: str,
    observer: str | None,
    observer_seq: int | None,
    attrs: str,
    payload: bytes | None,
    audit: bytes | None,
) -> str:
    return row_digest(
        _prev_bytes(prev_hash),
        seq,
        at,
        invocation_id,
        session_id,
        kind,
        source,
        observer,
        observer_seq,
        attrs,
        payload,
        audit,
    ).hex()


def check_row(
    row: Sequence[Any], seq: int, prev_hash: str, prev_digest: bytes | None = None
) -> tuple[bytes | None, str | None]:
    """The one rule for a stored row (``chain.EVENT_COLUMNS``), which ``verify`` walks and every
    read that proves a row (``checkpoints.cover``) applies: it is the row at ``seq``, it
    links to ``prev_hash`` (the previous row's hash), and its hash is recomputed from its
    columns -- the sealed payload and the auditor copy by their SHA-256.  ``(digest, None)``
    when it holds (``prev_digest``: ``prev_hash`` as bytes, if the caller has it), else
    ``(None, why)``."""
    if row[0] != seq:
        return None, f"row {seq} is missing"
    if row[11] != prev_hash:
        return None, f"row {seq} does not link to row {seq - 1}"
    prev = prev_digest if prev_digest is not None else _prev_bytes(prev_hash)
    try:
        digest = row_digest(prev, *row[:11])
    except (TypeError, ValueError, RecursionError):  # columns not as the broker writes them
        return None, f"row {seq} was altered"
    if digest.hex() != row[12]:
        return None, f"row {seq} was altered"
    return digest, None
