"""The SQLite journal's schema, and what a writer opening an older file does to it.

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
``invocations`` (schema 3) names each invocation's first event, filled by a trigger on insert
(the writer's code is unchanged) so the actions view reads rows in order without a sort
(``SqliteTables.grouped_events``); a journal from before gains it, built from its events, when
a writer opens it.  It is an index, not evidence: the view checks it against the events first.
``result_segments`` (schema 4) holds a reference (segment file, position, size) for each chunk
of a long result stored beside the journal in ``<journal>.results/`` (``segments.py``); a
reader resolves them (``segment_tables.py``), so a chunk reads the same from a row or a
segment.  ``events_accepted_key`` (schema 5) indexes each ACTION_ACCEPTED that names an
idempotency key by that key (a partial expression index over ``attrs``), so a bind that finds no
binding row asks the chain whether the key was bound before (``bindings.py``); a writer opening
a journal from before builds it in its opening transaction.  It is an index, not evidence: the
query answers the same from the table when it is dropped or redefined.  ``chunk_owners`` (schema 6)
names each invocation with chunk rows stored and no marker yet (``tables.py``), so the reclaim
of an interrupted attempt's chunks (``reclaim.py``) reads that small table instead of scanning
every chunk row; a writer opening a journal from before fills it, once, by that scan.
``events_session`` indexes the events by ``(session_id, seq, invocation_id)`` for the session
views (a session's page and total read its rows, not the journal's); no schema version marks
it -- every broker's writes keep it and none relies on it -- and a writer opening a journal
without it builds it, logged (``_unbuilt``).  It holds only the events of a session
(``WHERE session_id IS NOT NULL``): every session query asks ``session_id = ?``, which SQLite
answers from the partial index with the same plans, while an event of no session (a CLI,
daemon or library call) wrote ~1.9 pages of it to the WAL at each commit for entries nothing
reads (issue 15, ``tests/benchmarks/wal_pages.py``).  A journal made before keeps the full
index it has (its rows and answers are the same).  Schema 7 indexes ``result_segments`` by segment
(``result_segments_segment``: a compaction reads a segment's rows, not the table) and marks the
journal as written only by brokers that lock their segment files: a broker from before refuses
it (``_refuse_newer``), and the ``meta`` row ``segment_locks`` records that none can still be
writing, which a compaction requires (``compact.py``, ``SqliteBackend.create``).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterable
from pathlib import Path

from .backend import refuse_newer_schema
from .chain import GENESIS
from .segment_tables import SEGMENT_SCHEMA

__all__ = ["EXTEND_CHAIN", "SCHEMA", "SCHEMA_VERSION", "SESSION_INDEX"]

log = logging.getLogger("affidavit.journal")

SESSION_INDEX = "events_session"
SCHEMA_VERSION = 7

EXTEND_CHAIN = f"""CREATE TRIGGER IF NOT EXISTS events_extend_chain BEFORE INSERT ON events
WHEN coalesce((SELECT NEW.seq IS NOT seq + 1 OR NEW.prev_hash IS NOT hash FROM events
               ORDER BY seq DESC LIMIT 1),
              NEW.seq IS NOT 1 OR NEW.prev_hash IS NOT '{GENESIS}')
BEGIN SELECT RAISE(ABORT, 'journal rows must extend the hash chain by one'); END;"""
"""The chain's insert trigger: one lookup of the last row (``seq`` is the rowid: a seek to the
table's end) answers both rules -- ``seq`` = its ``seq`` + 1 and ``prev_hash`` = its ``hash``,
or, on an empty table, ``seq`` 1 after ``GENESIS``.  Issue 15: the trigger runs once per row in
the single writer; it made two lookups before (``_EXTEND_CHAIN_BEFORE``), ~2.7k instructions a
row more (callgrind) for the same refusals."""

_EXTEND_CHAIN_BEFORE = f"""CREATE TRIGGER events_extend_chain BEFORE INSERT ON events
WHEN NEW.seq IS NOT (SELECT coalesce(max(seq), 0) + 1 FROM events)
  OR NEW.prev_hash IS NOT coalesce((SELECT hash FROM events WHERE seq = NEW.seq - 1),
                                   '{GENESIS}')
