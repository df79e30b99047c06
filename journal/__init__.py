"""Affidavit's journal: durable, append-only, hash-chained and sealed -- on SQLite (embedded) or
PostgreSQL (several brokers sharing one journal).

Seed: "In-memory-only state helps improve the error text, but it provides no grounds for a retry
after the broker or the caller restarts."  This package is the durable record everything else
rests on: events with a monotonic ``seq``, durability barriers with group commit, a hash chain
``verify`` checks without any key, sealed payloads (broker key plus a write-only auditor copy),
results with completeness markers, leases, idempotency records and the action/session views --
and, against someone who can rewrite the file, a checkpoint per transaction signed with an
Ed25519 key that ``verify`` checks with the public key alone (docs/journal.md).

The modules, by role (``store.py``'s docstring says how they fit together):

    store.py        Journal: open, the writes the engine needs, the record cache -- the
                    interface everything above the journal holds
    writer.py       the single writer task: queue, group commit, the hand-off of each batch
                    to the writer thread
    requests.py     what is queued to it: a write, a batch as hooks see it, a posted write
    commit.py       one transaction per batch on the writer thread: a signed checkpoint per
                    transaction, another writer caught up with, a lost connection survived
    txn.py          one transaction: projection check, hash chain, queued rows
    leases.py       lease and idempotency writes (checked inside the writer's transaction)
    boot.py         a lease's end, a key's binding, by the boot clock (CLOCK_BOOTTIME)
    results.py      result chunks, the completeness marker, reading a result back verified
                    (whole, or chunk by chunk: ``ResultStream``) -- the names of these two:
    results_read.py   the marker checked against its event, a result opened verified
    results_write.py  sealed chunks, the writer's log, posting writer, the commit op
    segments.py     long results' chunks in segment files beside a SQLite journal, written
                    and synced by threads of their own
    segment_tables.py  reading those chunks through their reference rows, bounded
    audit.py        the auditor's side of results: opening their auditor copies
    reader.py       JournalReader: every read, for the broker and for read-only tools
    reader_base.py  its connection, a read tried again once, the clock reads judge by
    reader_proofs.py  its keys, the checkpoint covering a row, verify and anchors
    reader_views.py   its action and session views, filtered, streamed, paged
    views.py        the action and session views (folds over the events table)
    checkpoints.py  signing a transaction's checkpoint, refusing an unsigned head
    connect.py      binding a journal to its sealing key and signing keys
    migrate.py      copying a journal to another backend, verified on both sides
    rows.py         rows to Events/Leases/IdempotencyRecords, attrs to and from canonical JSON
    chain.py        canonical row bytes and the hash chain
    verify.py       verify: chain, checkpoints, anchor, stored results -- public keys only
    signing.py      the Ed25519 signing key, checkpoint messages, public keys, anchors
    sealing.py      the broker key, write-only audit copies, associated data
    errors.py       errors and the small records handed out

    backend.py      the backend interface, and choosing one for a path or a URL
    tables.py       every statement the journal runs, as named methods
    sqlite.py       the SQLite backend: its statements, BEGIN IMMEDIATE, the writer lock
    sqlite_schema.py  its schema (and ``segments.py``'s reference table), opening older files
    sqlite_wal.py     its writer's connection (WAL) and the thread checkpointing the WAL
    postgres.py     the PostgreSQL backend: schema, advisory lock on the chain head, reconnects

Only the last six speak SQL or know a database; everything above ``tables.py`` is the same code
on every backend, and one conformance suite (tests/journal/conformance/) runs on each.
"""

from typing import TYPE_CHECKING, Any

from .backend import Backend, is_url
from .boot import boot_between, boot_lapsed, boot_mark, boot_stamp, with_boot_mark
from .chain import GENESIS
from .errors import (
    ApprovalLapsed,
    CommitUnknown,
    IdempotencyMismatch,
    IdempotencyRecord,
    JournalError,
    JournalLost,
    JournalNotDurable,
    JournalReplaced,
    JournalUnavailable,
    JournalWriteError,
    KeyRetentionPassed,
    Lease,
    LeaseBusy,
    LeaseEventRefused,
    LeaseLost,
    NoAuditorCopy,
    ReadFailed,
    ResultStoreFailed,
    ResultStoreUnknown,
    ResultUnverified,
    SealUnopened,
    SigningRecordsRemoved,
    VerifyReport,
    told,
)
from .exposure import (
    CREDENTIAL,
    TARGET_CREDENTIAL,
    TRUST_ANCHOR,
    Exposure,
    config_exposure,
    directory_exposures,
    exposure,
    journal_exposures,
    warn_exposed,
)
from .lock import JournalLocked
from .reader import JournalReader
from .rows import AlteredRow, json_copy
from .sealing import AuditOpener, generate_auditor_keypair, open_audit_payload, random_bytes
from .signing import Anchor, Checkpoint, SigningKey, load_anchor, load_public_key, public_key_pem
from .summary import AsOf, SessionSummary

if TYPE_CHECKING:
    from .requests import Batch, Posted
    from .results import ChunkLog, ResultStream, ResultWriter, StoredResult, StreamInfo
    from .store import Journal

_WRITER_SIDE = {
    "Batch": "requests",
    "Posted": "requests",
    "ChunkLog": "results",
    "ResultStream": "results",
    "ResultWriter": "results",
    "StoredResult": "results",
    "StreamInfo": "results",
    "Journal": "store",
}
"""Names imported when first asked for: the writer's side imports trio (~0.15 s of a process's
start), which a reader -- ``affidavit actions``, ``journal verify``, ``actions --json``'s two
processes -- never uses."""


if not TYPE_CHECKING:  # (seen by mypy, it would type any misspelled name as Any)

    def __getattr__(name: str) -> Any:
        module = _WRITER_SIDE.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        import importlib

        value = getattr(importlib.import_module(f".{module}", __name__), name)
        globals()[name] = value  # asked once
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *_WRITER_SIDE})


__all__ = [
    "CREDENTIAL",
    "GENESIS",
    "TARGET_CREDENTIAL",
    "TRUST_ANCHOR",
    "AlteredRow",
    "Anchor",
    "ApprovalLapsed",
    "AsOf",
    "AuditOpener",
    "Backend",
    "Batch",
    "Checkpoint",
    "ChunkLog",
    "CommitUnknown",
    "Exposure",
    "IdempotencyMismatch",
    "IdempotencyRecord",
    "Journal",
    "JournalError",
    "JournalLocked",
    "JournalLost",
    "JournalNotDurable",
    "JournalReader",
    "JournalReplaced",
    "JournalUnavailable",
    "JournalWriteError",
    "KeyRetentionPassed",
    "Lease",
    "LeaseBusy",
    "LeaseEventRefused",
    "LeaseLost",
    "NoAuditorCopy",
    "Posted",
    "ReadFailed",
    "ResultStoreFailed",
    "ResultStoreUnknown",
    "ResultStream",
    "ResultUnverified",
    "ResultWriter",
    "SealUnopened",
    "SessionSummary",
    "SigningKey",
    "SigningRecordsRemoved",
    "StoredResult",
    "StreamInfo",
    "VerifyReport",
    "boot_between",
    "boot_lapsed",
    "boot_mark",
    "boot_stamp",
    "config_exposure",
    "directory_exposures",
    "exposure",
    "generate_auditor_keypair",
    "is_url",
    "journal_exposures",
    "json_copy",
    "load_anchor",
    "load_public_key",
    "open_audit_payload",
    "public_key_pem",
    "random_bytes",
    "told",
    "warn_exposed",
    "with_boot_mark",
]
