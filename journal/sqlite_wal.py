"""The SQLite writer's connection (WAL, ``synchronous=FULL``) and the thread that checkpoints its
WAL beside it (``_Checkpointer``); ``sqlite.py`` is the backend that uses both."""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

from .errors import JournalError

__all__ = ["BUSY_TIMEOUT_MS", "CHECKPOINT_COMMITS", "CHECKPOINT_PAGES", "commit_frame_unwritten"]

BUSY_TIMEOUT_MS = 30_000


CHECKPOINT_PAGES = 1024
"""The database grew by this many pages (4 MiB) since the last checkpoint: run one."""
CHECKPOINT_COMMITS = 256
"""Or this many commits went by (rows updated in place do not grow the file)."""


SQLITE_FULL = 13
SQLITE_IOERR_WRITE = 10 | (3 << 8)
_FRAME_UNWRITTEN = frozenset({SQLITE_FULL, SQLITE_IOERR_WRITE})
"""The error codes of a COMMIT whose write to the -wal failed (ENOSPC is SQLITE_FULL, any other
errno -- EFBIG past a file size limit, EIO -- SQLITE_IOERR_WRITE; os_unix.c ``unixWrite``)."""


def commit_frame_unwritten(exc: BaseException) -> bool:
    """Whether the COMMIT that raised ``exc`` never wrote its commit frame whole, so no open
    -- even after a crash -- recovers its transaction.  SQLite's ``sqlite3WalFrames`` (wal.c)
    writes the transaction's frames in order, the commit frame (the one carrying the database
    size) last -- the checksums it rewrites when the transaction overwrote frames of its own end
    with the commit frame's too -- and returns at the first write that fails; recovery keeps
    frames only up to the last valid commit frame, and a frame cut short does not check.  Only
    then does it sync (SQLITE_IOERR_FSYNC: the frames are whole, and recovered after a crash)
    and index the frames (SQLITE_IOERR_SHM*): those, and any code not listed here, may have
    landed.  Unless the -wal is padded to a sector: then copies of the commit frame follow it,
    and a write error may come after a whole commit frame -- SQLite pads only when built with
    ``SQLITE_POWERSAFE_OVERWRITE=0`` (the writer names no ``psow`` in a URI), which
    ``PRAGMA compile_options`` says."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code in _FRAME_UNWRITTEN and not _pads_wal()


@functools.cache
def _pads_wal() -> bool:
    conn = sqlite3.connect(":memory:")
    try:
        options = {str(row[0]) for row in conn.execute("PRAGMA compile_options")}
    finally:
        conn.close()
    return "POWERSAFE_OVERWRITE=0" in options


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

    def __init__(self, path: Path, writes_path: Callable[[], bool] = lambda: True) -> None:
        self._path = path
        self._writes_path = writes_path
        """Whether the file at ``path`` is still the writer's (``SqliteBackend.writes_path``):
        the thread's connection is opened by the path, on its first checkpoint -- never onto a
        file put in the writer's place, whose WAL (named by the path too) is not its own."""
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
                with contextlib.suppress(sqlite3.Error, OSError):
                    if conn is None:
                        # Opened by the path only while it names the writer's file, checked
                        # before and after: a file put there in between is never checkpointed
                        # with the writer's WAL (an error of the check: not this time).
                        if not self._writes_path():
                            continue
                        opened = sqlite3.connect(str(self._path), isolation_level=None)
                        try:
                            same = self._writes_path()
                        except OSError:
                            same = False
                        if not same:
                            opened.close()
                            continue
                        conn = opened
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


def create_private(path: Path) -> None:
    """A journal not there yet created 0600 before SQLite opens it, not with the process umask
    (0644 under the usual 022): the journal is the broker's alone -- an agent on the host reads
    none of it -- and SQLite gives its ``-wal`` and ``-shm`` files the main file's mode.  A
    journal already there keeps its mode (the operator's; docs/deployment.md).  Anything else
    (no directory, read-only) is left for ``sqlite3.connect`` to say as it always did."""
    with contextlib.suppress(OSError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))


def _connect_writer(path: Path) -> sqlite3.Connection:
    """The single writer's connection: WAL, ``synchronous=FULL``.  Raises ``sqlite3.Error`` or
    ``JournalError``; the caller closes what it opened."""
    create_private(path)
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
