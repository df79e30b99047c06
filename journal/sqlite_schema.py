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
writing, which a compaction requires (``compact.py``, ``SqliteBackend.create``).  Schema 8
fills ``invocations`` from the chain's own trigger (``EXTEND_CHAIN``: one trigger program a row
instead of two, and the first-of-invocation probe only for ``ACTION_ACCEPTED`` rows -- issue
15) and drops ``events_first_of_invocation``; a writer opening a journal from before replaces
its two triggers in its opening transaction (``_replace_chain_trigger``).  A broker of schema 7
refuses it: it would make its AFTER trigger again beside this one, and the second insert of
each first event into ``invocations`` would refuse the append.  A journal made from schema 8
on has ``result_chunks`` ``WITHOUT ROWID`` (one B-tree keyed by its primary key instead of a
rowid table and that key's index: ~0.7 fewer WAL frames a RESULT_COMMITTED,
``tests/benchmarks/wal_pages.py``); one made before keeps its table, read by the same
statements (each names the key or orders by it).  Schema 9 adds ``idempotency.send_by``: when
the binder's first attempt may send no more, which a call judging a binding with nothing
recorded under it waits out (``engine/binder.py``), and ``idempotency.target``: the binder's
target, which a fence names; a writer opening a journal from before adds the columns
(``_add_send_by``: its rows hold NULL, judged as before), a read-only reader reads
its rows with NULL there (``SqliteTables.idempotency``), and a broker of schema 8 refuses it --
it would bind without the column's deadline and judge another's binding by its own window.
Schema 10 changes no table: it is the fence's rules (``statemachine.FENCE_RULES``: a fence's
ACTION_ACCEPTED carries ``fenced.rules``, and its record refuses every attempt of its binder).
A broker of schema 9 does not hold them -- sharing the journal, it would write its binder's
preamble into a record fenced under them and go on to send -- so it refuses the journal; a
writer opening one from before only records the new number.  Schema 11 adds ``linked_calls``:
one row (invocation_id, call_sha256, seq) for each call a row's attrs name under a linked
attribute (``statemachine.LINKED_ATTRS``), filled with the row, in its transaction, by every
writer (``Tables.insert_events``), so a claim's check seeks the rows naming its call instead of
scanning its record under the write lock (``Txn._attrs_naming``).  Append-only like the events;
a writer opening a journal from before fills it, once, from every event (decoded as the check
decodes: no JSON function of the database, which a row that is not JSON would make fail).  A
broker of schema 10 refuses it: its rows would go unindexed, and a claim naming a call one of
them names would be taken.  Schema 12 changes no table: it is the rules of APPROVAL_REVOKED (an
operator takes a grant back before it is sent).  A broker of schema 11 does not know the row --
it reads it as altered, and would send the revoked grant's request and skip the gate's re-check
of the granting operator -- so it refuses the journal; a writer opening one from before only
records the new number.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterable
from pathlib import Path

from .backend import refuse_newer_schema
from .chain import GENESIS
from .rows import LINKED_REFUSED, LINKED_TAIL
from .segment_tables import SEGMENT_SCHEMA

__all__ = ["EXTEND_CHAIN", "SCHEMA", "SCHEMA_VERSION", "SESSION_INDEX"]

log = logging.getLogger("affidavit.journal")

SESSION_INDEX = "events_session"
SCHEMA_VERSION = 12

_CHAIN_REFUSED = "'journal rows must extend the hash chain by one'"
_CHAIN_WHEN = f"""coalesce((SELECT NEW.seq IS NOT seq + 1 OR NEW.prev_hash IS NOT hash FROM events
               ORDER BY seq DESC LIMIT 1),
              NEW.seq IS NOT 1 OR NEW.prev_hash IS NOT '{GENESIS}')"""

