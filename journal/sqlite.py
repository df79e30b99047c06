"""The SQLite backend: the embedded default -- one file, WAL, one writer transaction at a time.

DESIGN, "Durability barriers": the journal runs in WAL mode with ``synchronous=FULL`` at
barriers, so a barrier's commit fsyncs the WAL; a batch with no barrier commits with
``synchronous=NORMAL`` (it survives a process crash and becomes power-loss durable with the next
barrier's fsync, which covers every earlier WAL frame).  ``BEGIN IMMEDIATE`` takes the file's
write lock before the chain head is read, so a second process appending to the same file extends
the same chain instead of forking it.  Readers use their own connection: WAL lets them read
while the writer commits, from this process or another.

The schema, and what a writer opening an older file does to it, is ``sqlite_schema.py``; the
writer's connection and its WAL checkpoints are ``sqlite_wal.py``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar
from urllib.parse import quote

from .errors import JournalError, JournalReplaced, JournalWriteError, ReadFailed
from .exposure import journal_exposures, warn_exposed
from .lock import WriterLock
from .names import journal_file, refuse_left_beside, refuse_lost
from .rows import FOLD_COLUMNS
from .segment_tables import SEGMENT_LOCKS, SEGMENT_SQL, SegmentTables
from .signing import Checkpoint
from .sqlite_schema import _EXTEND_CHAIN_BEFORE as _EXTEND_CHAIN_BEFORE  # tests compare it
from .sqlite_schema import (
    EXTEND_CHAIN,
    SCHEMA,
    SCHEMA_VERSION,
    SESSION_INDEX,
    _add_send_by,
    _refuse_newer,
    _replace_chain_trigger,
    _unbuilt,
)
from .sqlite_schema import _split_sql as _split_sql
from .sqlite_wal import (
    BUSY_TIMEOUT_MS,
    _Checkpointer,
    _connect_writer,
    commit_frame_unwritten,
    create_private,
)
from .tables import OLDER_BINDINGS, SQL, Tables

__all__ = [
    "BUSY_TIMEOUT_MS",
    "EXTEND_CHAIN",
    "SCHEMA",
    "SCHEMA_VERSION",
    "SqliteBackend",
    "SqliteTables",
]

log = logging.getLogger("affidavit.journal")

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

    LINKED_SCHEMA: ClassVar[int] = 11
    SIGNING_SCHEMA: ClassVar[int] = 2
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
        **OLDER_BINDINGS,  # a read-only journal from before schema 9
        "first_events_through": "SELECT count(*) FROM invocations WHERE first_seq <= ?",
        "first_event_at_rank": "SELECT first_seq FROM invocations WHERE first_seq <= ? ORDER BY "
        "first_seq LIMIT 1 OFFSET ?",
        # Exactly one ``invocations`` row per invocation, at its first event: every row at the
        # first seq of its invocation (one seek into ``events_invocation`` each) -- so no two
        # rows name one invocation (``first_seq`` is the key) -- and as many rows as there are
        # invocations (one pass over ``events_invocation``, without the join of each group to
        # the index the query before made: 0.58 -> 0.42 s over 1M events).  A NULL id, which
        # only an altered schema admits, is a group of its own, whose row cannot be found; a
        # table rebuilt without its key (which rules out a repeated row) is not used at all,
        # nor one with a NULL key (a key not the rowid's admits it: an id with no events).
        "first_events_indexed": "SELECT (SELECT group_concat(name) FROM "
        "pragma_table_info('invocations') WHERE pk > 0) = 'first_seq' AND (SELECT count(*) "
        "FROM invocations) = (SELECT count(*) FROM (SELECT 1 FROM events GROUP BY "
        "invocation_id)) AND NOT EXISTS (SELECT 1 FROM invocations AS i WHERE i.first_seq IS NULL "
        "OR (SELECT min(seq) FROM events WHERE events.invocation_id = i.invocation_id) IS NOT "
        "i.first_seq)",
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

    def idempotency(self, scope: str, key: str) -> Any:
        try:
            return super().idempotency(scope, key)
        except sqlite3.Error as exc:
            _before_send_by(exc)
            return self.one("idempotency_older", (scope, key))

    def idempotency_rows(self) -> Iterator[Any]:
        try:
            rows = list(super().idempotency_rows())  # (the statement fails at its first step)
        except sqlite3.Error as exc:
            _before_send_by(exc)
            rows = list(self.rows("all_idempotency_older"))
        yield from rows


T = TypeVar("T")


def _absent(exc: sqlite3.Error, empty: T) -> T:
    """``empty`` for a table a read-only journal from before it lacks; else re-raise."""
    if not _missing_table(exc):
        raise exc
    return empty


def _before_send_by(exc: sqlite3.Error) -> None:
    """Return for a read-only journal from before schema 9, whose bindings have no ``send_by``
    nor ``target`` (read as NULL: ``IdempotencyRecord.send_by``, ``.target``); else re-raise."""
    if not (
        isinstance(exc, sqlite3.OperationalError)
        and str(exc) in ("no such column: send_by", "no such column: target")
    ):
        raise exc


def _lenient_text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


_TRANSIENT_CODES = frozenset({5, 6, 7, 9})
"""SQLITE_BUSY and SQLITE_LOCKED (another connection held on past the busy timeout), NOMEM and
INTERRUPT: primary result codes (an extended code's low byte) of a read worth trying again."""


class SqliteBackend:
    kind = "sqlite"
    shared = False
    multi_signer = False
    errors: tuple[type[BaseException], ...] = (sqlite3.Error,)
    reconnect_within = 0.0
    renew_after_refusal = False

    def __init__(self, path: Path) -> None:
        refuse_left_beside(path, ".results", "result segment directory")
        self.real = journal_file(path)
        """The file the name given is (``names.py``), resolved once, here: what SQLite opens
        (every role), the lock is taken beside (``writer_lock``), and every file the journal
        keeps beside itself is named after -- its keys' defaults (``ReaderBase``), its segment
        directory.  A link re-pointed later moves none of them apart."""
        self.path: Path | None = self.real
        self.file = path
        """The name given: every message names it as the operator did, and a writer checks it
        still leads to the file it opened (``writes_path``: a link re-pointed, a file renamed
        over it)."""
        self.where = str(path)
        self.segments: Path | None = Path(f"{self.path}.results")
        self._sync: dict[int, str] = {}
        self._checkpointers: dict[int, _Checkpointer] = {}
        self.sole = False
        """This process holds the journal's writer lock exclusive (``writer_lock``: the daemon):
        no other writer, of this version or an earlier one, has it open."""
        self._looked = False
        self._checked: dict[int, tuple[int, int, int]] = {}
        """A ``tool`` connection's file (device, inode) and schema cookie when it was checked."""
        self._writer_file: tuple[int, int] | None = None
        """The (device, inode) of the file the first writer connection opened, read just
        before it was opened (``require_writer_file``); None: no writer here."""
        self._was_new = False
        """The file was absent or empty before the first writer connection opened it: no
        journal, so no lost -wal either (``create``: ``refuse_lost`` not asked)."""
        self._lock: WriterLock | None = None
        """The writer lock this process holds (``writer_lock``), checked still in place with
        the file at each writer transaction (``_require_lock``)."""

    def tables(self, conn: Any) -> Tables:
        return SqliteTables(conn, self.segments)

    def connect(self, role: str) -> sqlite3.Connection:
        conn = self._connect(role)
        if not self._looked:  # once the file (and a writer's WAL) is there: exposure.py
            self._looked = True
            warn_exposed(journal_exposures(self.file))
        return conn

    def _connect(self, role: str) -> sqlite3.Connection:
        path, real = self.file, self.real  # (named as given; opened as resolved once)
        if role == "writer":
            if self._writer_file is None:  # (a lost -wal leaves at least SQLite's header)
                try:
                    self._was_new = real.stat().st_size == 0
                except FileNotFoundError:
                    self._was_new = True
                except OSError:
                    self._was_new = False
            # Made first (0600) so that it can be read before SQLite opens it: a file put in
            # its place in between -- or a link given re-pointed since the lock was taken
            # beside ``real`` -- is then found replaced at the first transaction, never taken
            # for the one read here.
            create_private(real)
            try:
                made = real.stat()
            except OSError:  # (no directory, ...: said by the open, as it always was)
                made = None
            conn = _connect_writer(real)
            if self._writer_file is None:
                try:
                    made = made or real.stat()
                except OSError:
                    conn.close()
                    raise
                self._writer_file = (made.st_dev, made.st_ino)
            self._checkpointers[id(conn)] = _Checkpointer(real, self.writes_path)
            return conn
        if role == "reader":
            create_private(real)  # (the writing journal's reader opens it first)
            try:
                conn = sqlite3.connect(str(real), isolation_level=None, check_same_thread=False)
                conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            except sqlite3.Error as exc:
                raise unusable(path, exc) from None
            return conn
        try:
            # Before the file is opened: one replaced in between is then found replaced.
            st = real.stat()
        except OSError:
            st = None
        if st is None:
            raise JournalError(
                f"no journal at {path} (create it with `affidavit init`, or name the right one "
                "with [journal] path or --journal)"
            )
        uri = f"file:{quote(str(real))}?mode=ro"
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
            cookie = conn.execute("PRAGMA schema_version").fetchone()[0]
        except sqlite3.Error as exc:
            conn.close()
            raise unreadable(path, exc) from None
        except JournalError:
            conn.close()
            raise
        self._checked[id(conn)] = (st.st_dev, st.st_ino, cookie)
        return conn

    def unchanged(self, conn: Any) -> bool:
        """The file opened (``real``, the name given as resolved once: a stat of that, not of
        the name given -- ``writes_path`` judges the name) is still there, not replaced or
        removed, and its schema cookie is the one checked (``PRAGMA schema_version``: any table
        or index made, changed or dropped bumps it) -- a stat and a header read."""
        checked = self._checked.get(id(conn))
        if checked is None:
            return False
        try:
            st = self.real.stat()
            cookie = conn.execute("PRAGMA schema_version").fetchone()[0]
        except (OSError, sqlite3.Error):
            return False
        return (st.st_dev, st.st_ino, cookie) == checked

    def writes_path(self) -> bool:
        """The file at the path is the one this process's writer opened (or there is no writer
        here): one ``stat``.  Nothing at the path is False; a ``stat`` that fails otherwise
        (a directory's mode changed, an I/O error) raises its ``OSError``: not a replacement."""
        pinned = self._writer_file
        if pinned is None:
            return True
        try:
            st = os.stat(self.file)
        except (FileNotFoundError, NotADirectoryError):
            return False  # removed
        # Any other error (EACCES, EIO, ESTALE) proves nothing either way: it propagates.
        return (st.st_dev, st.st_ino) == pinned

    def require_writer_file(self) -> None:
        """``JournalReplaced`` unless the file at the path is the one this process's writer
        opened: renamed over, deleted and made again, or removed, the writer would write the
        file it holds while a reader opened by the path read another.  Checked at each writer
        transaction's start (``begin``) and each check of a view reader (``ViewReaders``): a
        ``stat`` each, never one per row."""
        try:
            writes = self.writes_path()
        except OSError as exc:
            raise ReadFailed(
                f"journal {self.where}: the file at its path could not be checked "
                f"({exc.strerror or type(exc).__name__}); the same read may succeed"
            ) from None
        if not writes:
            raise self._replaced()
        self._require_lock(ReadFailed)

    def _require_lock(self, failed: type[JournalError]) -> None:
        """``JournalReplaced`` if the writer lock this process holds is no longer the file at
        ``<journal>.lock`` (deleted, or replaced): it keeps no one out any more -- a second
        owner's start made a new lock file there, took it, and its recovery closed this
        daemon's live call while this one went on writing (``WriterLock.in_place``).  Its
        writes stop here: restarted, it takes the lock at the path again, or is told who holds
        it.  A ``stat`` that fails otherwise raises ``failed`` (nothing was written)."""
        lock = self._lock
        if lock is None:
            return
        try:
            placed = lock.in_place()
        except OSError as exc:
            raise failed(
                f"journal {self.where}: its writer lock {lock.path} could not be checked "
                f"({exc.strerror or type(exc).__name__}); nothing was written"
            ) from None
        if not placed:
            raise JournalReplaced(
                f"journal {self.where}: its writer lock {lock.path} is not the file this broker "
                "locked (removed or replaced since): another writer may have taken the journal "
                "beside it, so nothing is written here (JOURNAL_REPLACED); stop this broker "
                "and start it again"
            )

    def _replaced(self) -> JournalReplaced:
        return JournalReplaced(
            f"journal {self.where}: the file at this path is not the one this broker has been "
            "writing (replaced or removed since it opened it): nothing is read from or written "
            "to it here (JOURNAL_REPLACED); stop this broker and start it again to use the file "
            "now at the path"
        )

    @staticmethod
    def _fold_wal(conn: Any, *, wait: bool) -> None:
        """The writer's file gone from its path: its WAL is still named by the path (SQLite
        leaves the WAL of a moved file as it is when it closes), and whoever opens the path
        next would apply its frames to the file now there -- rows of this journal in another.
        So every frame is copied into the file this writer holds and the WAL emptied
        (``TRUNCATE``); an error (a reader holding frames back) leaves it for the next try.
        ``wait=False`` (a refused transaction's): no wait for a reader's lock -- the single
        writer thread is not held up by a view still reading, it tries again at the next
        refusal; ``close`` waits as the connection's busy timeout says."""
        with contextlib.suppress(sqlite3.Error):
            waits = conn.execute("PRAGMA busy_timeout").fetchone()[0]
            if not wait:
                conn.execute("PRAGMA busy_timeout=0")
            try:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            finally:
                conn.execute(f"PRAGMA busy_timeout={int(waits)}")

    def bound_waits(self, conn: Any, seconds: float) -> None:
        conn.execute(f"PRAGMA busy_timeout={max(1, int(seconds * 1000))}")

    def close(self, conn: Any) -> None:
        self._checked.pop(id(conn), None)
        checkpointer = self._checkpointers.pop(id(conn), None)
        if checkpointer is not None:
            checkpointer.close()
            try:
                moved = not self.writes_path()
            except OSError:
                moved = True  # (unproven either way: folding into its own file is harmless)
            if moved:  # (a writer's: what it committed since, folded in)
                self._fold_wal(conn, wait=True)
        conn.close()

    def create(self, conn: Any) -> str | None:
        found = _refuse_newer(conn, self.file)
        indexed = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'invocations'"
        ).fetchone()
        owned = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'chunk_owners'"
        ).fetchone()
        fresh = not conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'events'"
        ).fetchone()
        linked = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'linked_calls'"
        ).fetchone()
        if fresh and not self._was_new:  # a -wal (and the schema in it) lost, or a new one
            refuse_lost(self.file, self.where)
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
        if linked is None and not fresh:  # from before schema 11: index what its rows name
            conn.text_factory = _lenient_text  # a row's bytes that are not UTF-8 fail no open
            try:
                self.tables(conn).index_linked_calls(self.where)
            finally:
                conn.text_factory = str
        _add_send_by(conn)
        conn.execute(
            "INSERT INTO meta (name, value) VALUES ('schema', ?) ON CONFLICT (name) DO UPDATE "
            "SET value = max(CAST(value AS INTEGER), CAST(excluded.value AS INTEGER))",
            (str(SCHEMA_VERSION),),
        )
        if fresh or self.sole:
            self._prove_segment_locks(conn)
        return found

    def _prove_segment_locks(self, conn: Any) -> None:
        """Record ``segment_locks``: no writer that leaves its segment files unlocked (a broker
        of an earlier affidavit) can be writing this journal -- so a compaction may take what
        an unlocked segment's rows do not name (``compact.py``).  Proven, in the transaction
        that makes the schema 7 (which an earlier broker refuses to open), by a journal made
        here (no writer ever opened it before) or by the writer lock held exclusive (the daemon:
        any other writer, of any version, holds it shared while it has the journal open).  An
        earlier broker that opened the journal before can be told apart no other way: its
        segments carry no mark."""
        conn.execute(
            "INSERT INTO meta (name, value) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
            (SEGMENT_LOCKS, str(SCHEMA_VERSION)),
        )

    def opened(self) -> None:
        pass  # the session index is built in the opening transaction (``create``)

    def begin(self, conn: Any, *, barrier: bool, wait: float | None = None) -> str:
        self._refuse_unless_writing(conn)  # (spares waiting for the write lock when so)
        want = "FULL" if barrier else "NORMAL"
        if self._sync.get(id(conn), "FULL") != want:
            conn.execute(f"PRAGMA synchronous={want}")
            self._sync[id(conn)] = want
        conn.execute("BEGIN IMMEDIATE")
        # Again, under SQLite's write lock: a second writer makes its lock file before its
        # first commit, so a lock or file replaced while this one waited is seen here, before
        # anything is written -- race-free.
        try:
            self._refuse_unless_writing(conn, started=True)
        except BaseException:
            self.rollback(conn)
            raise
        return want

    def _refuse_unless_writing(self, conn: Any, *, started: bool = False) -> None:
        """``JournalReplaced`` unless the file at the path is this writer's and its lock still
        the file at ``<journal>.lock``; a ``stat`` that fails otherwise is a
        ``JournalWriteError`` (nothing was written).  A replaced file's WAL is folded into the
        one held (``_fold_wal``) -- after the rollback, when the transaction ``started``."""
        try:
            writes = self.writes_path()
        except OSError as exc:  # a refusal writes nothing
            raise JournalWriteError(
                f"journal {self.where}: the file at its path could not be checked "
                f"({exc.strerror or type(exc).__name__}); nothing was written"
            ) from None
        if not writes:
            if started:
                self.rollback(conn)
            self._fold_wal(conn, wait=False)
            raise self._replaced()
        self._require_lock(JournalWriteError)

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

    def commit_may_have_landed(self, exc: BaseException) -> bool:
        return not commit_frame_unwritten(exc)

    def transient(self, exc: BaseException) -> bool:
        code = getattr(exc, "sqlite_errorcode", None)
        return isinstance(code, int) and code & 0xFF in _TRANSIENT_CODES

    def describe(self, exc: BaseException) -> str:
        """An SQLite error's message without the data it may quote (a text column that is not
        UTF-8 is reported "... with text '<its bytes>'")."""
        return str(exc).split(" with text ", 1)[0]

    def open_error(self, exc: BaseException) -> JournalError:
        return unusable(self.file, exc)

    def writer_lock(self, owner: str | None, keys: Sequence[Path] = ()) -> WriterLock:
        lock = WriterLock.acquire(self.file, owner, keys=keys, real=self.real)
        self.sole = lock.exclusive
        self._lock = lock
        return lock


def unusable(path: Path, exc: BaseException | None = None) -> JournalError:
    """The error for a journal that cannot be opened: one line naming the path and the reason
    an operator can act on (SQLite's own says "unable to open database file" for most).  Its
    directory goes unnamed: the path names it, and a caller is told the words without the path
    (``engine.unplaced``), which finds the path only whole."""
    if path.is_dir():
        why = "it is a directory"
    elif not path.parent.is_dir():
        why = "its directory does not exist"
    elif path.exists() and not os.access(path, os.W_OK):
        why = "it is read-only"
    elif not os.access(path.parent, os.W_OK):
        why = "its directory is read-only"
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
        why = f"{exc}; its directory is read-only, and SQLite writes the -shm file"
    else:
        why = str(exc)
    return JournalError(
        f"{path} is not a readable journal: {why} (fix that, or name another journal with "
        "[journal] path or --journal)"
    )
