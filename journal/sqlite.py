"""The SQLite backend: the embedded default -- one file, WAL, one writer transaction at a time.

DESIGN, "Durability barriers": the journal runs in WAL mode with ``synchronous=FULL`` at
barriers, so a barrier's commit fsyncs the WAL; a batch with no barrier commits with
``synchronous=NORMAL`` (it survives a process crash and becomes power-loss durable with the next
barrier's fsync, which covers every earlier WAL frame).  ``BEGIN IMMEDIATE`` takes the file's
write lock before the chain head is read, so a second process appending to the same file extends
the same chain instead of forking it.  Readers use their own connection: WAL lets them read
while the writer commits, from this process or another.

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
without it builds it, logged (``_unbuilt``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, ClassVar, TypeVar
from urllib.parse import quote

from .backend import refuse_newer_schema
from .chain import GENESIS
from .errors import JournalError
from .lock import WriterLock
from .rows import FOLD_COLUMNS
from .segment_tables import SEGMENT_SCHEMA, SEGMENT_SQL, SegmentTables
from .signing import Checkpoint
from .tables import SQL, Tables

__all__ = ["BUSY_TIMEOUT_MS", "SCHEMA", "SCHEMA_VERSION", "SqliteBackend", "SqliteTables"]

log = logging.getLogger("affidavit.journal")

BUSY_TIMEOUT_MS = 30_000
SESSION_INDEX = "events_session"
SCHEMA_VERSION = 6

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
CREATE INDEX IF NOT EXISTS events_session ON events (session_id, seq, invocation_id);
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

_BLOB = "CAST({} AS BLOB)"
_BY_FIRST = (
    "SELECT "
    + ", ".join(f"events.{c}" for c in FOLD_COLUMNS.split(", "))
    + " FROM invocations CROSS JOIN events ON events.invocation_id = invocations.invocation_id"
)
"""Each invocation's events (``FOLD_COLUMNS``) through ``invocations`` (schema 3)."""


def _missing_table(exc: sqlite3.Error) -> bool:
    # A journal from before signing (or auditor copies), opened read-only, lacks the table.
    return isinstance(exc, sqlite3.OperationalError) and "no such table" in str(exc)


