"""The PostgreSQL backend: several brokers -- on one host or many -- sharing one journal, one event
order, one idempotency-key space and leases that fence a retry across machines
(``[journal] url = "postgresql://..."``; docs/journal.md, "Several brokers on one journal").

One global order.  Every write transaction begins by taking a transaction-scoped advisory lock
on the chain head (``pg_advisory_xact_lock``) and only then reads the head, so concurrent brokers
queue for the head instead of forking it; ``seq`` comes from that order.  The lock is released by
the transaction's end, committed or rolled back -- or by PostgreSQL ending the session of a
broker that died, so a killed broker never holds it.  Each broker still commits its queued
writes in one transaction (group commit), so the lock is taken per batch, not per event.  The
projection check, the lease generation and the idempotency binding are read inside that
transaction (READ COMMITTED: each statement sees every commit before the lock was granted), so
DISPATCH_STARTED is checked against the current lease exactly as on SQLite.

Durability.  A barrier commits with ``synchronous_commit = on`` (the commit's WAL is flushed
before ``COMMIT`` returns); other batches with ``off``: visible at once, durable with the next
flush, which a later barrier's commit forces for every earlier record.

Append-only in the database.  Triggers refuse ``UPDATE``, ``DELETE`` and ``TRUNCATE`` on events,
checkpoints and results, and a row that does not extend the chain by one (the primary key also
turns a concurrent writer that skipped the lock into an error, never a fork).  Whoever owns the
tables can still drop the triggers: run the brokers as a role that owns nothing and holds only
the privileges ``grant_statements`` lists -- then the signed checkpoints, and ``verify``, guard
against the owner alone.

A lost connection (PostgreSQL restarted, the network cut) is ``lost``: the writer reconnects and
proves or retries what was in flight (``commit.py``).  Messages name the database by its URL with
the password removed (``redact``); the driver's messages are reduced to their primary line, with
any password scrubbed.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import psycopg
from psycopg import conninfo as pg_conninfo
from psycopg.pq import TransactionStatus

from ..text import printable
from .backend import redact, refuse_newer_schema
from .chain import GENESIS
from .errors import HeadHeld, JournalError, JournalNotDurable, JournalUnavailable
from .rows import LINKED_REFUSED, LINKED_TAIL
from .tables import OLDER_BINDINGS, SQL, Tables, newest_statements

__all__ = [
    "SCHEMA_VERSION",
    "PostgresBackend",
    "PostgresTables",
    "grant_statements",
    "url_password",
]

log = logging.getLogger("affidavit.journal")

SCHEMA_VERSION = 7
"""2: the table ``chunk_owners``; 3: the columns ``idempotency.send_by`` (``IdempotencyRecord``:
when the binder's first attempt may send no more) and ``idempotency.target`` (its target, which
a fence names) -- a broker of schema 2 refuses the journal, as it would bind without them and
judge another's binding by its own window; 4: no table or column, the fence's rules
(``statemachine.FENCE_RULES``) -- a broker of schema 3 refuses the journal, as it would write its
binder's preamble into a record fenced under them and go on to send; 5: the table
``linked_calls`` (a claim's check seeks the rows naming its call: ``Tables.attrs_naming``),
filled by every writer with the rows it inserts and, once, from the events already there -- a
broker of schema 4 refuses the journal, as its rows would go unindexed; 6: no table or column,
the rules of APPROVAL_REVOKED (an operator takes a grant back before it is sent) -- a broker of
schema 5 refuses the journal, as it reads that row as altered and would send the revoked grant's
request, and skip the gate's re-check of the granting operator; 7: no table or column, the
triggers' functions pin their ``search_path`` (``FUNCTION_PATH``) and every broker its
connections' (``SEARCH_PATH``) -- a broker of schema 6 refuses the journal, as it reads and
writes whatever tables its role's ``search_path`` names first (a co-tenant's schema named like
the role) and takes the chain head under that schema's key."""
FUNCTION_PATH = "pg_catalog, public, pg_temp"
"""The triggers' functions' own ``search_path``: ``events`` and ``linked_calls`` in their body
are the journal's whatever the inserting session's path -- a temporary ``events`` of its own
(``pg_temp`` is searched first unless named) no longer decides which row extends the chain."""
SESSION_INDEX = "events_session"
SESSION_INDEX_DDL = (
    f"CREATE INDEX IF NOT EXISTS {SESSION_INDEX} ON events (session_id, seq, invocation_id)"
)
SESSION_INDEX_BUILD = SESSION_INDEX_DDL.replace("INDEX", "INDEX CONCURRENTLY", 1)
"""How a journal from before the index gains it: beside the brokers' writes, not in their way."""
INDEX_WAIT_MS = 10_000
"""How long the build waits for a lock or for older transactions (``lock_timeout``) before it
gives up, logged; the journal opens without the index all the same."""

