"""The backend interface: what a database must do for the journal, and how one is chosen.

The journal's logic -- the projection check, the hash chain, leases checked in the same
transaction as DISPATCH_STARTED, idempotency bindings, results with their completeness marker,
signed checkpoints, ``verify`` -- is written once, against ``Tables`` (``tables.py``) and this
``Backend``.  A backend is one module:

    sqlite.py     the embedded default: one file, WAL, ``BEGIN IMMEDIATE`` serialises writers
                  (its schema in ``sqlite_schema.py``, its WAL upkeep in ``sqlite_wal.py``)
    postgres.py   shared: several brokers on one database, the chain head serialised by a
                  transaction-scoped advisory lock (``[journal] url = "postgresql://..."``)

and one conformance suite (tests/journal/conformance/) runs the same tests on each.  The engine,
the views, recovery and the daemon hold ``Journal`` / ``JournalReader`` and never a backend.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import SplitResult, parse_qsl, urlencode, urlsplit, urlunsplit

from .errors import JournalError
from .tables import Tables

__all__ = [
    "URL_SCHEMES",
    "Backend",
    "Lock",
    "is_url",
    "open_backend",
    "redact",
    "split_url",
    "where",
]

URL_SCHEMES = ("postgresql://", "postgres://")


def is_url(location: str | os.PathLike[str]) -> bool:
    """Whether a journal location names a PostgreSQL database rather than a SQLite file."""
    return isinstance(location, str) and location.startswith(URL_SCHEMES)


split_url: Callable[[str], SplitResult] = getattr(urlsplit, "__wrapped__", urlsplit)
"""``urlsplit`` without CPython's module-wide cache of its last 128 URLs, which would keep a
journal URL's password: every split of one goes through this (``redact`` here, the engine's
``location``), as ``adapters/http/urls.split_url`` keeps a query credential out of it (the
journal and the adapters may not import each other)."""


def redact(url: str) -> str:
    """The URL with any password replaced: the authority's, and every parameter whose name
    holds ``password`` -- libpq's ``password=`` and ``sslpassword=`` (the client key's
    passphrase) alike."""
    try:
        parts = split_url(url)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, _, hostport = netloc.rpartition("@")
            if ":" in userinfo:
                userinfo = userinfo.split(":", 1)[0] + ":***"
            netloc = f"{userinfo}@{hostport}"
        query = parts.query
        if query:
            pairs = parse_qsl(query, keep_blank_values=True)
            query = urlencode(
                [(k, "***" if "password" in k.lower() else v) for k, v in pairs], safe="/*"
            )
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        return "postgresql://(unparsable URL)"


def where(location: str | os.PathLike[str]) -> str:
    """How messages name a journal location: the file, or the URL without its password."""
    return redact(str(location)) if is_url(location) else str(location)


class Lock(Protocol):
    def release(self) -> None: ...


class Backend(Protocol):
    """One database holding one journal."""

    kind: str
    """``sqlite`` or ``postgresql``."""
    where: str
    """How messages name it: the file's path, or the URL without its password."""
    path: Path | None
    """The SQLite file (key files default to names beside it); None for a database."""
    shared: bool
    """Several brokers may write it at once: no process is ever its only writer, so a record
    left open is recovered only once its lease has expired (``Journal.exclusive``)."""
    multi_signer: bool
    """Each broker signs its transactions' checkpoints with its own key, registered in the
    journal; otherwise one signing key, recorded when the journal was made, signs them all."""
    errors: tuple[type[BaseException], ...]
    """The driver's exceptions: a storage fault (or a lost connection, ``lost``)."""
    renew_after_refusal: bool
    """After the database refused a write transaction (an error of ``errors``, not ``lost``),
    the writer replaces its connection (``commit._renew``): PostgreSQL, whose driver may
    believe a statement prepared inside the aborted pipeline that the server never prepared --
    every later write on it would fail 'prepared statement "_pg3_N" does not exist'."""
    segments: Path | None
    """Where long results' chunks are stored as files (``segments.py``; SQLite:
    ``<journal>.results/``), or None: in the database's tables, where a shared journal's brokers
    on other hosts read them."""

    def tables(self, conn: Any) -> Tables: ...

    def connect(self, role: str) -> Any:
        """A connection for ``role``: ``writer`` (the single writer's transactions), ``reader``
        (the writing journal's own reads) or ``tool`` (a read-only reader, which must never
        create or change a journal: ``JournalError`` when there is none)."""
        ...

    def close(self, conn: Any) -> None: ...

    def unchanged(self, conn: Any) -> bool:
        """Whether what ``connect`` checked of a ``tool`` connection still holds, at the cost
        of a header read or one query (an idle view reader taken again, ``ReaderBase.fresh``):
        SQLite, the file at the path is the one it opened and its schema is the one it
        checked; PostgreSQL, the journal's recorded schema is the one it read.  False (never
        raises) when not, or not known: its owner opens a new connection, whose checks say
        what is wrong now."""
        ...

    def require_writer_file(self) -> None:
        """``JournalReplaced`` when the journal's path no longer names the file this process's
        writer opened (SQLite: replaced or removed under it; a stat) -- checked at each writer
        transaction's start and each check of a view reader, so nothing is answered from a
        file the writer is not writing.  Nothing to check without a writer, or on PostgreSQL."""
        ...

    def bound_waits(self, conn: Any, seconds: float) -> None:
        """A connection that waits at most ``seconds`` for a lock another session holds, then
        fails the statement with an error ``transient`` calls the database declining (SQLite:
        its busy timeout; PostgreSQL: ``lock_timeout``) -- a view's read, never a long scan,
        which no such bound cuts short."""
        ...

    def create(self, conn: Any) -> str | None:
        """Create or upgrade the schema (idempotent), inside the transaction ``begin`` opened.
        Returns the schema the journal recorded before (None: a new journal, or one from before
        the ``meta`` table) -- what ``connect`` tells a journal from before signing by."""
        ...

    def opened(self) -> None:
        """After the writer's opening transaction has ended (the chain head released): upkeep
        ``create`` found due that must not hold the head -- PostgreSQL builds a missing
        ``events_session`` beside the other brokers' writes.  Raises nothing; logs."""
        ...

    def begin(self, conn: Any, *, barrier: bool, wait: float | None = None) -> str:
        """Open a write transaction that holds the chain head until it ends: no other writer,
        in this process or another, extends the chain meanwhile.  ``barrier``: its commit must
        be durable when ``commit`` returns; otherwise it may become durable with the next
        barrier.  ``wait``: seconds to wait for the head at most, else a backend error (a
        shared journal; SQLite waits its busy timeout).  Returns the durability it commits
        under, for ``Batch.synchronous``."""
        ...

    def commit(self, conn: Any) -> None: ...

    def between(self, conn: Any) -> None:
        """On the writer's thread between two transactions, once the last one's writers were
        woken: upkeep that must not delay a commit's answer (SQLite: ``_Checkpointer``).
        Raises nothing the writer must handle."""
        ...

    def rollback(self, conn: Any) -> None: ...

    def snapshot(self, conn: Any) -> AbstractContextManager[None]:
        """A read transaction: one consistent view for a verify or a result's marker."""
        ...

    def lost(self, exc: BaseException) -> bool:
        """Whether ``exc`` means the connection is gone: a transaction in flight was rolled
        back -- unless its COMMIT had been sent, when only a re-read can tell."""
        ...

    def commit_may_have_landed(self, exc: BaseException) -> bool:
        """Whether a COMMIT that raised ``exc``, its connection not lost, may still have made
        its transaction durable (then its writes fail ``CommitUnknown``).  SQLite: unless its
        error code says the WAL write itself failed -- the commit frame, the last frame written,
        is then not whole (``sqlite_wal.commit_frame_unwritten``); a failed sync (EIO) leaves
        the frames in the -wal, where a crash before the next commit lets the next open recover
        them.  PostgreSQL: no -- a flush that fails stops the server (a lost connection,
        ``lost``), and any other error answers a COMMIT that rolled back."""
        ...

    def transient(self, exc: BaseException) -> bool:
        """Whether ``exc``, on a connection that is not lost, is the database declining this
        once -- busy, a lock not granted in time, a statement timeout or cancel, too many
        connections -- so that the same read may succeed later (``ReadFailed``).  False for
        anything that says something about the rows (a column that does not decode)."""
        ...

    def describe(self, exc: BaseException) -> str:
        """The driver's message, without data it may quote or a password."""
        ...

    def open_error(self, exc: BaseException) -> JournalError:
        """The one-line error for a journal that cannot be opened, with the reason an operator
        can act on."""
        ...

    def writer_lock(self, owner: str | None, keys: Sequence[Path] = ()) -> Lock | None:
        """Who may write: SQLite's ``<journal>.lock`` (``lock.py``); None where writers share
        the database by design.  ``keys``: the journal's key files, named in a refusal."""
        ...

    reconnect_within: float
    """How long a writer that lost its connection tries to reconnect before failing its
    writes (seconds; 0 for a file)."""


def open_backend(
    location: str | os.PathLike[str], *, options: dict[str, Any] | None = None
) -> Backend:
    """The backend for a journal location: a ``postgresql://`` URL, or a SQLite file path."""
    opts = options or {}
    if is_url(location):
        try:
            from .postgres import PostgresBackend
        except ImportError:
            raise JournalError(
                "a postgresql:// journal needs psycopg: pip install 'affidavit[postgresql]'"
            ) from None
        return PostgresBackend(str(location), **opts)
    from .sqlite import SqliteBackend

    return SqliteBackend(Path(location))


def refuse_newer_schema(recorded: object, known: int, where: str) -> None:
    """Refuse a journal whose recorded schema (``meta.schema``'s value, None when absent) is
    newer than the ``known`` one of this backend: what this broker would make of it is not
    what it holds, so it is neither written nor read.  A value that is no number counts as 0."""
    try:
        found = int(recorded) if recorded is not None else 0  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        found = 0
    if found > known:
        raise JournalError(
            f"journal {where} was written by a newer affidavit (schema {found}; this one knows "
            f"schema {known}): upgrade affidavit to open it"
        )