class SqliteTables(SegmentTables):
    """SQLite's statements: blob columns are read ``CAST(... AS BLOB)`` (SQLite's type affinity
    lets someone editing the file store text there; it must read as altered, not fail), and a
    read-only journal from before a table existed reads as having none of its rows.  Long
    results' chunks may be references to segment files (schema 4, ``segments.py``)."""

    NULL: ClassVar[Any] = float("nan")
    """SQL NULL in an event row: SQLite binds a NaN as NULL (``sqlite3_bind_double``; SQLite
    has no NaN), and Python's ``sqlite3`` binds an exact float directly, whereas every None
    goes through its adapter lookup -- which builds and discards an AttributeError each time:
    ~0.5 us per None, five of them in a typical row, half an ``executemany`` (issue 15: the
    single writer, per row).  The row stores NULL all the same
    (tests/journal/test_chain.py)."""

    SQL: ClassVar[dict[str, str]] = {
        **SQL,
        **SEGMENT_SQL,
        "marker": "SELECT seq, sha256, CAST(streams AS BLOB), CAST(summary AS BLOB) FROM "
        "results WHERE invocation_id = ?",
        "markers": "SELECT invocation_id, seq, sha256, streams, CAST(summary AS BLOB) FROM "
        "results ORDER BY seq",
        "event_at": "SELECT kind, invocation_id, CAST(attrs AS BLOB) FROM events WHERE seq = ?",
        # Through ``events_accepted_key`` (schema 5): the query's terms imply the index's WHERE,
        # so SQLite may use it -- and answers the same from the table without it.
        "accepted_with_key": "SELECT seq, invocation_id FROM events WHERE kind = "
        "'ACTION_ACCEPTED' AND json_valid(attrs) AND "
        "json_extract(attrs, '$.operation.idempotency.key') IS NOT NULL AND "
        "json_extract(attrs, '$.operation.idempotency.key') = ? AND "
        "json_extract(attrs, '$.operation.idempotency.scope') = ? ORDER BY seq LIMIT 1",
        # ``events_session`` walks a session's events back from its newest; each one's first
        # event of its invocation is found through ``events_invocation`` -- the ``+`` keeps the
        # planner (no statistics) from answering that ``min`` by scanning the session's range
        # of ``events_session`` instead, once per event walked.
        "newest_session_grouped": SQL["newest_session_grouped"].replace(
            " AND p.session_id = ?", " AND +p.session_id = ?"
        ),
        "grouped_by_first": f"{_BY_FIRST} ORDER BY invocations.first_seq, events.seq",
        "grouped_span": f"{_BY_FIRST} WHERE invocations.first_seq >= ? AND "
        "invocations.first_seq < ? AND events.seq <= ? ORDER BY invocations.first_seq, events.seq",
        "first_events_through": "SELECT count(*) FROM invocations WHERE first_seq <= ?",
        "first_event_at_rank": "SELECT first_seq FROM invocations WHERE first_seq <= ? ORDER BY "
        "first_seq LIMIT 1 OFFSET ?",
        # Exactly one ``invocations`` row per invocation, at its first event (rows of ``f``
        # missing from the index, and the index's count against ``f``'s): one pass over
        # ``events_invocation`` and a primary-key lookup per invocation, no sort.
        "first_events_indexed": "SELECT (SELECT count(*) FROM invocations) = count(*) AND "
        "coalesce(sum(NOT EXISTS (SELECT 1 FROM invocations AS i WHERE i.first_seq = f.first "
        "AND i.invocation_id = f.iid)), 0) = 0 FROM (SELECT invocation_id AS iid, min(seq) AS "
        "first FROM events GROUP BY invocation_id) AS f",
        **{
            k: v.replace("SELECT data", "SELECT " + _BLOB.format("data")).replace(
                "idx, data FROM", "idx, " + _BLOB.format("data") + " FROM"
            )
            for k, v in SQL.items()
            if k.startswith(("chunks_", "chunk_", "every_"))
        },
        **{
            k: v.replace("key_id, signature FROM", "key_id, CAST(signature AS BLOB) FROM")
            for k, v in SQL.items()
            if k in ("latest_checkpoint", "checkpoint_from", "checkpoints", "checkpoints_after")
        },
    }

    __slots__ = ()

    def grouped_events(self, session: str | None = None) -> Iterator[Any]:
        """Read through ``invocations`` (schema 3) when it indexes exactly every invocation's
        first event: each invocation's rows then come from ``events_invocation`` in order,
        with no sort of every row before the first one comes back (issue 15: a quarter of
        ``affidavit actions --json`` over 1M events).  Otherwise -- a journal from before,
        read-only, or an index someone edited -- the same rows, sorted as before: the view
        never depends on a table the chain does not cover."""
        if session is None and self._first_events_indexed():
            return self.cursor("grouped_by_first")
        return super().grouped_events(session)

    def action_spans(self, parts: int, min_events: int) -> tuple[list[int], int] | None:
        through = self.head()[0]
        if through < min_events or not self._first_events_indexed():
            return None
        count = int(self.one("first_events_through", (through,))[0])
        cuts = [0]
        for k in range(1, parts):
            row = self.one("first_event_at_rank", (through, count * k // parts))
            if row is not None and int(row[0]) > cuts[-1]:
                cuts.append(int(row[0]))
        return [*cuts, through + 1], through

    def grouped_span(self, first: int, before: int, through: int) -> Iterator[Any]:
        return self.cursor("grouped_span", (first, before, through))

    def accepted_with_key(self, scope: str, key: str) -> tuple[int, str] | None:
        """One index probe (``events_accepted_key``, schema 5; a read-only journal from before
        has none and scans the events instead: the same answer)."""
        row = self.one("accepted_with_key", (key, scope))
        return None if row is None else (int(row[0]), str(row[1]))

    def _first_events_indexed(self) -> bool:
        try:
            return bool(self.one("first_events_indexed")[0])
        except sqlite3.Error as exc:
            return _absent(exc, False)

    def latest_checkpoint(self) -> Checkpoint | None:
        try:
            return super().latest_checkpoint()
        except sqlite3.Error as exc:
            return _absent(exc, None)

    def checkpoint_from(self, seq: int) -> Checkpoint | None:
        try:
            return super().checkpoint_from(seq)
        except sqlite3.Error as exc:
            return _absent(exc, None)

    def checkpoints(self) -> Iterator[Checkpoint]:
        try:
            yield from super().checkpoints()
        except sqlite3.Error as exc:
            _absent(exc, None)

    def checkpoints_after(self, seq: int) -> Iterator[Checkpoint]:
        try:
            yield from super().checkpoints_after(seq)
        except sqlite3.Error as exc:
            _absent(exc, None)

    def checkpoint_count(self) -> int:
        try:
            return super().checkpoint_count()
        except sqlite3.Error as exc:
            return _absent(exc, 0)

    def chunks(self, audit: bool, iid: str) -> Iterator[tuple[str, int, bytes]]:
        try:
            yield from super().chunks(audit, iid)
        except sqlite3.Error as exc:
            _absent(exc, None)

    def every_chunk(self, audit: bool) -> Iterator[tuple[str, str, int, bytes]]:
        try:
            yield from super().every_chunk(audit)
        except sqlite3.Error as exc:
            _absent(exc, None)


T = TypeVar("T")


def _absent(exc: sqlite3.Error, empty: T) -> T:
    """``empty`` for a table a read-only journal from before it lacks; else re-raise."""
    if not _missing_table(exc):
        raise exc
    return empty


def _lenient_text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


CHECKPOINT_PAGES = 1024
"""The database grew by this many pages (4 MiB) since the last checkpoint: run one."""
CHECKPOINT_COMMITS = 256
"""Or this many commits went by (rows updated in place do not grow the file)."""


class _Checkpointer:
    """Copies the WAL into the database file from a thread and connection of its own (a
    ``PASSIVE`` checkpoint, which never blocks the writer), instead of SQLite's automatic
    checkpoint inside the writer's ``COMMIT``: that one copied ~40 MiB and fsynced the WAL
    and the file in the middle of a 50 MiB result, stalling every chunk behind it for ~0.4 s
    (issue 15).  The checkpoint connection keeps ``synchronous=FULL``: the WAL is synced before
    frames are copied and the file after, before the WAL may be reused -- what the automatic
    checkpoint did.  A failed checkpoint is retried at the next trigger; the WAL only grows.

    SQLite writes the WAL from its start again only when a write transaction begins with every
    frame already copied.  A busy writer always committed something while the thread copied,
    so that never happened: the WAL grew by every page the broker wrote (~80 KB a call) for
    as long as calls kept coming.  So once the thread has copied all it found, the writer's
    thread copies the few frames committed meanwhile itself, between two transactions
    (``catch_up``): its next transaction then starts the WAL over, and the file stays the
    size of one cycle's frames."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._pages: int | None = None
        self._commits = 0
        self._copied_all = False
        """The thread's last checkpoint found no frame it could not copy (no reader held one
        back): a catch-up by the writer can then copy every frame."""

    @staticmethod
    def pages(conn: sqlite3.Connection) -> int:
        """The database's size in pages, read by the writer inside its transaction, before
        ``COMMIT``: what it will be once committed.  Read after ``COMMIT`` instead, the pragma
        began a read transaction of its own -- four more ``fcntl`` locks on the -shm file and
        ~5 us per commit (issue 15, ``tests/benchmarks/call_timeline.py``)."""
        return int(conn.execute("PRAGMA page_count").fetchone()[0])

    def committed(self, pages: int | None) -> None:
        """After each writer commit, with its ``pages`` (None: unread, counted as unchanged):
        wake the thread when enough was written since."""
        self._commits += 1
        if pages is None:
            pages = self._pages or 0
        if self._pages is None:
            self._pages = pages
        if pages - self._pages < CHECKPOINT_PAGES and self._commits < CHECKPOINT_COMMITS:
            return
        self._pages, self._commits = pages, 0
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._main, name="affidavit-journal-checkpoint", daemon=True
            )
            self._thread.start()
        self._wake.set()

    def _main(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while True:
                self._wake.wait()
                self._wake.clear()
                if self._stop:
                    return
                with contextlib.suppress(sqlite3.Error):
                    if conn is None:
                        conn = sqlite3.connect(str(self._path), isolation_level=None)
                        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
                    busy, frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                    self._copied_all = not busy and frames == copied
        finally:
            if conn is not None:
                conn.close()

    def catch_up(self, conn: sqlite3.Connection) -> None:
        """On the writer's thread, between its transactions, after the thread copied all it
        found: copy what was committed since, so the next transaction restarts the WAL.  A
        few frames, not the cycle's; an error leaves it for the next cycle."""
        if not self._copied_all:
            return
        self._copied_all = False
        with contextlib.suppress(sqlite3.Error):
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    def close(self) -> None:
        """Stop the thread (after the checkpoint it is running, if any)."""
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


_TRANSIENT_CODES = frozenset({5, 6, 7, 9})
"""SQLITE_BUSY and SQLITE_LOCKED (another connection held on past the busy timeout), NOMEM and
INTERRUPT: primary result codes (an extended code's low byte) of a read worth trying again."""


class SqliteBackend:
    kind = "sqlite"
    shared = False
    multi_signer = False
    errors: tuple[type[BaseException], ...] = (sqlite3.Error,)
    reconnect_within = 0.0

    def __init__(self, path: Path) -> None:
        self.path: Path | None = path
        self.file = path
        self.where = str(path)
        self.segments: Path | None = Path(f"{path}.results")
        self._sync: dict[int, str] = {}
        self._checkpointers: dict[int, _Checkpointer] = {}

    def tables(self, conn: Any) -> Tables:
        return SqliteTables(conn, self.segments)

    def connect(self, role: str) -> sqlite3.Connection:
        path = self.file
        if role == "writer":
            conn = _connect_writer(path)
            self._checkpointers[id(conn)] = _Checkpointer(path)
            return conn
        if role == "reader":
            try:
                conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
                conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            except sqlite3.Error as exc:
                raise unusable(path, exc) from None
            return conn
        if not path.exists():
            raise JournalError(
                f"no journal at {path} (create it with `affidavit init`, or name the right one "
                "with [journal] path or --journal)"
            )
        uri = f"file:{quote(str(path.resolve()))}?mode=ro"
        try:
            # connect() itself fails on a directory or an unopenable file ("disk I/O
            # error"): the same clear JournalError as a file that is not a journal.
            conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise unreadable(path, exc) from None
        try:
            conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            conn.execute("SELECT 1 FROM events LIMIT 1").fetchall()
            _refuse_newer(conn, path)
        except sqlite3.Error as exc:
            conn.close()
            raise unreadable(path, exc) from None
        except JournalError:
            conn.close()
            raise
        return conn

    def close(self, conn: Any) -> None:
        checkpointer = self._checkpointers.pop(id(conn), None)
        if checkpointer is not None:
            checkpointer.close()
        conn.close()

    def create(self, conn: Any) -> None:
        _refuse_newer(conn, self.file)
        indexed = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'invocations'"
        ).fetchone()
        owned = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'chunk_owners'"
        ).fetchone()
        building = _unbuilt(conn, SESSION_INDEX, self.where)
        started = time.monotonic()
        # executescript() would COMMIT first; run the statements inside our transaction.
        for stmt in _split_sql(SCHEMA):
            conn.execute(stmt)
        if building:
            log.info(
                "journal %s: built index %s in %.1f s", self.where, SESSION_INDEX,
                time.monotonic() - started,
            )  # fmt: skip
        _replace_chain_trigger(conn)
        if indexed is None:  # new, or from before schema 3: index the events it already has
            conn.execute(
                "INSERT INTO invocations (first_seq, invocation_id) "
                "SELECT min(seq), invocation_id FROM events GROUP BY invocation_id"
            )
        if owned is None:  # new, or from before schema 6: name the chunks no marker names
            self.tables(conn).fill_chunk_owners()
        conn.execute(
            "INSERT INTO meta (name, value) VALUES ('schema', ?) ON CONFLICT (name) DO UPDATE "
            "SET value = max(CAST(value AS INTEGER), CAST(excluded.value AS INTEGER))",
            (str(SCHEMA_VERSION),),
        )

    def opened(self) -> None:
        pass  # the session index is built in the opening transaction (``create``)

    def begin(self, conn: Any, *, barrier: bool, wait: float | None = None) -> str:
        want = "FULL" if barrier else "NORMAL"
        if self._sync.get(id(conn), "FULL") != want:
            conn.execute(f"PRAGMA synchronous={want}")
            self._sync[id(conn)] = want
        conn.execute("BEGIN IMMEDIATE")
        return want

    def commit(self, conn: Any) -> None:
        checkpointer = self._checkpointers.get(id(conn))
        pages: int | None = None
        if checkpointer is not None:
            # Upkeep only: a size it cannot read must not fail the transaction.
            with contextlib.suppress(Exception):
                pages = checkpointer.pages(conn)
        conn.execute("COMMIT")
        if checkpointer is not None:
            # The COMMIT landed: whatever waking the checkpointer raises (no thread to be had)
            # must not report these writes failed -- a durable DISPATCH_STARTED answered as an
            # error is a record that claims a dispatch the engine then never makes.
            with contextlib.suppress(Exception):
                checkpointer.committed(pages)

    def between(self, conn: Any) -> None:
        checkpointer = self._checkpointers.get(id(conn))
        if checkpointer is not None:
            checkpointer.catch_up(conn)

    def rollback(self, conn: Any) -> None:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")

    @contextlib.contextmanager
    def snapshot(self, conn: Any) -> Iterator[None]:
        """One read transaction.  Text columns someone filled with bytes that are not UTF-8 must
        read as "altered", not stop a verify: decoded leniently, they no longer hash to what was
        chained."""
        conn.text_factory = _lenient_text
        conn.execute("BEGIN")
        try:
            yield
        finally:
            if conn.in_transaction:
                conn.execute("COMMIT")
            conn.text_factory = str

    def lost(self, exc: BaseException) -> bool:
        return False

    def transient(self, exc: BaseException) -> bool:
        code = getattr(exc, "sqlite_errorcode", None)
        return isinstance(code, int) and code & 0xFF in _TRANSIENT_CODES

    def describe(self, exc: BaseException) -> str:
        """An SQLite error's message without the data it may quote (a text column that is not
        UTF-8 is reported "... with text '<its bytes>'")."""
        return str(exc).split(" with text ", 1)[0]

    def open_error(self, exc: BaseException) -> JournalError:
        return unusable(self.file, exc)

    def writer_lock(self, owner: str | None) -> WriterLock:
        return WriterLock.acquire(self.file, owner)


