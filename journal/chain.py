"""Schema, canonical row bytes and the hash chain.

Seed, "Audit integrity and outcome evidence solve different problems": a hash chain confirms that
recorded events were not altered later.  Each row's hash is

    SHA-256(prev_hash_bytes || canonical_row_bytes)        (genesis prev_hash: 64 zeros)

where the canonical bytes cover every column except ``hash`` and ``prev_hash`` (which is the
prefix).  Sealed blobs enter as their SHA-256, so the chain covers them without the key and
``verify`` needs no key at all.

The schema makes a fork or a gap impossible: ``seq`` is the primary key, ``prev_hash`` is unique,
and a trigger refuses any insert that does not extend the chain by exactly one (so ``hash`` needs
no index of its own: every random-keyed index costs one more WAL page per row at each fsync).
Update and delete triggers make the table append-only for anyone using the journal normally;
someone editing the file directly can drop them, which is what ``verify`` is for.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterable, Mapping
from typing import Any

from .errors import VerifyReport

__all__ = ["GENESIS", "SCHEMA", "canonical_json", "row_hash", "verify_rows"]

GENESIS = "0" * 64
SCHEMA_VERSION = 1

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
  prev_hash     TEXT NOT NULL UNIQUE,
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


def canonical_json(value: Mapping[str, Any] | Any) -> str:
    """Sorted keys, no whitespace, no NaN: one byte string per value."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def _blob_digest(blob: bytes | None) -> str | None:
    return None if blob is None else hashlib.sha256(blob).hexdigest()


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
    canonical = json.dumps(
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
            _blob_digest(payload),
            _blob_digest(audit),
        ],
        separators=(",", ":"),
        ensure_ascii=False,
    ).encode("utf-8")
    try:
        prev = bytes.fromhex(prev_hash)
    except (TypeError, ValueError):
        prev = str(prev_hash).encode("utf-8", "surrogatepass")
    return hashlib.sha256(prev + canonical).hexdigest()


def verify_rows(rows: Iterable[tuple[Any, ...]]) -> VerifyReport:
    """Recompute the chain over rows in ``seq`` order (columns as ``EVENT_COLUMNS``)."""
    expected = 1
    prev = GENESIS
    count = 0
    for row in rows:
        seq = row[0]
        stored_prev, stored_hash = row[11], row[12]
        if seq != expected:
            # A deleted row (or a truncated middle) shows up as the first missing seq.
            return VerifyReport(False, count, expected, f"row {expected} is missing", prev)
        if stored_prev != prev:
            return VerifyReport(
                False, count, seq, f"row {seq} does not link to row {seq - 1}", prev
            )
        try:
            computed = row_hash(prev, *row[:11])
        except (TypeError, ValueError):
            computed = None
        if computed != stored_hash:
            return VerifyReport(False, count, seq, f"row {seq} was altered", prev)
        prev = stored_hash
        count += 1
        expected += 1
    return VerifyReport(True, count, None, "intact", prev)


def verify_connection(conn: sqlite3.Connection) -> VerifyReport:
    cur = conn.execute(f"SELECT {EVENT_COLUMNS} FROM events ORDER BY seq")
    try:
        return verify_rows(cur)
    finally:
        cur.close()