EXTEND_CHAIN = f"""CREATE TRIGGER IF NOT EXISTS events_extend_chain BEFORE INSERT ON events
BEGIN
SELECT RAISE(ABORT, {_CHAIN_REFUSED}) WHERE {_CHAIN_WHEN};
INSERT INTO invocations (first_seq, invocation_id) SELECT NEW.seq, NEW.invocation_id
WHERE NEW.kind = 'ACTION_ACCEPTED'
  AND NOT EXISTS (SELECT 1 FROM events WHERE invocation_id = NEW.invocation_id);
END;"""
"""The events' one insert trigger (schema 8), both jobs in one program run per row: first the
chain's refusal -- one lookup of the last row (``seq`` is the rowid: a seek to the table's end)
answers both rules, ``seq`` = its ``seq`` + 1 and ``prev_hash`` = its ``hash``, or, on an
empty table, ``seq`` 1 after ``GENESIS`` -- then, for a row the writer marks as a first
(``ACTION_ACCEPTED``: the only event a new invocation's projection takes) that has no earlier
event of its invocation (one probe of ``events_invocation``; BEFORE the insert, so the row
itself is not there yet), the ``invocations`` row naming it.  A RAISE rolls the statement
back, that insert with it.  Issue 15: the trigger runs once per row in the single writer;
schema 7 had two (this one's refusal and ``events_first_of_invocation``, AFTER INSERT, probing
every row), ~2.8k instructions a row more for the same refusals and the same index
(docs/design-notes.md).  A first event of another kind -- no writer of this broker makes one,
only someone writing the file -- is not indexed: the table then does not match the events, and
the view sorts instead (``first_events_indexed``): it is an index, not evidence."""

_EXTEND_CHAIN_7 = f"""CREATE TRIGGER events_extend_chain BEFORE INSERT ON events
WHEN {_CHAIN_WHEN}
BEGIN SELECT RAISE(ABORT, {_CHAIN_REFUSED}); END"""
"""Schemas 3-7's chain trigger as ``sqlite_master.sql`` holds it (SQLite keeps the statement
without ``IF NOT EXISTS`` and its ``;``): the same refusal, beside ``_FIRST_OF_INVOCATION_7``."""

_FIRST_OF_INVOCATION_7 = """CREATE TRIGGER events_first_of_invocation AFTER INSERT ON events
WHEN NOT EXISTS (SELECT 1 FROM events WHERE invocation_id = NEW.invocation_id AND seq < NEW.seq)
BEGIN INSERT INTO invocations (first_seq, invocation_id) VALUES (NEW.seq, NEW.invocation_id); END"""
"""Schemas 3-7's trigger filling ``invocations``, as stored; ``EXTEND_CHAIN`` does its job."""

_EXTEND_CHAIN_BEFORE = f"""CREATE TRIGGER events_extend_chain BEFORE INSERT ON events
WHEN NEW.seq IS NOT (SELECT coalesce(max(seq), 0) + 1 FROM events)
  OR NEW.prev_hash IS NOT coalesce((SELECT hash FROM events WHERE seq = NEW.seq - 1),
                                   '{GENESIS}')
BEGIN SELECT RAISE(ABORT, 'journal rows must extend the hash chain by one'); END"""
"""The chain trigger as journals from before ``_EXTEND_CHAIN_7`` hold it, two lookups a row; a
writer opening one replaces it (``_replace_chain_trigger``)."""