def unusable(path: Path, exc: BaseException | None = None) -> JournalError:
    """The error for a journal that cannot be opened: one line naming the path and the reason
    an operator can act on (SQLite's own says "unable to open database file" for most)."""
    if path.is_dir():
        why = "it is a directory"
    elif not path.parent.is_dir():
        why = f"its directory {path.parent} does not exist"
    elif path.exists() and not os.access(path, os.W_OK):
        why = "it is read-only"
    elif not os.access(path.parent, os.W_OK):
        why = f"its directory {path.parent} is read-only"
    else:
        why = str(exc) if exc is not None else "unknown error"
    return JournalError(
        f"cannot open journal {path}: {why} (fix that, or name another journal with "
        "[journal] path or --journal)"
    )


def unreadable(path: Path, exc: BaseException) -> JournalError:
    """The error for a journal a read cannot open: SQLite's reason, and the cause an operator
    can act on where it is one of these (SQLite says "disk I/O error" for a directory)."""
    if path.is_dir():
        why = "it is a directory"
    elif not os.access(path.parent, os.W_OK):
        # A WAL journal's reader writes its -shm file beside it: a read-only directory (without
        # that file writable there already) refuses even a read.
        why = f"{exc}; its directory {path.parent} is read-only, and SQLite writes the -shm file"
    else:
        why = str(exc)
    return JournalError(
        f"{path} is not a readable journal: {why} (fix that, or name another journal with "
        "[journal] path or --journal)"
    )


def _connect_writer(path: Path) -> sqlite3.Connection:
    """The single writer's connection: WAL, ``synchronous=FULL``.  Raises ``sqlite3.Error`` or
    ``JournalError``; the caller closes what it opened."""
    conn = sqlite3.connect(
        str(path),
        isolation_level=None,
        check_same_thread=False,
        timeout=BUSY_TIMEOUT_MS / 1000,
    )
    try:
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise JournalError(f"{path}: cannot switch the journal to WAL mode")
        conn.execute("PRAGMA synchronous=FULL")
        # No checkpoint inside the writer's COMMIT: ``_Checkpointer`` runs them beside it.  Cap
        # the WAL file left behind after one.
        conn.execute("PRAGMA wal_autocheckpoint=0")
        conn.execute("PRAGMA journal_size_limit=67108864")
    except BaseException:
        conn.close()
        raise
    return conn


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
