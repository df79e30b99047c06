"""The ``checkpoints`` table: writing the signed checkpoint of a transaction, refusing to extend
a head no checkpoint covers, and reading checkpoints back for ``verify``.

``signing.py`` says what a checkpoint is and how it is signed; this module only stores it.  The
writer signs one per transaction that appended rows, inside that transaction, so a crash can never
leave a committed row without a checkpoint at or after it (``writer.py``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .chain import EVENT_COLUMNS, row_hash
from .errors import JournalError
from .signing import Checkpoint, SigningKey, verify_signature

__all__ = [
    "adopt",
    "count",
    "covering_problem",
    "insert",
    "iter_checkpoints",
    "latest",
    "remember",
    "require_covered",
    "sign",
]

_COLUMNS = "seq, hash, prev, at, adopted, key_id, CAST(signature AS BLOB)"


def _from_row(row: tuple[Any, ...]) -> Checkpoint:
    try:
        return Checkpoint(
            int(row[0]), str(row[1]), int(row[2]), float(row[3]), bool(row[4]), str(row[5]),
            bytes(row[6]),
        )  # fmt: skip
    except (TypeError, ValueError):
        # Columns someone filled with the wrong types: a checkpoint no key verifies.
        return Checkpoint(int(row[0]), "", -1, 0.0, False, "", b"")


def _missing_table(exc: sqlite3.Error) -> bool:
    # A journal from before signing, opened read-only, has no checkpoints table.
    return isinstance(exc, sqlite3.OperationalError) and "no such table" in str(exc)


_KNOWN_MAX = 10_000


def remember(known: dict[int, bytes], seq: int, signature: bytes) -> None:
    """Note a checkpoint known to be valid (bounded: forgotten wholesale when full)."""
    if len(known) >= _KNOWN_MAX:
        known.clear()
    known[seq] = signature


def insert(conn: sqlite3.Connection, cp: Checkpoint) -> None:
    conn.execute(
        "INSERT INTO checkpoints (seq, hash, prev, at, adopted, key_id, signature) "
        "VALUES (?,?,?,?,?,?,?)",
        (cp.seq, cp.hash, cp.prev, cp.at, int(cp.adopted), cp.key_id, cp.signature),
    )


def sign(
    conn: sqlite3.Connection, key: SigningKey, seq: int, hash_: str, prev: int, at: float
) -> Checkpoint:
    """Sign and store the checkpoint of a transaction whose last row is ``seq``."""
    cp = key.sign(seq, hash_, prev, at)
    insert(conn, cp)
    return cp


def adopt(conn: sqlite3.Connection, key: SigningKey, clock: Callable[[], float]) -> None:
    """Sign the head of a journal written before signing existed, marked ``adopted``."""
    row = conn.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone()
    if row is not None:
        insert(conn, key.sign(int(row[0]), str(row[1]), 0, clock(), adopted=True))


def latest(conn: sqlite3.Connection) -> Checkpoint | None:
    try:
        row = conn.execute(
            f"SELECT {_COLUMNS} FROM checkpoints ORDER BY seq DESC LIMIT 1"
        ).fetchone()
    except sqlite3.Error as exc:
        if _missing_table(exc):
            return None
        raise
    return None if row is None else _from_row(row)


def count(conn: sqlite3.Connection) -> int:
    try:
        return int(conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0])
    except sqlite3.Error as exc:
        if _missing_table(exc):
            return 0
        raise


def iter_checkpoints(conn: sqlite3.Connection) -> Iterator[Checkpoint]:
    """Every checkpoint in seq order (none for a journal from before signing)."""
    try:
        cur = conn.execute(f"SELECT {_COLUMNS} FROM checkpoints ORDER BY seq")
    except sqlite3.Error as exc:
        if _missing_table(exc):
            return
        raise
    try:
        for row in cur:
            yield _from_row(row)
    finally:
        cur.close()


def require_covered(
    conn: sqlite3.Connection, path: Path, seq: int, hash_: str, public_raw: bytes
) -> None:
    """Refuse (``JournalError``) to extend a head that no valid checkpoint covers: signing the
    next transaction would vouch for rows this broker never wrote (a forged appended row, a
    re-chained edit).  ``verify`` tells which rows; the broker does not write until then."""
    cp = latest(conn)
    if cp is not None and cp.seq == seq and cp.hash == hash_ and verify_signature(cp, public_raw):
        return
    signed = "no checkpoint" if cp is None else f"the last checkpoint row is at seq {cp.seq}"
    raise JournalError(
        f"journal {path}: its last row (seq {seq}) is not covered by a valid signed checkpoint "
        f"({signed}); rows were written without the signing key or altered -- run "
        "`affidavit journal verify`; the broker will not sign over them"
    )


def covering_problem(
    conn: sqlite3.Connection, seq: int, public_raw: bytes | None, known: dict[int, bytes]
) -> str | None:
    """None if the row at ``seq`` is covered by a checkpoint signed with ``public_raw``: the
    rows from it to the first checkpoint at or after it are re-hashed and must end in that
    checkpoint's hash.  Otherwise why not.  (A read of one stored result checks this much;
    ``verify`` checks everything.)  ``known`` maps seqs of checkpoints already found valid --
    or signed by this process -- to their signatures: a row identical to one of them needs no
    second signature check (the costliest step of a result read)."""
    try:
        row = conn.execute(
            f"SELECT {_COLUMNS} FROM checkpoints WHERE seq >= ? ORDER BY seq LIMIT 1", (seq,)
        ).fetchone()
    except sqlite3.Error as exc:
        if not _missing_table(exc):
            raise
        row = None
    if row is None:
        return f"row {seq} is not covered by a signed checkpoint"
    cp = _from_row(row)
    if known.get(cp.seq) != cp.signature:
        if public_raw is None or not verify_signature(cp, public_raw):
            return f"the checkpoint at seq {cp.seq} (covering row {seq}) is not validly signed"
        remember(known, cp.seq, cp.signature)
    expected, prev = seq, None
    for r in conn.execute(
        f"SELECT {EVENT_COLUMNS} FROM events WHERE seq BETWEEN ? AND ? ORDER BY seq",
        (seq, cp.seq),
    ):
        if r[0] != expected or (prev is not None and r[11] != prev):
            break
        try:
            computed = row_hash(r[11], *r[:11])
        except (TypeError, ValueError, RecursionError):
            break
        if computed != r[12]:
            break
        prev, expected = computed, expected + 1
    if expected != cp.seq + 1 or prev != cp.hash:
        return f"rows {seq}..{cp.seq} differ from the signed checkpoint at seq {cp.seq}"
    return None
