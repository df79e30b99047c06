"""Every read and write of the journal's tables, named: the one place the journal's logic meets
SQL.

``Tables`` wraps one DB-API connection (SQLite's or psycopg's) and a backend's statement texts
(``SQL``).  The transaction logic (``txn.py``, ``leases.py``, ``results.py``,
``checkpoints.py``), the reads (``reader.py``, ``views.py``) and ``verify`` call these methods
and nothing else, so they are the same code on every backend; a backend (``sqlite.py``,
``postgres.py``) supplies only its statements where they differ, its schema, and how it
connects and commits (``backend.py``).

Statements are written with ``?`` placeholders (SQLite's); a backend whose driver wants another
style translates them once, when its class is made (``Tables.dialect``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

from .chain import EVENT_COLUMNS, GENESIS
from .rows import (
    EVENT_READ_COLUMNS,
    FOLD_COLUMNS,
    IDEMPOTENCY_COLUMNS,
    LEASE_COLUMNS,
    AlteredRow,
    call_key,
    linked_call_rows,
)
from .signing import Checkpoint

__all__ = ["CHECKPOINT_COLUMNS", "SQL", "Tables", "newest_statements"]

CHECKPOINT_COLUMNS = "seq, hash, prev, at, adopted, key_id, signature"

log = logging.getLogger("affidavit.journal")

_CHUNKS = {False: "result_chunks", True: "result_audit"}


def newest_statements(count: str) -> dict[str, str]:
    """``Tables.newest_grouped``'s statements and ``invocation_count``'s, with ``count``: how
    this backend counts the distinct invocation ids of ``events`` (``{}``: where its WHERE
    clause goes) in one pass over ``events_invocation`` in the database, no row decoded.

    The newest ``limit`` invocations (by first event) and their events, as ``grouped_events``
    orders them, each row led by how many invocations there are.  An invocation's first event
    is the one with no earlier event of its id: found walking ``seq`` back from the head, a
    ``min`` over ``events_invocation`` per row walked, until ``limit`` are found -- no row
    before them is read.  One statement: one snapshot on every backend."""
    statements = {}
    for name, where, where_f, and_p, and_e in (
        ("newest_grouped", "", "", "", ""),
        (
            "newest_session_grouped",
            " WHERE session_id = ?",
            "f.session_id = ? AND ",
            " AND p.session_id = ?",
            " WHERE e.session_id = ?",
        ),
    ):
        statements[name] = (
            f"SELECT (SELECT {count.format(where)}), "
            + ", ".join(f"e.{c}" for c in FOLD_COLUMNS.split(", "))
            + " FROM (SELECT f.seq AS first, f.invocation_id AS iid FROM events AS f WHERE "
            f"{where_f}f.seq = (SELECT min(p.seq) FROM events AS p WHERE p.invocation_id = "
            f"f.invocation_id{and_p}) ORDER BY f.seq DESC LIMIT ?) AS page JOIN events AS e ON "
            f"e.invocation_id = page.iid{and_e} ORDER BY page.first, e.seq"
        )
    # The same page without the count (``newest_page``): when the count is known already.
    statements["newest_page"] = statements["newest_grouped"].replace(
        f"SELECT (SELECT {count.format('')}), ", "SELECT NULL, ", 1
    )
    statements["invocation_count"] = f"SELECT {count.format('')}"
    statements["session_invocation_count"] = f"SELECT {count.format(' WHERE session_id = ?')}"
    return statements


_LAST_SEQ = 2**63 - 1
"""The largest seq either database stores (a signed 64-bit integer)."""

SQL: dict[str, str] = {
    # -- events ------------------------------------------------------------------------------
    "head": "SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1",
    "insert_event": f"INSERT INTO events ({EVENT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
    "invocation_events": f"SELECT {EVENT_READ_COLUMNS} FROM events WHERE invocation_id = ? "
    "ORDER BY seq",
    # Its rows up to a seq (``Tables.invocation_events``' ``through``): a range of
    # ``events_invocation``, whatever came after (an operation's polls) left unread.
    "invocation_events_through": f"SELECT {EVENT_READ_COLUMNS} FROM events WHERE "
    "invocation_id = ? AND seq <= ? ORDER BY seq",
    # A page of them (``Tables.invocation_events_page``): a range of ``events_invocation``
    # from a seq, the rows before it left unread (the daemon's ``?from_seq=`` pages).
    "invocation_events_page": f"SELECT {EVENT_READ_COLUMNS} FROM events WHERE "
    "invocation_id = ? AND seq >= ? ORDER BY seq LIMIT ?",
    # The attrs of an invocation's rows naming a call (``Tables.attrs_naming``): a claim's
    # check (``journal/txn``) seeks ``linked_calls``' key, never reads the rest of the record.
    "attrs_naming": "SELECT e.attrs FROM linked_calls AS c JOIN events AS e ON e.seq = c.seq "
    "AND e.invocation_id = c.invocation_id WHERE c.invocation_id = ? AND c.call_sha256 = ? "
    "ORDER BY c.seq",
    # The key is the whole row: a row already there is exactly the one meant (inserted ahead
    # of its event by someone granted INSERT), not a reason to refuse the batch; a different
    # row beside it is ``verify``'s to report.
    # The rows themselves (``Tables.events_naming``): an open poll's claim found without
    # reading the polls before it.
    "events_naming": "SELECT "
    + ", ".join(f"e.{c}" for c in EVENT_READ_COLUMNS.split(", "))
    + " FROM linked_calls AS c JOIN events AS e ON e.seq = c.seq AND e.invocation_id = "
    "c.invocation_id WHERE c.invocation_id = ? AND c.call_sha256 = ? ORDER BY c.seq",
    "insert_linked_calls": "INSERT INTO linked_calls (invocation_id, call_sha256, seq) "
    "VALUES (?,?,?) ON CONFLICT DO NOTHING",
    # ``verify``'s read, a window of seqs at a time (``Tables.stored_linked_calls``).
    "linked_calls_rows": "SELECT invocation_id, call_sha256, seq FROM linked_calls WHERE "
    "seq >= ? AND seq <= ? ORDER BY seq",
    "linked_calls_next": "SELECT min(seq) FROM linked_calls WHERE seq > ?",
    "linked_calls_table": "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND "
    "name = 'linked_calls'",
    # Once, when a journal from before ``linked_calls`` gains it (``Tables.fill_linked_calls``).
    "linked_candidates": "SELECT seq, invocation_id, attrs FROM events WHERE seq > ? ORDER BY seq "
    "LIMIT ?",
    "scan_events": f"SELECT {EVENT_READ_COLUMNS} FROM events ORDER BY seq",
    "session_events": f"SELECT {EVENT_READ_COLUMNS} FROM events WHERE session_id = ? ORDER BY seq",
    # Each invocation's events together, invocations in order of first appearance: a view can
    # fold and emit one invocation at a time (the database sorts, spilling to disk, instead of
    # the reader holding every invocation's projection).
    "grouped_events": f"SELECT {FOLD_COLUMNS} FROM events JOIN (SELECT invocation_id AS "
    "iid, min(seq) AS first FROM events GROUP BY invocation_id) AS f ON invocation_id = f.iid "
    "ORDER BY f.first, seq",
    "grouped_session_events": f"SELECT {FOLD_COLUMNS} FROM events JOIN (SELECT "
    "invocation_id AS iid, min(seq) AS first FROM events WHERE session_id = ? GROUP BY "
    "invocation_id) AS f ON invocation_id = f.iid WHERE session_id = ? ORDER BY f.first, seq",
    **newest_statements("count(DISTINCT invocation_id) FROM events{}"),
    "event_rows": f"SELECT {EVENT_COLUMNS} FROM events WHERE seq BETWEEN ? AND ? ORDER BY seq",
    "all_event_rows": f"SELECT {EVENT_COLUMNS} FROM events ORDER BY seq",
    # Not DISTINCT (``touched_after`` makes the set): SQLite would answer that by scanning all
    # of ``events_invocation`` instead of the rows after ``seq`` (issue 15).
    "touched_after": "SELECT invocation_id FROM events WHERE seq > ?",
    # A range of the primary key, then the kind: the rows appended since, never the journal.
    "approvals_between": "SELECT invocation_id, kind FROM events WHERE seq > ? AND seq <= ? AND "
    "kind IN ('APPROVAL_REQUESTED', 'APPROVAL_GRANTED')",
    "hash_at": "SELECT hash FROM events WHERE seq = ?",
    "event_at": "SELECT kind, invocation_id, attrs FROM events WHERE seq = ?",
    "payload_at": "SELECT invocation_id, kind, payload FROM events WHERE seq = ?",
    "audit_at": "SELECT invocation_id, kind, audit FROM events WHERE seq = ?",
    # -- leases and idempotency --------------------------------------------------------------
    "lease": f"SELECT {LEASE_COLUMNS} FROM leases WHERE invocation_id = ?",
    "put_lease": "INSERT INTO leases (invocation_id, holder, generation, expires_at, seq) "
    "VALUES (?,?,?,?,?) ON CONFLICT (invocation_id) DO UPDATE SET holder = excluded.holder, "
    "generation = excluded.generation, expires_at = excluded.expires_at, seq = excluded.seq",
    "all_leases": f"SELECT invocation_id, {LEASE_COLUMNS} FROM leases ORDER BY invocation_id",
    "idempotency": f"SELECT {IDEMPOTENCY_COLUMNS} FROM idempotency WHERE scope = ? AND key = ?",
    "insert_idempotency": f"INSERT INTO idempotency ({IDEMPOTENCY_COLUMNS}) "
    "VALUES (?,?,?,?,?,?,?,?)",
    "all_idempotency": f"SELECT {IDEMPOTENCY_COLUMNS} FROM idempotency ORDER BY scope, key",
    # -- results -----------------------------------------------------------------------------
    "marker": "SELECT seq, sha256, streams, summary FROM results WHERE invocation_id = ?",
    # A range of ``events_invocation``, then the kind: asked only when the marker is missing.
    "committed_at": "SELECT seq FROM events WHERE invocation_id = ? AND kind = "
    "'RESULT_COMMITTED' ORDER BY seq LIMIT 1",
    "markers": "SELECT invocation_id, seq, sha256, streams, summary FROM results ORDER BY seq",
    "has_result": "SELECT 1 FROM results WHERE invocation_id = ?",
    "insert_result": "INSERT INTO results (invocation_id, seq, sha256, streams, summary) "
    "VALUES (?,?,?,?,?)",
    # ``chunk_owners``: one row per invocation with chunk rows stored and no marker yet, added
    # with its first chunk and dropped by the transaction that writes its marker -- so the
    # reclaim's candidates are read from it, not from a scan of every chunk row.
    "unmarked_chunk_owners": "SELECT invocation_id FROM chunk_owners ORDER BY 1",
    "own_chunks": "INSERT INTO chunk_owners (invocation_id) SELECT CAST(? AS TEXT) WHERE NOT "
    "EXISTS (SELECT 1 FROM results WHERE invocation_id = ?) ON CONFLICT (invocation_id) DO "
    "NOTHING",
    "disown_chunks": "DELETE FROM chunk_owners WHERE invocation_id = ?",
    # Once, when a journal from before ``chunk_owners`` gains it: every invocation with chunk
    # rows (or auditor copies) and no marker -- the scan the reclaim ran at each start before.
    "fill_chunk_owners": "INSERT INTO chunk_owners (invocation_id) "
    + " UNION ".join(
        f"SELECT c.invocation_id FROM {table} c WHERE NOT EXISTS "
        "(SELECT 1 FROM results r WHERE r.invocation_id = c.invocation_id)"
        for table in _CHUNKS.values()
    )
    + " ON CONFLICT (invocation_id) DO NOTHING",
    **{
        f"{op}_{table}": sql.replace("TABLE", table)
        for table in _CHUNKS.values()
        for op, sql in {
            "drop": "DELETE FROM TABLE WHERE invocation_id = ? AND stream = ?",
            "drop_all": "DELETE FROM TABLE WHERE invocation_id = ?",
            "put": "INSERT INTO TABLE (invocation_id, stream, idx, data) VALUES (?,?,?,?) "
            "ON CONFLICT (invocation_id, stream, idx) DO UPDATE SET data = excluded.data",
            "chunks": "SELECT stream, idx, data FROM TABLE WHERE invocation_id = ? "
            "ORDER BY stream, idx",
            "chunk": "SELECT data FROM TABLE WHERE invocation_id = ? AND stream = ? AND idx = ?",
            "every": "SELECT invocation_id, stream, idx, data FROM TABLE "
            "ORDER BY invocation_id, stream, idx",
            "sizes": "SELECT count(*), coalesce(sum(length(data)), 0) FROM TABLE "
            "WHERE invocation_id = ?",
        }.items()
    },
    # -- checkpoints, keys and meta ----------------------------------------------------------
    "insert_checkpoint": f"INSERT INTO checkpoints ({CHECKPOINT_COLUMNS}) VALUES (?,?,?,?,?,?,?)",
    "latest_checkpoint": f"SELECT {CHECKPOINT_COLUMNS} FROM checkpoints ORDER BY seq DESC LIMIT 1",
    "checkpoint_from": f"SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE seq >= ? "
    "ORDER BY seq LIMIT 1",
    "checkpoints": f"SELECT {CHECKPOINT_COLUMNS} FROM checkpoints ORDER BY seq",
    "checkpoints_after": f"SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE seq > ? ORDER BY seq",
    "checkpoint_count": "SELECT count(*) FROM checkpoints",
    "meta": "SELECT value FROM meta WHERE name = ?",
    "meta_like": "SELECT name, value FROM meta WHERE name LIKE ? ORDER BY name",
    "insert_meta": "INSERT INTO meta (name, value) VALUES (?, ?)",
}
OLDER_BINDINGS = {
    f"{k}_older": SQL[k].replace(", send_by, target FROM", ", NULL, NULL FROM")
    for k in ("idempotency", "all_idempotency")
}
"""A read-only reader of a journal from before ``idempotency.send_by`` and ``.target`` (SQLite
schema 9, PostgreSQL schema 3), which no writer has upgraded: its bindings as rows of today's
columns, NULL there (``IdempotencyRecord.send_by``, ``.target``)."""


def _checkpoint(row: Sequence[Any]) -> Checkpoint:
    try:
        return Checkpoint(
            int(row[0]), str(row[1]), int(row[2]), float(row[3]), bool(row[4]), str(row[5]),
            bytes(row[6]),
        )  # fmt: skip
    except (TypeError, ValueError, OverflowError):
        # Columns someone filled with the wrong types (an infinite REAL where an integer
        # goes: OverflowError): a checkpoint no key verifies.
        return Checkpoint(int(row[0]), "", -1, 0.0, False, "", b"")


def _encodes(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


class Tables:
    """The journal's tables over one connection.  Methods return rows as tuples in the column
    order their statement names; iterators are consumed before the next statement."""

    SQL: ClassVar[Mapping[str, str]] = SQL
    PLACEHOLDER: ClassVar[str] = "?"
    NULL: ClassVar[Any] = None
    """What an event row handed to ``insert_events`` holds for SQL NULL (``Txn.insert``)."""
    LINKED_SCHEMA: ClassVar[int] = 5
    """The first schema with ``linked_calls`` (PostgreSQL's; SQLite's is 11)."""
    LINKED_WINDOW: ClassVar[int] = 10_000
    """Seqs of ``linked_calls`` one query of ``verify``'s reads (``stored_linked_calls``)."""
    SIGNING_SCHEMA: ClassVar[int] = 1
    """The first schema (``meta`` row ``schema``) only signing brokers write: a journal that
    records it or a later one was opened by a writer that signs (``checkpoints.signing_era``).
    Every PostgreSQL journal; SQLite from schema 2, which came with signing."""

    __slots__ = ("conn",)

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    @staticmethod
    def dialect(statements: Mapping[str, str], placeholder: str) -> dict[str, str]:
        """``statements`` with ``?`` placeholders written as ``placeholder`` (our statements
        hold no other ``?``)."""
        return {k: v.replace("?", placeholder) for k, v in statements.items()}

    # -- the driver, in five verbs --------------------------------------------------------------

    def one(self, name: str, params: Sequence[Any] = ()) -> Any:
        return self.conn.execute(self.SQL[name], params).fetchone()

    def rows(self, name: str, params: Sequence[Any] = ()) -> Iterator[Any]:
        cur = self.conn.execute(self.SQL[name], params)
        try:
            yield from cur
        finally:
            cur.close()

    def cursor(self, name: str, params: Sequence[Any] = ()) -> Iterator[Any]:
        """``rows`` as the driver's cursor itself, which the caller closes: for the views'
        folds, which read a row per event of the journal -- no generator frame resumed between
        the driver and each row."""
        cur: Iterator[Any] = self.conn.execute(self.SQL[name], params)
        return cur

    def run(self, name: str, params: Sequence[Any] = ()) -> None:
        self.conn.execute(self.SQL[name], params)

    def many(self, name: str, rows: Iterable[Sequence[Any]]) -> None:
        self.conn.executemany(self.SQL[name], rows)

    # -- events ---------------------------------------------------------------------------------

    def head(self) -> tuple[int, str]:
        """(seq, hash) of the last row; (0, ``GENESIS``) when there is none."""
        row = self.one("head")
        return (0, GENESIS) if row is None else (int(row[0]), str(row[1]))

    def insert_events(self, rows: list[tuple[Any, ...]]) -> None:
        """Rows as ``chain.EVENT_COLUMNS`` (the schema checks each extends the chain), and the
        ``linked_calls`` rows they name, in the same transaction and before them (the schema
        refuses a row holding ``rows.LINKED_TAIL`` that the table has no row for): every
        writer -- a broker's ``Txn``, ``migrate`` -- inserts through here."""
        named = linked_call_rows(rows, seq=0, iid=2, text=8)
        if named:  # first: the events' insert trigger looks for them (``rows.index_keys``)
            self.many("insert_linked_calls", named)
        if len(rows) == 1:
            self.run("insert_event", rows[0])
        else:
            self.many("insert_event", rows)

    def fill_linked_calls(self, page: int = 10_000) -> int:
        """Index in ``linked_calls`` every stored row naming a linked call: once, in the
        transaction that gives a journal from before it the table (decoding each row as the
        check does: no database JSON function, which a row that is not JSON would make fail; a
        SQLite row that is not UTF-8 read leniently: ``SqliteBackend.create``).
        Read ``page`` rows at a time (psycopg holds a whole result in memory).  Returns how
        many rows were read."""
        read, after = 0, 0
        while True:
            rows = [tuple(row) for row in self.rows("linked_candidates", (after, page))]
            # (An invocation_id someone filled with bytes that are not UTF-8, read leniently:
            # its record is altered, and no writer's check reads it.)
            named = [r for r in linked_call_rows(rows) if _encodes(r[0])]
            if named:
                self.many("insert_linked_calls", named)
            read += len(rows)
            if len(rows) < page:
                return read
            after = rows[-1][0]

    def index_linked_calls(self, where: str) -> None:
        """``fill_linked_calls``, timed and logged: the once-only step of every backend's
        upgrade to ``linked_calls`` (``SqliteBackend.create``, ``PostgresBackend.create``)."""
        started = time.monotonic()
        read = self.fill_linked_calls()
        log.info("journal %s: indexed the linked calls of %d events in %.1f s (once)",
                 where, read, time.monotonic() - started)  # fmt: skip

    def invocation_events(self, iid: str, through: int | None = None) -> Iterator[Any]:
        if through is None:
            return self.rows("invocation_events", (iid,))
        return self.rows("invocation_events_through", (iid, max(0, min(through, _LAST_SEQ))))

    def invocation_events_page(self, iid: str, from_seq: int, limit: int) -> Iterator[Any]:
        """``iid``'s rows from seq ``from_seq``, at most ``limit``, by seq."""
        first = max(0, min(from_seq, _LAST_SEQ))
        return self.rows("invocation_events_page", (iid, first, max(0, min(limit, _LAST_SEQ))))

    def stored_linked_calls(self) -> Iterator[Any] | None:
        """Every ``linked_calls`` row (invocation_id, call_sha256, seq), by seq, for ``verify``;
        None for a journal from before the table (no row of it is expected), nothing for one that
        records a schema with it and has lost it."""
        if self.one("linked_calls_table")[0]:
            return self._linked_calls_paged()
        schema = self.meta("schema")
        if schema is not None and schema.isdigit() and int(schema) >= self.LINKED_SCHEMA:
            return iter(())
        return None

    def _linked_calls_paged(self) -> Iterator[Any]:
        """``linked_calls``' rows by seq, ``LINKED_WINDOW`` seqs a query (PostgreSQL's
        client-side cursor holds a whole result in memory: the table read at once would be a
        row per call any event names); the next window starts at the next stored seq, so rows
        planted far from the events (past the head, or below 0) cost one query each, not a
        walk to them."""
        low = -_LAST_SEQ - 1
        while True:
            high = min(low + self.LINKED_WINDOW - 1, _LAST_SEQ)
            yield from self.rows("linked_calls_rows", (low, high))
            found = None if high == _LAST_SEQ else self.one("linked_calls_next", (high,))
            if found is None or found[0] is None:
                return
            low = int(found[0])

    def attrs_naming(self, iid: str, call: str) -> Iterator[Any]:
        """The attrs (as stored) of ``iid``'s rows whose attrs name ``call`` under a linked
        attribute (``linked_calls``; the caller decodes and checks each): one index seek, the
        same cost whatever the record's length."""
        return self.rows("attrs_naming", (iid, call_key(call)))

    def events_naming(self, iid: str, call: str) -> Iterator[Any]:
        """``iid``'s rows (``EVENT_READ_COLUMNS``, by seq) whose attrs name ``call`` under a
        linked attribute (``attrs_naming``'s seek; the caller checks each row's attrs)."""
        return self.rows("events_naming", (iid, call_key(call)))

    def events_of(self, iids: Sequence[str]) -> Iterator[Any]:
        """The events of several invocations (``EVENT_READ_COLUMNS``), by seq: one query for
        a batch's invocations instead of one each (a round trip each on a database)."""
        marks = ",".join([self.PLACEHOLDER] * len(iids))
        sql = (
            f"SELECT {EVENT_READ_COLUMNS} FROM events WHERE invocation_id IN ({marks}) ORDER BY seq"
        )
        cur = self.conn.execute(sql, tuple(iids))
        try:
            yield from cur
        finally:
            cur.close()

    def fold_rows_of(self, iids: Sequence[str], through: int) -> Iterator[Any]:
        """The events of several invocations up to seq ``through``, as ``FOLD_COLUMNS``
        rows grouped by invocation, by seq within one (a ``cursor``: close it) -- through
        ``events_invocation``, for ``summary.SessionSummary``."""
        marks = ",".join([self.PLACEHOLDER] * len(iids))
        sql = (
            f"SELECT {FOLD_COLUMNS} FROM events WHERE invocation_id IN ({marks}) AND seq <= "
            f"{self.PLACEHOLDER} ORDER BY invocation_id, seq"
        )
        cur: Iterator[Any] = self.conn.execute(sql, (*iids, through))
        return cur

    def scan_events(self, session: str | None = None) -> Iterator[Any]:
        """Every event (of ``session``, if given) as ``EVENT_READ_COLUMNS``, by seq."""
        if session is None:
            return self.rows("scan_events")
        return self.rows("session_events", (session,))

    def grouped_events(self, session: str | None = None) -> Iterator[Any]:
        """``scan_events``' events grouped by invocation (by seq within one), the invocations in
        order of their first event, as ``FOLD_COLUMNS`` rows (a ``cursor``: close it)."""
        if session is None:
            return self.cursor("grouped_events")
        return self.cursor("grouped_session_events", (session, session))

    def action_spans(self, parts: int, min_events: int) -> tuple[list[int], int] | None:
        """Cut points splitting ``grouped_events``' invocations into ``parts`` runs of about
        as many invocations, and the last seq they read through (``grouped_span``), for a
        view folded by several processes; None when the journal has fewer than ``min_events``
        events or the backend cannot read a span (this one: it cannot)."""
        return None

    def grouped_span(self, first: int, before: int, through: int) -> Iterator[Any]:
        """``grouped_events``' rows of the invocations whose first event's seq is in
        ``[first, before)``, their events up to ``through`` (``action_spans``)."""
        raise NotImplementedError

    def newest_grouped(self, limit: int, session: str | None = None) -> Iterator[Any]:
        """``grouped_events``' rows of its last ``limit`` invocations only (of ``session``'s
        events, if given), in the same order, each as ``(total, *FOLD_COLUMNS)``: ``total`` is
        how many invocations ``grouped_events`` has in all (a ``cursor``: close it).  No row
        when there are no invocations or ``limit`` is 0 (``invocation_count`` then)."""
        if session is None:
            return self.cursor("newest_grouped", (limit,))
        return self.cursor("newest_session_grouped", (session, session, session, limit, session))

    def newest_page(self, limit: int) -> Iterator[Any]:
        """``newest_grouped(limit)``'s rows, each led by NULL: no count made."""
        return self.cursor("newest_page", (limit,))

    def invocation_count(self, session: str | None = None) -> int:
        """How many invocations ``grouped_events`` has (of ``session``'s events, if given)."""
        if session is None:
            return int(self.one("invocation_count")[0])
        return int(self.one("session_invocation_count", (session,))[0])

    def event_rows(self, first: int = 1, last: int | None = None) -> Iterator[Any]:
        """Whole rows (``chain.EVENT_COLUMNS``) from ``first`` through ``last`` (or the end)."""
        if first <= 1 and last is None:
            return self.rows("all_event_rows")
        return self.rows("event_rows", (first, last if last is not None else 2**62))

    def touched_after(self, seq: int) -> set[str]:
        """The invocations with an event after ``seq`` (what another writer appended)."""
        return {str(r[0]) for r in self.rows("touched_after", (seq,))}

    def approvals_between(self, after: int, through: int) -> dict[str, bool]:
        """The invocations an approval was asked or granted for in ``(after, through]``, each
        with whether a grant (APPROVAL_GRANTED) of it is among those rows."""
        out: dict[str, bool] = {}
        for iid, kind in self.rows("approvals_between", (after, through)):
            out[str(iid)] = out.get(str(iid), False) or kind == "APPROVAL_GRANTED"
        return out

    def hash_at(self, seq: int) -> str | None:
        row = self.one("hash_at", (seq,))
        return None if row is None else str(row[0])

    def event_at(self, seq: int) -> tuple[str, str, Any] | None:
        """(kind, invocation_id, attrs) of the row at ``seq``."""
        row = self.one("event_at", (seq,))
        return None if row is None else (row[0], row[1], row[2])

    def sealed_at(self, seq: int, audit: bool) -> tuple[str, str, bytes | None] | None:
        """(invocation_id, kind, sealed payload or its auditor copy) of the row at ``seq``."""
        row = self.one("audit_at" if audit else "payload_at", (seq,))
        if row is None:
            return None
        sealed = row[2]
        if sealed is not None and not isinstance(sealed, bytes | bytearray | memoryview):
            copy = "auditor copy" if audit else "payload"
            raise AlteredRow(f"the event row at seq {seq} was altered: its {copy} is not bytes")
        return str(row[0]), str(row[1]), None if sealed is None else bytes(sealed)

    # -- leases and idempotency -----------------------------------------------------------------

    def lease(self, iid: str) -> Any:
        return self.one("lease", (iid,))

    def lease_now(self) -> float | None:
        """The clock every lease on this journal is taken, renewed and judged by, read inside
        the transaction: None where the journal's own clock is that clock (SQLite: one host);
        the database's where brokers on several hosts share it (``PostgresTables``) -- so a
        broker whose clock is skewed cannot judge another's live lease expired."""
        return None

    def put_lease(self, iid: str, holder: str, generation: int, expires: float, seq: int) -> None:
        self.run("put_lease", (iid, holder, generation, expires, seq))

    def idempotency(self, scope: str, key: str) -> Any:
        return self.one("idempotency", (scope, key))

    def insert_idempotency(self, row: Sequence[Any]) -> None:
        """A row as ``IDEMPOTENCY_COLUMNS``."""
        self.run("insert_idempotency", row)

    def accepted_with_key(self, scope: str, key: str) -> tuple[int, str] | None:
        """(seq, invocation) of the first chained ACTION_ACCEPTED naming ``key`` in ``scope``
        (``bindings.py``: a key with no binding row that an event names was unbound by
        someone), or None -- also on a backend with no index of the events by key to ask
        cheaply (this one: PostgreSQL, whose brokers' role cannot delete a binding)."""
        return None

    # -- results --------------------------------------------------------------------------------

    def marker(self, iid: str) -> tuple[int, str, bytes, bytes] | None:
        """(seq, sha256, streams JSON, sealed summary) of the invocation's completeness marker."""
        row = self.one("marker", (iid,))
        if row is None:
            return None
        return row[0], row[1], _bytes(row[2]), bytes(row[3])

    def committed_at(self, iid: str) -> int | None:
        """The seq of the invocation's RESULT_COMMITTED event, or None if it has none."""
        row = self.one("committed_at", (iid,))
        return None if row is None else row[0]

    def markers(self) -> Iterator[tuple[str, int, str, str, bytes]]:
        for iid, seq, sha, streams, summary in self.rows("markers"):
            yield iid, seq, sha, streams, bytes(summary)

    def has_result(self, iid: str) -> bool:
        return self.one("has_result", (iid,)) is not None

    def insert_result(self, iid: str, seq: int, sha: str, streams: str, summary: bytes) -> None:
        """The marker; its chunks stop being a reclaim's candidate in the same transaction."""
        self.run("insert_result", (iid, seq, sha, streams, summary))
        self.run("disown_chunks", (iid,))

    def drop_stream(self, iid: str, stream: str) -> None:
        """Forget a stream's chunks and auditor copies (a new attempt starts it over)."""
        for table in _CHUNKS.values():
            self.run(f"drop_{table}", (iid, stream))

    def unmarked_chunk_owners(self) -> list[str]:
        """The invocations with chunk rows (or auditor copies) stored while they had no
        completeness marker and not reclaimed since (``chunk_owners``; ``Journal.reclaim_chunks``
        checks each again): a read of that small table, not of every chunk row."""
        return [iid for (iid,) in self.rows("unmarked_chunk_owners")]

    def fill_chunk_owners(self) -> None:
        """Name in ``chunk_owners`` every invocation with chunk rows and no marker: once, in the
        transaction that gives a journal from before it the table."""
        self.run("fill_chunk_owners")

    def disown_chunks(self, iid: str) -> None:
        """Take the invocation out of ``chunk_owners`` (its marker is stored, or its chunks are
        dropped)."""
        self.run("disown_chunks", (iid,))

    def chunk_sizes(self, iid: str) -> tuple[int, int, int]:
        """(chunk rows, auditor copies, their stored bytes) of an invocation."""
        counts, size = [], 0
        for table in _CHUNKS.values():
            n, b = self.one(f"sizes_{table}", (iid,))
            counts.append(int(n))
            size += int(b)
        return counts[0], counts[1], size

    def drop_unmarked_chunks(self, iid: str) -> None:
        """Forget every chunk row and auditor copy of an invocation without a marker."""
        for table in _CHUNKS.values():
            self.run(f"drop_all_{table}", (iid,))
        self.disown_chunks(iid)

    def put_chunk(
        self, audit: bool, iid: str, stream: str, idx: int, data: bytes, *, own: bool = True
    ) -> None:
        """Store a chunk.  A stream's chunk 0 is always stored first (it starts the stream
        over), so with it the invocation is named in ``chunk_owners`` -- unless its marker is
        stored already (the auditor's copy of the summary, written with the marker; a copy
        into a new journal, ``migrate.py``).  ``own=False``: the caller writes the marker in
        this same transaction (a segment writer's commit, ``segments.py``), which would take
        the name out again -- a page written twice for nothing in each such commit."""
        self.run(f"put_{_CHUNKS[audit]}", (iid, stream, idx, data))
        if idx == 0 and own:
            self.run("own_chunks", (iid, iid))

    def chunks(self, audit: bool, iid: str) -> Iterator[tuple[str, int, bytes]]:
        """(stream, idx, stored blob) of the invocation's chunks (``audit``: auditor copies),
        by stream and idx."""
        for stream, idx, data in self.rows(f"chunks_{_CHUNKS[audit]}", (iid,)):
            yield stream, idx, bytes(data)

    def chunk(self, audit: bool, iid: str, stream: str, idx: int) -> bytes | None:
        row = self.one(f"chunk_{_CHUNKS[audit]}", (iid, stream, idx))
        return None if row is None else bytes(row[0])

    def every_chunk(self, audit: bool) -> Iterator[tuple[str, str, int, bytes]]:
        """Every stored chunk (``audit``: auditor copy): (invocation_id, stream, idx, blob)."""
        for iid, stream, idx, data in self.rows(f"every_{_CHUNKS[audit]}"):
            yield iid, stream, idx, bytes(data)

    # -- checkpoints ----------------------------------------------------------------------------

    def insert_checkpoint(self, cp: Checkpoint) -> None:
        self.run(
            "insert_checkpoint",
            (cp.seq, cp.hash, cp.prev, cp.at, int(cp.adopted), cp.key_id, cp.signature),
        )

    def latest_checkpoint(self) -> Checkpoint | None:
        row = self.one("latest_checkpoint")
        return None if row is None else _checkpoint(row)

    def checkpoint_from(self, seq: int) -> Checkpoint | None:
        """The first checkpoint at or after ``seq``."""
        row = self.one("checkpoint_from", (seq,))
        return None if row is None else _checkpoint(row)

    def checkpoints(self) -> Iterator[Checkpoint]:
        for row in self.rows("checkpoints"):
            yield _checkpoint(row)

    def checkpoints_after(self, seq: int) -> Iterator[Checkpoint]:
        """The checkpoints after ``seq``, by seq."""
        for row in self.rows("checkpoints_after", (seq,)):
            yield _checkpoint(row)

    def checkpoint_count(self) -> int:
        return int(self.one("checkpoint_count")[0])

    # -- meta and the signing keys it records ---------------------------------------------------

    def meta(self, name: str) -> str | None:
        row = self.one("meta", (name,))
        return None if row is None else str(row[0])

    def meta_prefixed(self, prefix: str) -> dict[str, str]:
        """Meta entries whose name starts with ``prefix`` (no ``%`` or ``_`` in it)."""
        return {str(n): str(v) for n, v in self.rows("meta_like", (prefix + "%",))}

    def insert_meta(self, name: str, value: str) -> None:
        self.run("insert_meta", (name, value))

    def leases(self) -> Iterator[Any]:
        """Every lease row: (invocation_id, holder, generation, expires_at, seq)."""
        return self.rows("all_leases")

    def idempotency_rows(self) -> Iterator[Any]:
        return self.rows("all_idempotency")


def _bytes(value: Any) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)
