"""Copying a journal into a new shared one: ``affidavit journal migrate --to postgresql://...``.

Every stored thing moves as it is -- events (seq, time, hashes), checkpoints with their
signatures, results with their markers, sealed chunks and auditor copies, leases, idempotency
records, the sealing key's id and the signing keys -- so the copy is the same evidence, not a
re-recording of it.  The source must verify first; the target must be empty (a journal is never
merged into another: two histories would need two orders); the copy is one transaction on the
target, so it is all there or none of it; and the target is then verified end to end with the
keys that verified the source, and must reach the same head.

The source is verified with signing public keys kept apart from it (``public_keys``: the CLI
passes ``--public-key`` files, or the public half of the broker's own ``[journal] signing_key``),
never with the key the file records: whoever could write the file could re-sign a rewritten
history with a key of their own and record it there -- a file the broker itself refuses to open
(its signing key does not match), which migrate would otherwise copy, registering the forger's
key as a trusted signer of the shared journal.  Only the given keys are registered.

The source is held under its exclusive writer lock (``lock.WriterLock``, as a daemon holds it)
from before its verify until the copy has verified: a daemon that owns it, or an embedded
writer (``affidavit call``, ``Broker.open``) that has it open, refuses the migrate
(``JournalLocked``: ``JOURNAL_LOCKED``, naming the daemon), and none can start while it runs.
Without it a broker went on appending to the file after the copy was taken -- a call in flight
was left open in the copy (recovered ``unknown`` there, its stored result absent) while migrate
reported "both verify".  The lock says it is held for this one job (``lock.JOB``): a writer
refused meanwhile is told to wait for the migrate, not to ask a daemon.  A source on a file
system mounted read-only as a whole is copied without it (``Migration.read_only``): none can be
made there, and nothing can write the journal; on a read-only *bind* mount the lock file
there is held opened read-only (none there: refused).  The source is a SQLite file: a shared journal
is refused (its brokers take no lock a migrate could hold, and it is shared already).
"""

from __future__ import annotations

import base64
import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .backend import Backend, is_url, open_backend
from .connect import REGISTERED
from .errors import JournalError, VerifyReport
from .exposure import read_only
from .lock import JournalLocked, NoLockToHold, WriterLock
from .names import journal_file
from .reader import JournalReader
from .signing import key_id_of
from .tables import Tables

__all__ = ["Migration", "migrate"]

_BATCH = 1000


@dataclass
class Migration:
    """What was copied, and both sides' verification."""

    source: VerifyReport
    target: VerifyReport
    counts: dict[str, int] = field(default_factory=dict)
    read_only: bool = False
    """The source is on a file system mounted read-only as a whole: copied without its writer
    lock (none can be made there, and no writer can be appending to it)."""


def migrate(
    source: str | os.PathLike[str],
    target: str,
    *,
    public_keys: Sequence[bytes],
    accept_unsigned: bool = False,
) -> Migration:
    """Copy the journal at ``source`` into the empty shared journal at ``target`` and verify
    both with ``public_keys`` (raw Ed25519 signing keys kept apart from the source; at least
    one), which become the target's registered keys.  ``JournalError`` (nothing copied) if the
    source does not verify with them or the target is not empty; (everything copied, and the
    message says the copy fails verification) if the target does not verify to the source's
    head."""
    if not public_keys:
        raise JournalError(
            "migrate verifies the source with its signing public key kept apart from it (the "
            "key the file records is whoever wrote it last); nothing was copied"
        )
    if is_url(os.fspath(source)):
        raise JournalError("the source is already a shared journal: migrate copies a SQLite file")
    keys = {key_id_of(raw): bytes(raw) for raw in public_keys}
    with JournalReader.open(source) as src:  # (none there: "no journal at", no lock made)
        lock = _sole_writer(Path(source))
        try:
            done = _migrate(src, target, keys, accept_unsigned)
        finally:
            if lock is not None:
                lock.release()
    done.read_only = lock is None
    return done


def _sole_writer(source: Path) -> WriterLock | None:
    """The source's writer lock, taken exclusive for this one job: refused (``JournalLocked``,
    nothing copied) while a daemon owns the journal, an embedded writer has it open or another
    job holds it.  None on a file system mounted read-only as a whole (a backup snapshot, a
    tmpfs remounted ``ro``): no lock can be made there, and nothing can write the journal.  A
    read-only *bind* mount is not that -- its source may be written through another mount --
    so the lock file there is held, opened read-only (a flock needs no write access, and keeps
    out a writer through the writable mount; ``WriterLock.acquire(reads_only=True)``), and with
    none there to hold the migrate is refused."""
    real = journal_file(source)
    if read_only(real):
        return None
    try:
        return WriterLock.acquire(
            source,
            f"affidavit journal migrate (pid {os.getpid()}, copying it to a shared journal)",
            real=real,  # (resolved once)
            job=True,
            reads_only=True,
        )
    except NoLockToHold:
        raise JournalError(
            f"the source {source} is on a read-only mount and has no lock file to hold (a "
            "writer may be appending to it through a writable mount, and nothing here keeps it "
            "out): migrate from the writable mount, or from a copy; nothing was copied"
        ) from None
    except JournalLocked as exc:
        if exc.job:
            raise JournalLocked(f"{exc}; nothing was copied", exc.owner, job=True) from None
        who = exc.owner or "another writer (an embedded broker, or an earlier affidavit)"
        raise JournalLocked(
            f"journal {source} is being written by {who}: stop every broker writing it before "
            "migrating (what it appended during the copy would be missing from the copy); "
            "nothing was copied",
            exc.owner,
        ) from None