_MAX_LOCK_TIMEOUT_MS = 2**31 - 1
"""The longest ``lock_timeout`` PostgreSQL takes (an int of milliseconds: ~24.8 days)."""
_LOCK = 0x61666676  # "affv": the chain head's advisory lock, with the schema's hash as 2nd key
_INDEX_LOCK = 0x61666669  # "affi": one build of the session index at a time (session-scoped)
JOURNAL_SCHEMA = "public"
"""The PostgreSQL schema holding the journal's tables: always ``public`` (no setting names
another)."""
SEARCH_PATH = f"{JOURNAL_SCHEMA}, pg_temp"
"""Every connection's ``search_path``, set before its first statement (``_pin``) and again in
every write transaction (``begin``): the server's default ``"$user", public`` lets any role with
CREATE on the database make a schema named like the broker's role and same-named tables in it,
which the unqualified names of every statement would then mean -- the broker writing and reading
another's tables, its triggers absent, ``verify`` reading them too.  The journal's schema first
(``CREATE`` makes its tables there); ``pg_catalog`` unnamed, so searched before it -- which
settles only ties: a function or operator made in ``public`` whose argument types match a call
better than the built-in's is still picked.  The remedy is the deployment's, ``REVOKE CREATE ON
SCHEMA public FROM PUBLIC`` (docs/journal.md); ``pg_temp`` named last, so a table of the
session's own temporary schema never stands in for one of the journal's."""
_KEY2 = f"pg_catalog.hashtext('{JOURNAL_SCHEMA}')"
"""The advisory locks' second key: the journal's schema by name, never ``current_schema()``
(what a ``search_path`` made it).  The same number a broker whose ``current_schema()`` was
``public`` took, so brokers of before and after this pin queue on one head."""
_APPEND_ONLY = ("events", "checkpoints", "results", "linked_calls")
_TABLES = (
    "meta",
    "events",
    "result_chunks",
    "chunk_owners",
    "results",
    "result_audit",
    "checkpoints",
    "leases",
    "idempotency",
    "linked_calls",
)
"""Every table of the schema: a writer refuses a journal where one is UNLOGGED."""

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (
  name  TEXT PRIMARY KEY,
  value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
  seq           BIGINT PRIMARY KEY CHECK (seq >= 1),
  at            DOUBLE PRECISION NOT NULL,
  invocation_id TEXT NOT NULL,
  session_id    TEXT,
  kind          TEXT NOT NULL,
  source        TEXT NOT NULL,
  observer      TEXT,
  observer_seq  BIGINT,
  attrs         TEXT NOT NULL,
  payload       BYTEA,
  audit         BYTEA,
  prev_hash     TEXT NOT NULL,
  hash          TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_invocation ON events (invocation_id, seq);
{SESSION_INDEX_DDL};
CREATE TABLE IF NOT EXISTS result_chunks (
  invocation_id TEXT NOT NULL,
  stream        TEXT NOT NULL,
  idx           INTEGER NOT NULL CHECK (idx >= 0),
  data          BYTEA NOT NULL,
  PRIMARY KEY (invocation_id, stream, idx)
);
CREATE TABLE IF NOT EXISTS chunk_owners (
  invocation_id TEXT PRIMARY KEY
);
CREATE TABLE IF NOT EXISTS results (
  invocation_id TEXT PRIMARY KEY,
  seq           BIGINT NOT NULL UNIQUE REFERENCES events (seq),
  sha256        TEXT NOT NULL,
  streams       TEXT NOT NULL,
  summary       BYTEA NOT NULL
);
CREATE TABLE IF NOT EXISTS result_audit (
  invocation_id TEXT NOT NULL,
  stream        TEXT NOT NULL,
  idx           INTEGER NOT NULL CHECK (idx >= 0),
  data          BYTEA NOT NULL,
  PRIMARY KEY (invocation_id, stream, idx)
);
CREATE TABLE IF NOT EXISTS checkpoints (
  seq           BIGINT PRIMARY KEY CHECK (seq >= 1),
  hash          TEXT NOT NULL,
  prev          BIGINT NOT NULL,
  at            DOUBLE PRECISION NOT NULL,
  adopted       INTEGER NOT NULL,
  key_id        TEXT NOT NULL,
  signature     BYTEA NOT NULL
);
CREATE TABLE IF NOT EXISTS linked_calls (
  invocation_id TEXT NOT NULL,
  call_sha256   BYTEA NOT NULL,
  seq           BIGINT NOT NULL,
  PRIMARY KEY (invocation_id, call_sha256, seq)
);
CREATE INDEX IF NOT EXISTS linked_calls_seq ON linked_calls (seq);
CREATE TABLE IF NOT EXISTS leases (
  invocation_id TEXT PRIMARY KEY,
  holder        TEXT NOT NULL,
  generation    BIGINT NOT NULL,
  expires_at    DOUBLE PRECISION NOT NULL,
  seq           BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS idempotency (
  scope         TEXT NOT NULL,
  key           TEXT NOT NULL,
  fingerprint   TEXT NOT NULL,
  invocation_id TEXT NOT NULL,
  expires_at    DOUBLE PRECISION,
  created_at    DOUBLE PRECISION NOT NULL,
  send_by       DOUBLE PRECISION,
  target        TEXT,
  PRIMARY KEY (scope, key)
);
ALTER TABLE idempotency ADD COLUMN IF NOT EXISTS send_by DOUBLE PRECISION;
ALTER TABLE idempotency ADD COLUMN IF NOT EXISTS target TEXT;
CREATE OR REPLACE FUNCTION affidavit_extend_chain() RETURNS trigger LANGUAGE plpgsql
  SET search_path = {FUNCTION_PATH} AS $$
DECLARE
  last_seq  BIGINT;
  last_hash TEXT;
BEGIN
  SELECT e.seq, e.hash INTO last_seq, last_hash FROM events e ORDER BY e.seq DESC LIMIT 1;
  IF NEW.seq IS DISTINCT FROM coalesce(last_seq, 0) + 1
     OR NEW.prev_hash IS DISTINCT FROM coalesce(last_hash, '{GENESIS}') THEN
    RAISE EXCEPTION 'journal rows must extend the hash chain by one'
      USING ERRCODE = 'integrity_constraint_violation';
  END IF;
  IF strpos(NEW.attrs, '{LINKED_TAIL}') > 0 AND NOT EXISTS (SELECT 1 FROM linked_calls l
       WHERE l.seq = NEW.seq AND l.invocation_id = NEW.invocation_id) THEN
    RAISE EXCEPTION '{LINKED_REFUSED}' USING ERRCODE = 'integrity_constraint_violation';
  END IF;
  RETURN NEW;
END $$;
CREATE OR REPLACE FUNCTION affidavit_append_only() RETURNS trigger LANGUAGE plpgsql
  SET search_path = {FUNCTION_PATH} AS $$
BEGIN
  RAISE EXCEPTION 'journal % are append-only', TG_TABLE_NAME
    USING ERRCODE = 'integrity_constraint_violation';
END $$;
CREATE OR REPLACE TRIGGER events_extend_chain BEFORE INSERT ON events
  FOR EACH ROW EXECUTE FUNCTION affidavit_extend_chain();
""" + "".join(
    f"""CREATE OR REPLACE TRIGGER {t}_no_change BEFORE UPDATE OR DELETE ON {t}
  FOR EACH ROW EXECUTE FUNCTION affidavit_append_only();
CREATE OR REPLACE TRIGGER {t}_no_truncate BEFORE TRUNCATE ON {t}
  FOR EACH STATEMENT EXECUTE FUNCTION affidavit_append_only();
"""
    for t in _APPEND_ONLY
)

_READ_ONLY = ("events", "checkpoints", "results", "meta", "idempotency", "linked_calls")
_WRITABLE = ("result_chunks", "result_audit", "chunk_owners", "leases")


_GRANTED = {
    **{t: "SELECT, INSERT" for t in _READ_ONLY},
    **{t: "SELECT, INSERT, UPDATE, DELETE" for t in _WRITABLE},
}
_NEEDED = tuple((t, p) for t, ps in _GRANTED.items() for p in ps.split(", "))
"""Every (table, privilege) pair ``grant_statements`` grants: what a writer's open checks."""


def grant_statements(role: str) -> list[str]:
    """What a broker role needs -- and nothing more: it appends to events, checkpoints, results,
    idempotency and meta (its signing key) but can neither change nor delete them, nor drop a
    trigger (only the tables' owner can).  Run by the owner after ``affidavit journal init``."""
    ident = psycopg.sql.Identifier(role).as_string(None)
    return [
        f"GRANT USAGE ON SCHEMA public TO {ident}",
        f"GRANT SELECT, INSERT ON {', '.join(_READ_ONLY)} TO {ident}",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON {', '.join(_WRITABLE)} TO {ident}",
    ]


def url_password(url: str) -> str | None:
    """The password a libpq URL or conninfo carries (in its user part or a ``password=``
    parameter), or None."""
    try:
        value = pg_conninfo.conninfo_to_dict(url).get("password")
        return str(value) if value else None
    except psycopg.Error:
        return None


class PostgresTables(Tables):
    """The tables on PostgreSQL.  Its text holds no NUL (0x00), and the driver refuses to send
    one: a read keyed by a caller's text with a NUL (``/v1/invocations/%00``, a ``?session=``
    filter) matches no stored row -- it answers none, as SQLite does, rather than fail as a
    journal that cannot be read; a count keyed so counts none.  (Every read with a text
    parameter is keyed by it; writes never carry a NUL: ids are the broker's, sessions checked
    printable.)"""

    # count(DISTINCT) sorts every id (893 ms over 1M events); a GROUP BY hashes them (190 ms).
    SQL: ClassVar[dict[str, str]] = Tables.dialect(
        {
            **SQL,
            **newest_statements(
                "count(*) FROM (SELECT invocation_id FROM events{} GROUP BY invocation_id) AS d"
            ),
            "linked_calls_table": "SELECT count(*) FROM pg_catalog.pg_class WHERE oid = "
            "pg_catalog.to_regclass('linked_calls')",
            "lease_now": "SELECT extract(epoch FROM pg_catalog.clock_timestamp())::float8",
            **OLDER_BINDINGS,
        },
        "%s",
    )
    PLACEHOLDER: ClassVar[str] = "%s"

    __slots__ = ("_older",)

    def __init__(self, conn: Any, older: bool = False) -> None:
        super().__init__(conn)
        self._older = older
        """A read-only connection to a journal that recorded a schema before 3 when it
        connected: its binding rows have no ``send_by`` nor ``target`` (no writer has upgraded
        it), read as NULL.  (Unlike SQLite, a failed statement would abort the read's
        transaction: decided beforehand, by the schema, not by the error.)"""

    def idempotency(self, scope: str, key: str) -> Any:
        if self._older:
            return self.one("idempotency_older", (scope, key))
        return super().idempotency(scope, key)

    def idempotency_rows(self) -> Iterator[Any]:
        return self.rows("all_idempotency_older") if self._older else super().idempotency_rows()

    def one(self, name: str, params: Sequence[Any] = ()) -> Any:
        return None if _holds_nul(params) else super().one(name, params)

    def rows(self, name: str, params: Sequence[Any] = ()) -> Iterator[Any]:
        return iter(()) if _holds_nul(params) else super().rows(name, params)

    def cursor(self, name: str, params: Sequence[Any] = ()) -> Iterator[Any]:
        return iter(()) if _holds_nul(params) else super().cursor(name, params)

    def invocation_count(self, session: str | None = None) -> int:
        if session is not None and _holds_nul((session,)):
            return 0  # the one count keyed by a caller's text: of nothing stored
        return super().invocation_count(session)

    def lease_now(self) -> float | None:
        # clock_timestamp(), not now(): the transaction may have waited for the chain head.
        return float(self.one("lease_now")[0])

    def many(self, name: str, rows: Iterable[Sequence[Any]]) -> None:
        with self.conn.cursor() as cur:
            cur.executemany(self.SQL[name], rows)


_OWNER_OPENS = (
    "open it once as the owner (any writer does, e.g. `affidavit journal reclaim --journal "
    "OWNER_URL --config ...`)"
)
_GRANT_LINKED = "GRANT SELECT, INSERT ON linked_calls TO {role}"
_GRANT_OWNERS = "GRANT SELECT, INSERT, UPDATE, DELETE ON chunk_owners TO {role}"


def _role(conn: Any) -> str:
    """The connection's role as SQL names it (a quoted identifier), for a GRANT to copy."""
    return '"' + str(conn.info.user).replace('"', '""') + '"'


def _holds_nul(params: Sequence[Any]) -> bool:
    return any(isinstance(p, str) and "\x00" in p for p in params)


_DEFAULTS = {
    # A broker that loses the server mid-commit must find out, not wait for hours: TCP
    # keepalives and a user timeout bound how long a dead peer goes unnoticed.
    "connect_timeout": "5",
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "30000",
    "application_name": "affidavit",
}


_CLIENT_HOST = re.compile(r'for host "[^"]*"')
"""The server's words for a connection ``pg_hba.conf`` turns away (``no pg_hba.conf entry for
host "10.0.0.7", user ...``): the address is the *client's*, this broker's host -- no part of
the journal's URL, so ``engine.unplaced`` would not find it in what a caller is told."""
_SERVER_SAID = re.compile(r"\b(?:FATAL|ERROR|PANIC):\s")
"""A failed connection attempt's message quoting the server's own error."""
_SERVER_AWAY = (
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is in recovery mode",
    "the database system is not yet accepting connections",
    "the database system is not accepting connections",
)
"""The server's words (57P03 cannot_connect_now) for a database that will take connections
again: away, like no server at all."""


_SCHEMA_ROW = "SELECT value FROM meta WHERE name = 'schema'"

_TRANSIENT_CLASSES = ("40", "53")
"""SQLSTATE classes of a read worth trying again: transaction rollback (serialization failure,
deadlock) and insufficient resources (too many connections, out of memory, disk full)."""
_TRANSIENT_STATES = frozenset({"57014", "55P03", "55006"})
"""query_canceled (a statement timeout, an operator's cancel), lock_not_available,
object_in_use."""


def _head_held(ms: int, holder: str = "") -> str:
    """The refusal of a write that waited ``ms`` for the chain head in vain: what happened, the
    setting that bounds the wait and who held it (``_holder``) -- never the database's URL (a
    caller may read it)."""
    return (
        "another session held the journal's chain head longer than [journal] reconnect lets a"
        f" write wait for it ({ms / 1000:g} s): not committed, nothing of the write is durable"
        + (f"; held by {holder}" if holder else "")
    )


def _holder(conn: Any) -> str:
    """``pid N, role R``: the session holding the chain head's advisory lock, as ``pg_locks``
    and ``pg_stat_activity`` show it to this role -- any login role may take the lock, granted
    nothing; an operator ends it with ``pg_terminate_backend(N)``.  Empty when unreadable or
    released meanwhile.  A pid and a role name: never a password, nor a query's text."""
    try:
        row = conn.execute(
            "SELECT l.pid, a.usename FROM pg_catalog.pg_locks l "
            "LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 "
            "AND l.database = (SELECT oid FROM pg_catalog.pg_database "
            "WHERE datname = pg_catalog.current_database()) "
            f"AND l.classid = {_LOCK}::oid AND l.objid = ({_KEY2})::oid LIMIT 1"
        ).fetchone()
    except psycopg.Error:
        return ""
    if row is None:
        return ""
    # The role's name is another's text: shown escaped, never acting on a terminal or a log.
    return f"pid {row[0]}, role {printable(row[1]) if row[1] else 'unknown'}"


def _pin(conn: Any) -> None:
    """A new connection's first statement: ``SEARCH_PATH`` -- after every reconnect too, as
    each runs ``connect`` again."""
    conn.execute(f"SET search_path = {SEARCH_PATH}")


def _in_recovery(conn: Any) -> bool:
    """Whether the server is in recovery (a hot standby).  Catalog functions are named with
    their schema throughout: a function of the journal's schema, or one a ``search_path``
    puts first, never stands in for them."""
    return bool(conn.execute("SELECT pg_catalog.pg_is_in_recovery()").fetchone()[0])


class PostgresBackend:
    kind = "postgresql"
    shared = True
    # Every broker, on any host, reads every result: chunks stay in the tables.
    segments: Path | None = None
    multi_signer = True
    path: Path | None = None
    errors: tuple[type[BaseException], ...] = (psycopg.Error,)
    renew_after_refusal = True

    def __init__(
        self, url: str, *, reconnect_within: float = 10.0, idle_timeout_ms: int = 60_000
    ) -> None:
        self.where = redact(url)
        self._password = url_password(url)
        try:
            params = pg_conninfo.conninfo_to_dict(url)
        except psycopg.Error as exc:
            raise JournalError(f"not a PostgreSQL URL: {self.describe(exc)}") from None
        for k, v in _DEFAULTS.items():
            params.setdefault(k, v)
        self._conninfo = pg_conninfo.make_conninfo("", **params)
        self.reconnect_within = float(reconnect_within)
        self._pipes: dict[int, Any] = {}
        self._checked: dict[int, object] = {}
        """A ``tool`` connection's recorded schema when it connected."""
        self._idle_timeout_ms = int(idle_timeout_ms)
        self._index_due = False
        self.index_wait_ms = INDEX_WAIT_MS

    def tables(self, conn: Any) -> Tables:
        # A read-only reader (``tool``) of a journal no writer has upgraded to schema 3 (an
        # auditor's ``journal verify`` before the brokers are): its bindings without the columns.
        # Re-checked when the reader is taken again (``unchanged``).
        checked = self._checked.get(id(conn), SCHEMA_VERSION)
        return PostgresTables(conn, older=checked is None or int(str(checked)) < 3)

    def connect(self, role: str) -> psycopg.Connection[Any]:
        try:
            conn = psycopg.connect(self._conninfo, autocommit=True)
        except psycopg.Error as exc:
            # Away (no server, or one not yet taking connections): the same connect may succeed
            # later.  A server that answers and refuses (a wrong password, no such database)
            # will refuse again: that is the journal's configuration, not its availability.
            error = JournalUnavailable if self.away(exc) else JournalError
            raise error(f"cannot connect to journal {self.where}: {self.describe(exc)}") from None
        try:
            _pin(conn)
            # A session left idle inside a transaction (its broker gone quiet mid-write)
            # would hold the chain head for every broker: PostgreSQL ends it after this long.
            conn.execute(f"SET idle_in_transaction_session_timeout = {self._idle_timeout_ms}")
            if role == "reader":
                # The writing journal's own reads run on the broker's event loop (a call's
                # record, the gate's clock): a read the database keeps waiting (a lock another
                # session holds, a stalled server) would stall every call for as long.  It is
                # declined after the bound a write waits for the chain head (``ReadFailed``).
                ms = max(1, int(self.reconnect_within * 1000))
                conn.execute(f"SET statement_timeout = {ms}")
            if role == "tool":
                exists = conn.execute(
                    "SELECT pg_catalog.to_regclass('events') IS NOT NULL"
                ).fetchone()
                if not exists or not exists[0]:
                    raise JournalError(
                        f"no journal at {self.where} (create it with `affidavit init` or a "
                        "broker's first start)"
                    )
            schema = self._refuse_newer(conn)
            if role == "tool":
                self._checked[id(conn)] = schema
            if role in ("writer", "reader"):
                self._refuse_standby(conn)
            if role == "writer":
                self._refuse_not_durable(conn)
        except psycopg.Error as exc:
            conn.close()
            error = JournalUnavailable if self.lost(exc) else JournalError
            raise error(f"journal {self.where}: {self.describe(exc)}") from None
        except BaseException:
            conn.close()
            raise
        return conn

    def _refuse_newer(self, conn: Any) -> object:
        """A journal a newer broker wrote (a schema this one does not know) is neither written
        nor read: what this broker would make of it is not what it holds (as on SQLite).
        Returns the recorded schema (None without one: ``unchanged`` then never holds)."""
        if not conn.execute("SELECT pg_catalog.to_regclass('meta') IS NOT NULL").fetchone()[0]:
            return None
        row = conn.execute(_SCHEMA_ROW).fetchone()
        recorded = None if row is None else row[0]
        refuse_newer_schema(recorded, SCHEMA_VERSION, self.where)
        return recorded

    def unchanged(self, conn: Any) -> bool:
        """The schema the journal records is the one read at connect: another broker of the
        shared journal -- a newer one, its tables' owner -- may have upgraded it since, and
        this one would read it as the schema it knows.  One query."""
        checked = self._checked.get(id(conn))
        if checked is None or conn.closed:
            return False
        try:
            row = conn.execute(_SCHEMA_ROW).fetchone()
        except psycopg.Error:
            return False
        return row is not None and row[0] == checked

    def require_writer_file(self) -> None:
        pass  # a database, not a file a path names: nothing can be put in its place

    def bound_waits(self, conn: Any, seconds: float) -> None:
        conn.execute(f"SET lock_timeout = {max(1, int(seconds * 1000))}")

    def _refuse_standby(self, conn: Any) -> None:
        """A writer refuses a server in recovery (a hot standby a multi-host URL, a proxy or a
        failover reached): its advisory lock is its own, not the primary's chain head, and a
        re-read after a lost commit there could miss a COMMIT that landed on the primary (not
        yet replayed) and claim "not committed".  Away, as a server starting up is: the
        reconnect goes on within ``reconnect_within`` and takes the primary when it answers.
        The writing journal's own reader too: a call's record read behind the writer's
        commits (a DISPATCH_STARTED not yet replayed) is not the record.  A ``tool`` (an
        auditor's ``journal verify``) may read a standby."""
        if _in_recovery(conn):
            raise JournalUnavailable(
                f"journal {self.where}: the server is a standby in recovery (read-only); a "
                "broker writes only to the primary"
            )

    def _refuse_not_durable(self, conn: Any) -> None:
        """A writer refuses a server that would acknowledge a commit it may lose in a crash:
        DISPATCH_STARTED must be durable before the first byte is sent (seed).  ``fsync`` and
        ``full_page_writes`` are the server's; a table of the journal must not be UNLOGGED
        (crash recovery empties it); ``synchronous_commit`` is set per transaction
        (``begin``), so what is checked is that a transaction can ask for it."""
        fsync, fpw = conn.execute(
            "SELECT pg_catalog.current_setting('fsync'), "
            "pg_catalog.current_setting('full_page_writes')"
        ).fetchone()
        for name, value in (("fsync", fsync), ("full_page_writes", fpw)):
            if value != "on":
                raise JournalNotDurable(
                    f"journal {self.where}: refused: the server runs with {name} = {value}, so "
                    "a commit it acknowledges may be lost in a crash (DISPATCH_STARTED must be "
                    f"durable before anything is sent); set {name} = on (postgresql.conf or "
                    f"ALTER SYSTEM SET {name} = on) and reload the server"
                )
        unlogged = conn.execute(
            "SELECT c.relname FROM pg_catalog.pg_class c "
            "WHERE c.relpersistence <> 'p' AND c.oid = ANY("
            "ARRAY["
            + ", ".join(f"pg_catalog.to_regclass('{t}')" for t in _TABLES)
            + "]) ORDER BY 1"
        ).fetchall()
        if unlogged:
            # Crash recovery empties an UNLOGGED table: its acknowledged rows -- the leases and
            # bindings that keep a second send out, DISPATCH_STARTED itself -- would be gone.
            table = unlogged[0][0]
            raise JournalNotDurable(
                f"journal {self.where}: refused: table {table} is UNLOGGED, so PostgreSQL "
                "empties it in a crash (DISPATCH_STARTED must be durable before anything is "
                f"sent); run ALTER TABLE {table} SET LOGGED as the tables' owner"
            )
        conn.execute("BEGIN")
        try:
            conn.execute("SET LOCAL synchronous_commit = on")
            sync = conn.execute("SHOW synchronous_commit").fetchone()[0]
        finally:
            conn.execute("ROLLBACK")
        if sync != "on":
            raise JournalNotDurable(
                f"journal {self.where}: refused: a transaction asking for synchronous_commit = "
                f"on runs with {sync}; let the broker's role set synchronous_commit"
            )

    def close(self, conn: Any) -> None:
        self._checked.pop(id(conn), None)
        self._pipes.pop(id(conn), None)
        conn.close()

    def create(self, conn: Any) -> str | None:
        # The schema is several statements in one query: not in pipeline mode.
        pipe = self._pipes.pop(id(conn), None)
        if pipe is not None:
            pipe.__exit__(None, None, None)
        try:
            return self._create(conn)
        finally:
            if pipe is not None:
                again = conn.pipeline()
                again.__enter__()
                self._pipes[id(conn)] = again

    def _create(self, conn: Any) -> str | None:
        have = conn.execute("SELECT pg_catalog.to_regclass('meta') IS NOT NULL").fetchone()[0]
        found = None
        if have:
            row = conn.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone()
            found = None if row is None else row[0]
            if row is not None and int(row[0]) >= SCHEMA_VERSION:
                # Current: a broker role needs no DDL privilege to open it.
                if conn.execute("SELECT pg_catalog.to_regclass('linked_calls') IS NULL").fetchone()[
                    0
                ]:
                    self._remake_linked(conn, found)
                self._refuse_ungranted(conn)
                self._index_due = self._wants_index(conn)
                return found
        linked = conn.execute(
            "SELECT pg_catalog.to_regclass('linked_calls') IS NOT NULL"
        ).fetchone()[0]
        try:
            conn.execute(SCHEMA)
        except psycopg.errors.InsufficientPrivilege:
            if not have:
                raise
            # An older schema, opened by a broker role that owns nothing: say what to do -- at
            # schema 2 chunk_owners exists (and was granted: ``grant_statements``); the columns
            # are covered by the existing grants on idempotency; schema 4 is a number only,
            # which the broker role may not change (``meta``: no UPDATE); schema 5's table
            # is new, filled once by the owner, and granted; schema 6 is a number only;
            # schema 7 replaces the triggers' functions, which only their owner may.
            before = 1 if found is None else int(found)
            what = ["the triggers' functions' pinned search_path (schema 7)"]
            grants: list[str] = []
            if before < 6:
                what.insert(0, "the rules of APPROVAL_REVOKED (schema 6)")
            if before < 5:
                what.insert(0, "a table linked_calls, filled once from the events (schema 5)")
                grants.insert(0, _GRANT_LINKED)
            if before < 4:
                what.insert(0, "the fence's rules (schema 4)")
            if before < 3:
                what.insert(0, "the columns idempotency.send_by and idempotency.target (schema 3)")
            if before < 2:
                what.insert(0, "a table chunk_owners, filled once (schema 2)")
                grants.insert(0, _GRANT_OWNERS)
            then = "; ".join(g.format(role=_role(conn)) for g in grants)
            raise JournalError(
                f"journal {self.where} has schema {found or 1}; this affidavit upgrades it to "
                f"schema {SCHEMA_VERSION} ({', '.join(what)}), which only the tables' owner may "
                f"do: {_OWNER_OPENS}"
                + (f", then, as the owner, run {then}" if then else "")
                + " (docs/journal.md)"
            ) from None
        # New, or from before schema 2: name the chunks no marker names (``chunk_owners``), once
        # -- inside the opening transaction, which holds the chain head: no chunk or marker of
        # another broker comes between the scan and the schema's new number.  (Schema 3's
        # column came with ``SCHEMA``: NULL in the rows bound before it.)  Likewise, from
        # before schema 5, index the calls the stored events name (``linked_calls``).
        if found is None or int(found) < 2:
            self.tables(conn).fill_chunk_owners()
        if have and not linked:
            self.tables(conn).index_linked_calls(self.where)
        conn.execute(
            "INSERT INTO meta (name, value) VALUES ('schema', %s) ON CONFLICT (name) DO UPDATE "
            "SET value = excluded.value",
            (str(SCHEMA_VERSION),),
        )
        return found

    def _remake_linked(self, conn: Any, found: str | None) -> None:
        """A journal recording schema 5 or later without ``linked_calls`` (dropped by whoever
        owns the tables): every claim's check and every row naming a call would fail on it.
        The owner makes it again and fills it from the events, as the upgrade does; a broker
        role, which may not, is told that owner's step (``verify`` says the table was lost)."""
        try:
            conn.execute(SCHEMA)
        except psycopg.errors.InsufficientPrivilege:
            raise JournalError(
                f"journal {self.where} records schema {found} but has no table linked_calls (a "
                f"claim's check reads it), which only the tables' owner may make: {_OWNER_OPENS} "
                f"(it makes and fills it again), then, as the owner, run "
                f"{_GRANT_LINKED.format(role=_role(conn))} (docs/journal.md)"
            ) from None
        self.tables(conn).index_linked_calls(self.where)

    def _refuse_ungranted(self, conn: Any) -> None:
        """A writer whose role lacks a privilege ``grant_statements`` lists is refused here: it
        would open without a word and have a write refused later -- ``chunk_owners`` (granted
        before schema 2 added it), ``linked_calls`` (before schema 5), or any other (a grant
        made by hand, too narrow) -- some after the request was sent: the result lost
        (``results``, ``result_chunks``), a lease never renewed (``leases``).  One query, every
        (table, privilege) pair: ``has_table_privilege`` with several privileges answers
        whether *any* is held."""
        rows = conn.execute(
            "SELECT t, p FROM (VALUES "
            + ", ".join(f"('{t}', '{p}')" for t, p in _NEEDED)
            + ") AS n (t, p) WHERE NOT pg_catalog.has_table_privilege("
            f"current_user, '{JOURNAL_SCHEMA}.' || t, p)"
        ).fetchall()
        if not rows:
            return
        missing: dict[str, list[str]] = {}
        for table, privilege in rows:
            missing.setdefault(table, []).append(privilege)
        what = "; ".join(f"{', '.join(p)} on table {t}" for t, p in missing.items())
        grants = "; ".join(f"GRANT {_GRANTED[t]} ON {t} TO {_role(conn)}" for t in missing)
        raise JournalError(
            f"journal {self.where}: refused: this role may not {what} (schema "
            f"{SCHEMA_VERSION}), which the writer needs; as the tables' owner run: {grants} "
            "(docs/journal.md)"
        )

    def _wants_index(self, conn: Any) -> bool:
        """Whether ``events_session`` is to be built once the opening transaction has ended: a
        journal created before it (no schema change: an index, which every broker's writes keep
        and none relies on; docs/journal.md), or one an earlier build left INVALID.  Only
        catalog reads here, inside the transaction that holds the chain head; the build is
        ``opened``'s.  A broker role that does not own the tables says so and reads the session
        views from the table.  Either way, the same rows."""
        row = conn.execute(
            "SELECT indisvalid FROM pg_catalog.pg_index "
            "WHERE indexrelid = pg_catalog.to_regclass(%s)",
            (SESSION_INDEX,),
        ).fetchone()
        if row is not None and row[0]:
            return False
        owner = conn.execute(
            "SELECT pg_catalog.pg_has_role(current_user, relowner, 'USAGE') "
            "FROM pg_catalog.pg_class "
            "WHERE oid = pg_catalog.to_regclass('events')"
        ).fetchone()
        if not owner or not owner[0]:
            log.warning(
                "journal %s: no %sindex %s: the session views read every event until the "
                "tables' owner opens the journal once or runs: %s",
                self.where, "" if row is None else "valid ", SESSION_INDEX, SESSION_INDEX_BUILD,
            )  # fmt: skip
            return False
        return True

    def opened(self) -> None:
        if self._index_due:
            self._index_due = False
            self._index_sessions()

    def _index_sessions(self) -> None:
        """Build ``events_session`` on a connection of its own, in no transaction: ``CREATE
        INDEX CONCURRENTLY`` takes no lock a write needs, and the chain head is not held, so
        every broker writes on while it runs.  Its waits (for a lock, for transactions older
        than it) are bounded by ``lock_timeout``.  One build at a time: a broker opening while
        another builds leaves it to that one.  A failure -- the bound, the role's
        ``statement_timeout`` on a large journal, a full disk -- never keeps the journal from
        opening (nothing relies on the index); it is logged, and may leave the index INVALID,
        which the next open drops and builds again."""
        try:
            conn = psycopg.connect(self._conninfo, autocommit=True)
        except psycopg.Error as exc:
            self._not_built(exc)
            return
        try:
            _pin(conn)
            conn.execute(f"SET lock_timeout = {int(self.index_wait_ms)}")
            mine = conn.execute(
                f"SELECT pg_catalog.pg_try_advisory_lock(%s, {_KEY2})",
                (_INDEX_LOCK,),
            ).fetchone()
            if not mine or not mine[0]:
                log.info(
                    "journal %s: index %s is being built by another broker", self.where,
                    SESSION_INDEX,
                )  # fmt: skip
                return
            row = conn.execute(
                "SELECT indisvalid FROM pg_catalog.pg_index "
                "WHERE indexrelid = pg_catalog.to_regclass(%s)",
                (SESSION_INDEX,),
            ).fetchone()
            if row is not None and row[0]:
                return  # built meanwhile, by a broker that has finished
            if row is not None:
                log.warning(
                    "journal %s: index %s was left INVALID by a build that failed: dropping it",
                    self.where, SESSION_INDEX,
                )  # fmt: skip
                conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {SESSION_INDEX}")
            log.info("journal %s: building index %s (once)", self.where, SESSION_INDEX)
            started = time.monotonic()
            conn.execute(SESSION_INDEX_BUILD)
            log.info(
                "journal %s: built index %s in %.1f s", self.where, SESSION_INDEX,
                time.monotonic() - started,
            )  # fmt: skip
        except psycopg.Error as exc:
            self._not_built(exc)
        finally:
            conn.close()  # and with it the build's advisory lock

    def _not_built(self, exc: BaseException) -> None:
        log.warning(
            "journal %s: index %s not built (%s): the session views read every event until "
            "it is; the next open tries again, or run: %s",
            self.where, SESSION_INDEX, self.describe(exc), SESSION_INDEX_BUILD,
        )  # fmt: skip

    def begin(self, conn: Any, *, barrier: bool, wait: float | None = None) -> str:
        sync = "on" if barrier else "off"
        # ``wait``: lock_timeout bounds the wait for the head (55P03 lock_not_available after),
        # at most the longest PostgreSQL counts: more is refused, and every re-read after a lost
        # commit would fail at once until ``reconnect`` (up to 100 years) ran out.
        ms = None if wait is None else min(max(1, int(wait * 1000)), _MAX_LOCK_TIMEOUT_MS)
        limit = "" if ms is None else f"SET LOCAL lock_timeout = {ms}; "
        try:
            # READ COMMITTED whatever the role's or database's default_transaction_isolation:
            # under REPEATABLE READ the head read after the lock is the snapshot's, taken
            # before another broker's commit released it -- every write after it refused
            # (duplicate key).  The search_path again: a pooler may hand the transaction a
            # server session this connection did not pin.
            conn.execute(
                f"BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL search_path = {SEARCH_PATH}; "
                f"SET LOCAL synchronous_commit = {sync}; {limit}"
                f"SELECT pg_catalog.pg_advisory_xact_lock({_LOCK}, {_KEY2})"
            )
        except psycopg.errors.LockNotAvailable:
            if ms is None:
                raise
            # The driver's own words ("canceling statement due to lock timeout") name neither
            # what held the write up nor the setting that bounds it; an operator needs both,
            # and who holds it.  Ended here, so the holder can be read; the caller's rollback
            # finds no transaction.
            # A connection lost meanwhile: the refusal is still the head's, no holder named.
            with contextlib.suppress(psycopg.Error):
                conn.execute("ROLLBACK")
            raise HeadHeld(_head_held(ms, _holder(conn))) from None
        # Pipeline mode for the rest of the transaction: a write whose answer nothing waits for
        # (an event row, a chunk, the checkpoint) goes out without a round trip of its own; a
        # read waits for everything before it.  The chain head is held throughout, so the
        # round trips saved are time every other broker no longer waits (figures in the
        # commit message; tests/benchmarks/journal_backends.py).
        pipe = conn.pipeline()
        pipe.__enter__()
        self._pipes[id(conn)] = pipe
        return "FULL" if barrier else "NORMAL"

    def commit(self, conn: Any) -> None:
        pipe = self._pipes.pop(id(conn), None)
        conn.execute("COMMIT")
        if pipe is not None:
            pipe.__exit__(None, None, None)  # sends it and waits: errors of any write surface

    def between(self, conn: Any) -> None:
        pass  # the server checkpoints its own WAL

    def rollback(self, conn: Any) -> None:
        pipe = self._pipes.pop(id(conn), None)
        if pipe is not None:
            with contextlib.suppress(psycopg.Error):
                pipe.__exit__(None, None, None)
        if not conn.closed and conn.info.transaction_status != TransactionStatus.IDLE:
            conn.execute("ROLLBACK")

    @contextlib.contextmanager
    def snapshot(self, conn: Any) -> Iterator[None]:
        own = conn.info.transaction_status == TransactionStatus.IDLE
        if own:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        try:
            yield
        finally:
            if own and not conn.closed:
                with contextlib.suppress(psycopg.Error):
                    conn.execute("COMMIT")

    def transient(self, exc: BaseException) -> bool:
        state = getattr(exc, "sqlstate", None) if isinstance(exc, psycopg.Error) else None
        return isinstance(state, str) and (
            state.startswith(_TRANSIENT_CLASSES) or state in _TRANSIENT_STATES
        )

    def lost(self, exc: BaseException) -> bool:
        if not isinstance(exc, psycopg.OperationalError):
            return False
        state = exc.sqlstate
        # No SQLSTATE: the client lost the server; class 08: connection exceptions; 57P0x:
        # the server is shutting down or restarting (pg_terminate_backend, pg_ctl restart).
        return state is None or state.startswith(("08", "57P"))

    def commit_may_have_landed(self, exc: BaseException) -> bool:
        return False

    def away(self, exc: BaseException) -> bool:
        """Whether a failed connection attempt found the database away: no server answered
        (refused, unreachable, timed out, cut) or it answered that it is starting up, shutting
        down or recovering.  libpq gives a failed attempt no SQLSTATE, only its message, in
        which a server's own refusal carries its severity (``FATAL:``)."""
        if not isinstance(exc, psycopg.OperationalError):
            return False
        if exc.sqlstate is not None:
            return self.lost(exc)
        text = str(exc)
        if _SERVER_SAID.search(text) is None:
            return True
        return any(words in text for words in _SERVER_AWAY)

    def describe(self, exc: BaseException) -> str:
        diag = getattr(exc, "diag", None)
        text = getattr(diag, "message_primary", None) if diag is not None else None
        if not text:
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if self._password:
            text = text.replace(self._password, "***")
        return _CLIENT_HOST.sub("for this broker's host", text)

    def open_error(self, exc: BaseException) -> JournalError:
        return JournalError(f"cannot open journal {self.where}: {self.describe(exc)}")

    def writer_lock(self, owner: str | None, keys: Sequence[Path] = ()) -> None:
        return None