BEGIN SELECT RAISE(ABORT, 'journal rows must extend the hash chain by one'); END"""
"""The trigger as journals from before ``EXTEND_CHAIN`` hold it (``sqlite_master.sql``: SQLite
keeps the statement without ``IF NOT EXISTS`` and its ``;``); a writer opening one replaces it
(``_replace_chain_trigger``)."""

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
CREATE INDEX IF NOT EXISTS events_session ON events (session_id, seq, invocation_id)
  WHERE session_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS events_accepted_key ON events
  (json_extract(attrs, '$.operation.idempotency.key'))
  WHERE kind = 'ACTION_ACCEPTED' AND json_valid(attrs)
    AND json_extract(attrs, '$.operation.idempotency.key') IS NOT NULL;
{EXTEND_CHAIN}
CREATE TRIGGER IF NOT EXISTS events_no_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'journal events are append-only'); END;
CREATE TRIGGER IF NOT EXISTS events_no_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'journal events are append-only'); END;
CREATE TABLE IF NOT EXISTS invocations (
  first_seq     INTEGER PRIMARY KEY,
  invocation_id TEXT NOT NULL
);
CREATE TRIGGER IF NOT EXISTS events_first_of_invocation AFTER INSERT ON events
WHEN NOT EXISTS (SELECT 1 FROM events WHERE invocation_id = NEW.invocation_id AND seq < NEW.seq)
BEGIN INSERT INTO invocations (first_seq, invocation_id) VALUES (NEW.seq, NEW.invocation_id); END;
CREATE TABLE IF NOT EXISTS result_chunks (
  invocation_id TEXT NOT NULL,
  stream        TEXT NOT NULL,
  idx           INTEGER NOT NULL CHECK (idx >= 0),
  data          BLOB NOT NULL,
  PRIMARY KEY (invocation_id, stream, idx)
);
CREATE TABLE IF NOT EXISTS chunk_owners (
  invocation_id TEXT PRIMARY KEY
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
{SEGMENT_SCHEMA.strip()}
"""


def _unbuilt(conn: sqlite3.Connection, index: str, where: str) -> bool:
    """Whether the writer's opening transaction is about to build ``index`` over events the
    journal already has (a journal from before it): logged before and after, as the build
    reads every event once (~1-2 s per million) and start-up waits for it."""
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE name IN (?, ?)",
                                         (index, "events"))}  # fmt: skip
    if index in names or "events" not in names:
        return False
    events = conn.execute("SELECT max(seq) FROM events").fetchone()[0]
    if not events:
        return False
    log.info("journal %s: building index %s over %d events (once, before the writer opens)",
             where, index, events)  # fmt: skip
    return True


def _replace_chain_trigger(conn: sqlite3.Connection) -> None:
    """A journal from before ``EXTEND_CHAIN`` gets it, in the writer's opening transaction: the
    same refusals with one lookup per row.  Only that exact predecessor is replaced: a trigger
    someone else defined is left for ``verify`` and the signed checkpoints to judge."""
    row = conn.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = 'events_extend_chain'"
    ).fetchone()
    if row is not None and row[0] == _EXTEND_CHAIN_BEFORE:
        conn.execute("DROP TRIGGER events_extend_chain")
        conn.execute(EXTEND_CHAIN)


def _refuse_newer(conn: sqlite3.Connection, path: Path) -> None:
    """A journal a newer broker wrote (a schema this one does not know -- schema 4 moved long
    results' chunks into segment files, which a broker from before reads as missing) is neither
    written nor read here: what this broker would make of it is not what it holds."""
    try:
        row = conn.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone()
    except sqlite3.Error:  # a new file, or one from before the meta table
        return
    refuse_newer_schema(None if row is None else row[0], SCHEMA_VERSION, str(path))


def _split_sql(script: str) -> Iterable[str]:
    """Split the schema into statements (``sqlite3.complete_statement`` respects triggers)."""
    buf = ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            stmt = buf.strip()
            if stmt:
                yield stmt
            buf = ""