def _migrate(
    src: JournalReader, target: str, keys: dict[str, bytes], accept_unsigned: bool
) -> Migration:
    """``migrate`` with the source open and held: verify it, copy it, verify the copy."""
    before = src.verify(public_keys=list(keys.values()), accept_unsigned=accept_unsigned)
    if not before.ok:
        raise JournalError(
            f"the source journal {src.where} does not verify with the given signing key"
            f"{'s' if len(keys) > 1 else ''} (first bad seq {before.first_bad_seq}: "
            f"{before.reason}); nothing was copied"
        )
    backend = open_backend(target)
    if not backend.multi_signer:
        raise JournalError("migrate copies into a shared (postgresql://) journal")
    conn = backend.connect("writer")
    try:
        counts = _copy(src, backend, conn, keys)
    finally:
        backend.close(conn)
    with JournalReader.open(target) as dst:
        after = dst.verify(public_keys=list(keys.values()), accept_unsigned=accept_unsigned)
    if not after.ok or after.count != counts["events"] or after.count < before.count:
        raise JournalError(
            f"the copy at {backend.where} does not verify ({counts['events']} events copied): "
            f"{after.reason} at seq {after.first_bad_seq}"
        )
    return Migration(before, after, counts)


def _copy(
    src: JournalReader, backend: Backend, conn: Any, keys: dict[str, bytes]
) -> dict[str, int]:
    """One transaction on the target: refuse a journal already there, then copy every table."""
    counts: dict[str, int] = {}
    out = backend.tables(conn)
    # Bounded like a broker's open (``Journal._bind``): a session holding the head refuses the
    # copy after ``reconnect``, naming its holder, rather than stalling it.
    backend.begin(conn, barrier=True, wait=backend.reconnect_within)
    try:
        backend.create(conn)
        seq, _ = out.head()
        if seq or out.meta("key_id") is not None:
            raise JournalError(
                f"the target {backend.where} already holds a journal ({seq} events): migrate "
                "copies only into an empty one"
            )
        with src.snapshot():  # one consistent view of the source (no writer: ``_sole_writer``)
            _copy_tables(src.tables, out, keys, counts)
        backend.commit(conn)
    except backend.errors as exc:
        with contextlib.suppress(Exception):
            backend.rollback(conn)
        raise JournalError(
            f"copying into {backend.where} failed, nothing was kept: {backend.describe(exc)}"
        ) from None
    except BaseException:
        with contextlib.suppress(Exception):
            backend.rollback(conn)
        raise
    return counts


def _copy_tables(src: Tables, out: Tables, keys: dict[str, bytes], counts: dict[str, int]) -> None:
    key_id = src.meta("key_id")
    if key_id is not None:
        out.insert_meta("key_id", key_id)
    for kid, raw in sorted(keys.items()):
        out.insert_meta(REGISTERED + kid, base64.b64encode(raw).decode("ascii"))
    counts["events"] = _batched(src.event_rows(), out.insert_events)
    counts["checkpoints"] = _each(src.checkpoints(), out.insert_checkpoint)
    counts["results"] = _each(src.markers(), lambda m: out.insert_result(*m))
    counts["chunks"] = _each(src.every_chunk(False), lambda c: out.put_chunk(False, *c))
    counts["auditor_copies"] = _each(src.every_chunk(True), lambda c: out.put_chunk(True, *c))
    counts["leases"] = _each(src.leases(), lambda r: out.put_lease(*r))
    counts["idempotency"] = _each(src.idempotency_rows(), out.insert_idempotency)


def _batched(rows: Iterator[Any], insert: Callable[[list[tuple[Any, ...]]], None]) -> int:
    n, batch = 0, []
    for row in rows:
        batch.append(tuple(row))
        if len(batch) >= _BATCH:
            insert(batch)
            n, batch = n + len(batch), []
    if batch:
        insert(batch)
        n += len(batch)
    return n


def _each(rows: Iterator[Any], write: Callable[[Any], None]) -> int:
    n = 0
    for row in rows:
        write(row)
        n += 1
    return n