LINKED_INDEXED = f"""CREATE TRIGGER IF NOT EXISTS events_linked_indexed BEFORE INSERT ON events
WHEN instr(NEW.attrs, '{LINKED_TAIL}') > 0
  AND NOT EXISTS (SELECT 1 FROM linked_calls WHERE seq = NEW.seq
                  AND invocation_id = NEW.invocation_id)
BEGIN SELECT RAISE(ABORT, '{LINKED_REFUSED}'); END"""
"""Schema 11: a row whose text holds ``rows.LINKED_TAIL`` -- every row a broker writes naming
a query or a poll holds it -- needs a ``linked_calls`` row of its seq (a writer inserts them
first: ``rows.index_keys``, ``NAMES_NONE`` for a row naming none).  A broker of schema 10 that
opened the file before a writer of this schema upgraded it (its open's refusal came too late)
fills no such row: its claims and polls fail instead of going unindexed -- a claim of a call
they name would otherwise be taken.  One ``instr`` over the attrs a row; the probe
(``linked_calls_seq``) only for the rows holding the tail."""

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
CREATE TRIGGER IF NOT EXISTS events_no_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'journal events are append-only'); END;
CREATE TRIGGER IF NOT EXISTS events_no_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'journal events are append-only'); END;
CREATE TABLE IF NOT EXISTS invocations (
  first_seq     INTEGER PRIMARY KEY,
  invocation_id TEXT NOT NULL
);
{EXTEND_CHAIN}
CREATE TABLE IF NOT EXISTS result_chunks (
  invocation_id TEXT NOT NULL,
  stream        TEXT NOT NULL,
  idx           INTEGER NOT NULL CHECK (idx >= 0),
  data          BLOB NOT NULL,
  PRIMARY KEY (invocation_id, stream, idx)
) WITHOUT ROWID;
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
CREATE TABLE IF NOT EXISTS linked_calls (
  invocation_id TEXT NOT NULL,
  call_sha256   BLOB NOT NULL,
  seq           INTEGER NOT NULL,
  PRIMARY KEY (invocation_id, call_sha256, seq)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS linked_calls_seq ON linked_calls (seq);
{LINKED_INDEXED};
CREATE TRIGGER IF NOT EXISTS linked_calls_no_update BEFORE UPDATE ON linked_calls
BEGIN SELECT RAISE(ABORT, 'journal linked_calls are append-only'); END;
CREATE TRIGGER IF NOT EXISTS linked_calls_no_delete BEFORE DELETE ON linked_calls
BEGIN SELECT RAISE(ABORT, 'journal linked_calls are append-only'); END;
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
  send_by       REAL,
  target        TEXT,
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
    """A journal from before schema 8 gets ``EXTEND_CHAIN`` in place of its two insert triggers,
    in the writer's opening transaction: the same refusals and the same ``invocations`` rows
    with one trigger program a row.  Only those exact predecessors are replaced (the chain's
    as schemas 3-7 or the ones before held it; ``events_first_of_invocation`` as schemas 3-7
    held it, or none): a trigger someone else defined is left for ``verify`` and the signed
    checkpoints to judge -- and so is the chain trigger beside another such trigger, which might
    insert into ``invocations`` too: twice, the insert's key would refuse every append.  With
    ``EXTEND_CHAIN`` in place, the schema-7 trigger beside it goes (the chain's was dropped
    and made again by ``SCHEMA``), for the same reason."""
    found = dict(
        conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND name IN "
            "('events_extend_chain', 'events_first_of_invocation')"
        ).fetchall()
    )
    chain, first = found.get("events_extend_chain"), found.get("events_first_of_invocation")
    if first not in (None, _FIRST_OF_INVOCATION_7):
        return
    if chain in (_EXTEND_CHAIN_BEFORE, _EXTEND_CHAIN_7):
        conn.execute("DROP TRIGGER events_extend_chain")
        conn.execute(EXTEND_CHAIN)
        chain = _stored(EXTEND_CHAIN)
    if first is not None and chain == _stored(EXTEND_CHAIN):
        conn.execute("DROP TRIGGER events_first_of_invocation")


def _add_send_by(conn: sqlite3.Connection) -> None:
    """A journal from before schema 9 gains ``idempotency.send_by`` and ``idempotency.target``
    (NULL in its rows) in the writer's opening transaction."""
    columns = {r[1] for r in conn.execute("SELECT * FROM pragma_table_info('idempotency')")}
    if "send_by" not in columns:
        conn.execute("ALTER TABLE idempotency ADD COLUMN send_by REAL")
    if "target" not in columns:
        conn.execute("ALTER TABLE idempotency ADD COLUMN target TEXT")


def _stored(create: str) -> str:
    """A ``CREATE ... IF NOT EXISTS ...;`` statement as ``sqlite_master.sql`` holds it."""
    return create.replace(" IF NOT EXISTS", "", 1).rstrip(";")


def _refuse_newer(conn: sqlite3.Connection, path: Path) -> str | None:
    """A journal a newer broker wrote (a schema this one does not know -- schema 4 moved long
    results' chunks into segment files, which a broker from before reads as missing) is neither
    written nor read here: what this broker would make of it is not what it holds.  Returns
    the schema it records (None: none)."""
    try:
        row = conn.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone()
    except sqlite3.Error:  # a new file, or one from before the meta table
        return None
    found = None if row is None else str(row[0])
    refuse_newer_schema(found, SCHEMA_VERSION, str(path))
    return found


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
