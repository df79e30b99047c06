"""Opening the SQLite file: the reading connection, the writer's connection with its WAL and
sync settings, and the schema with the broker and signing keys it is bound to.

DESIGN, "Durability barriers": the journal runs in WAL mode with ``synchronous=FULL`` at
barriers, so a barrier's commit fsyncs the WAL (the writer lowers it to NORMAL for batches with
no barrier; see ``writer.py``).  Readers use their own connection: WAL lets them read while the
writer commits, from this process or another.
"""

from __future__ import annotations

import base64
import os
import sqlite3
from collections.abc import Callable, Iterable
from pathlib import Path
from urllib.parse import quote

from . import checkpoints
from .chain import SCHEMA, SCHEMA_VERSION
from .errors import JournalError
from .sealing import BrokerKey
from .signing import SigningKey

__all__ = ["BUSY_TIMEOUT_MS", "connect_reader", "connect_writer", "init_schema", "unusable"]

BUSY_TIMEOUT_MS = 30_000


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
    return JournalError(f"cannot open journal {path}: {why}")


def connect_reader(path: Path, *, readonly: bool) -> sqlite3.Connection:
    """A connection for reads.  ``readonly``: the file must exist and hold a journal (opened
    ``mode=ro``, so a reader can never create or change one); otherwise a plain connection for
    the writing journal's own reads."""
    if not readonly:
        try:
            conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        except sqlite3.Error as exc:
            raise unusable(path, exc) from None
        return conn
    if not path.exists():
        raise JournalError(f"no journal at {path}")
    uri = f"file:{quote(str(path.resolve()))}?mode=ro"
    try:
        # connect() itself fails on a directory or an unopenable file ("disk I/O
        # error"): the same clear JournalError as a file that is not a journal.
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise JournalError(f"{path} is not a readable journal: {exc}") from None
    try:
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        conn.execute("SELECT 1 FROM events LIMIT 1").fetchall()
    except sqlite3.Error as exc:
        conn.close()
        raise JournalError(f"{path} is not a readable journal: {exc}") from None
    return conn


def connect_writer(path: Path) -> sqlite3.Connection:
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
        # Checkpoint less often (each checkpoint fsyncs the database file as well), and cap
        # the WAL file left behind after one.
        conn.execute("PRAGMA wal_autocheckpoint=10000")
        conn.execute("PRAGMA journal_size_limit=67108864")
    except BaseException:
        conn.close()
        raise
    return conn


def init_schema(
    conn: sqlite3.Connection,
    path: Path,
    key_file: Path,
    signing_key_file: Path,
    clock: Callable[[], float],
) -> tuple[BrokerKey, SigningKey]:
    """Create the tables (if absent) and bind the journal to its two keys.

    The broker key (sealing): a new journal records its id (creating the file 0600 if there is
    none); an existing one must be opened with the key it recorded.  The signing key
    (checkpoints): the same, and a journal that has rows must end in a checkpoint this key
    signed -- the writer refuses to sign over rows it cannot vouch for
    (``checkpoints.require_covered``).  A journal written before signing existed (rows, no
    recorded signing key, no checkpoint, no signing key file yet) is *adopted*: the new key signs
    its head in a checkpoint marked ``adopted``, which ``verify`` reports."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        # executescript() would COMMIT first; run the statements inside our transaction.
        for stmt in _split_sql(SCHEMA):
            conn.execute(stmt)
        conn.execute(
            "INSERT INTO meta (name, value) VALUES ('schema', ?) ON CONFLICT (name) DO UPDATE "
            "SET value = max(CAST(value AS INTEGER), CAST(excluded.value AS INTEGER))",
            (str(SCHEMA_VERSION),),
        )
        key = _broker_key(conn, path, key_file)
        signer = _signing_key(conn, path, signing_key_file, clock)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return key, signer


def _meta(conn: sqlite3.Connection, name: str) -> str | None:
    row = conn.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
    return None if row is None else str(row[0])


def _broker_key(conn: sqlite3.Connection, path: Path, key_file: Path) -> BrokerKey:
    recorded = _meta(conn, "key_id")
    if recorded is None:
        key = BrokerKey.load(key_file) if key_file.exists() else BrokerKey.create(key_file)
        conn.execute("INSERT INTO meta (name, value) VALUES ('key_id', ?)", (key.key_id,))
        return key
    key = BrokerKey.load(key_file)
    if key.key_id != recorded:
        raise JournalError(f"broker key file {key_file} does not match journal {path}")
    return key


def _signing_key(
    conn: sqlite3.Connection, path: Path, key_file: Path, clock: Callable[[], float]
) -> SigningKey:
    head = conn.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone()
    recorded = _meta(conn, "signing_key_id")
    if recorded is not None:
        signer = SigningKey.load(key_file)
        if signer.key_id != recorded:
            raise JournalError(
                f"signing key file {key_file} does not match journal {path} (it records key "
                f"{recorded}, the file holds {signer.key_id})"
            )
        if head is not None:
            checkpoints.require_covered(conn, path, int(head[0]), str(head[1]), signer.public_raw)
        return signer
    if head is not None and (key_file.exists() or checkpoints.count(conn)):
        # Rows, no recorded key, yet a key file or checkpoints: not a journal from before
        # signing but one whose record of its key was removed.  Adopting it would sign over
        # whatever was done to it.
        raise JournalError(
            f"journal {path} has rows but records no signing key, although "
            + (f"signing key file {key_file} exists" if key_file.exists() else "it has checkpoints")
            + ": its signing records were removed -- run `affidavit journal verify`"
        )
    signer = SigningKey.load(key_file) if key_file.exists() else SigningKey.create(key_file)
    conn.executemany(
        "INSERT INTO meta (name, value) VALUES (?, ?)",
        [
            ("signing_key_id", signer.key_id),
            ("signing_public_key", base64.b64encode(signer.public_raw).decode("ascii")),
        ],
    )
    if head is not None:
        checkpoints.adopt(conn, signer, clock)
    return signer


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
