"""Schema, canonical row bytes and the hash chain (``verify.py`` walks it).

Seed, "Audit integrity and outcome evidence solve different problems": a hash chain confirms that
recorded events were not altered later.  Each row's hash is

    SHA-256(prev_hash_bytes || canonical_row_bytes)        (genesis prev_hash: 64 zeros)

where the canonical bytes cover every column except ``hash`` and ``prev_hash`` (which is the
prefix).  Sealed blobs enter as their SHA-256, so the chain covers them without the key and
checking the chain needs no key at all.

The schema makes a fork or a gap impossible: ``seq`` is the primary key and a trigger refuses any
insert that does not extend the chain by exactly one (``seq`` = last + 1 and ``prev_hash`` = the
last row's ``hash``), so two rows can never share a ``prev_hash``.  Neither hash column has an
index: a random-keyed index costs one more WAL page per row at each fsync, which made a 64-row
group commit write ~130 pages instead of ~70 (``tests/benchmarks/journal_append.py``).  Journals
created before that keep their (redundant) ``UNIQUE`` on ``prev_hash``; rows are identical.
Update and delete triggers make the table append-only for anyone using the journal normally;
someone editing the file directly can drop them and re-chain: the signed ``checkpoints``
(``signing.py``) and ``verify.py`` are for that.  ``result_audit`` holds the result copies sealed
to the auditor's key (schema 2; a schema-1 journal gains both tables when a writer opens it).
"""

from __future__ import annotations

import hashlib
import json
import json.encoder
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["GENESIS", "SCHEMA", "canonical_json", "row_digest", "row_hash"]

GENESIS = "0" * 64
SCHEMA_VERSION = 2

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (
  name  TEXT PRIMARY KEY,
  value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
  seq           INTEGER PRIMARY KEY CHECK (seq >= 1),
  at            REAL NOT NULL,
  invocation_id TEXT NOT NULL,
  session_id    TEXT,
  kind          TEXT NOT NULL,
  source        TEXT NOT NULL,
  observer      TEXT,
  observer_seq  INTEGER,
  attrs         TEXT NOT NULL,
  payload       BLOB,
  audit         BLOB,
  prev_hash     TEXT NOT NULL,
  hash          TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_invocation ON events (invocation_id, seq);
CREATE TRIGGER IF NOT EXISTS events_extend_chain BEFORE INSERT ON events
WHEN NEW.seq IS NOT (SELECT coalesce(max(seq), 0) + 1 FROM events)
  OR NEW.prev_hash IS NOT coalesce((SELECT hash FROM events WHERE seq = NEW.seq - 1),
                                   '{GENESIS}')
BEGIN SELECT RAISE(ABORT, 'journal rows must extend the hash chain by one'); END;
CREATE TRIGGER IF NOT EXISTS events_no_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'journal events are append-only'); END;
CREATE TRIGGER IF NOT EXISTS events_no_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'journal events are append-only'); END;
CREATE TABLE IF NOT EXISTS result_chunks (
  invocation_id TEXT NOT NULL,
  stream        TEXT NOT NULL,
  idx           INTEGER NOT NULL CHECK (idx >= 0),
  data          BLOB NOT NULL,
  PRIMARY KEY (invocation_id, stream, idx)
);
CREATE TABLE IF NOT EXISTS results (
  invocation_id TEXT PRIMARY KEY,
  seq           INTEGER NOT NULL UNIQUE REFERENCES events (seq),
  sha256        TEXT NOT NULL,
  streams       TEXT NOT NULL,
  summary       BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS result_audit (
  invocation_id TEXT NOT NULL,
  stream        TEXT NOT NULL,
  idx           INTEGER NOT NULL CHECK (idx >= 0),
  data          BLOB NOT NULL,
  PRIMARY KEY (invocation_id, stream, idx)
);
CREATE TABLE IF NOT EXISTS checkpoints (
  seq           INTEGER PRIMARY KEY CHECK (seq >= 1),
  hash          TEXT NOT NULL,
  prev          INTEGER NOT NULL,
  at            REAL NOT NULL,
  adopted       INTEGER NOT NULL,
  key_id        TEXT NOT NULL,
  signature     BLOB NOT NULL
);
CREATE TRIGGER IF NOT EXISTS checkpoints_no_update BEFORE UPDATE ON checkpoints
BEGIN SELECT RAISE(ABORT, 'journal checkpoints are append-only'); END;
CREATE TRIGGER IF NOT EXISTS checkpoints_no_delete BEFORE DELETE ON checkpoints
BEGIN SELECT RAISE(ABORT, 'journal checkpoints are append-only'); END;
CREATE TABLE IF NOT EXISTS leases (
  invocation_id TEXT PRIMARY KEY,
  holder        TEXT NOT NULL,
  generation    INTEGER NOT NULL,
  expires_at    REAL NOT NULL,
  seq           INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS idempotency (
  scope         TEXT NOT NULL,
  key           TEXT NOT NULL,
  fingerprint   TEXT NOT NULL,
  invocation_id TEXT NOT NULL,
  expires_at    REAL,
  created_at    REAL NOT NULL,
  PRIMARY KEY (scope, key)
);
"""

EVENT_COLUMNS = (
    "seq, at, invocation_id, session_id, kind, source, observer, observer_seq, attrs, "
    "payload, audit, prev_hash, hash"
)


def _compact_encoder(*, sort_keys: bool, allow_nan: bool) -> Callable[[Any], str]:
    """``json.dumps(value, sort_keys=..., separators=(",", ":"), ensure_ascii=False,
    allow_nan=...)``, byte for byte, without building a ``JSONEncoder`` per call: the C encoder
    is made once (the same call ``JSONEncoder.iterencode`` makes), about 4x faster on the
    journal's hot path (two encodings per appended row)."""
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


canonical_json: Callable[[Mapping[str, Any] | Any], str] = _compact_encoder(
    sort_keys=True, allow_nan=False
)
"""Sorted keys, no whitespace, no NaN: one byte string per value."""

_encode_row = _compact_encoder(sort_keys=False, allow_nan=True)


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
    head's digest, so it never parses hex on the hot path)."""
    canonical = _encode_row(
        [
            seq,
            at,
            invocation_id,
            session_id,
            kind,
            source,
            observer,
            observer_seq,
            attrs,
            None if payload is None else hashlib.sha256(payload).hexdigest(),
            None if audit is None else hashlib.sha256(audit).hexdigest(),
        ]
    ).encode("utf-8")
    return hashlib.sha256(prev + canonical).digest()


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
