"""Affidavit's journal: durable, append-only, hash-chained and sealed (SQLite, WAL).

Seed: "In-memory-only state helps improve the error text, but it provides no grounds for a retry
after the broker or the caller restarts."  This package is the durable record everything else
rests on: events with a monotonic ``seq``, durability barriers with group commit, a hash chain
``verify`` checks without any key, sealed payloads (broker key plus a write-only auditor copy),
results with completeness markers, leases, idempotency records and the action/session views --
and, against someone who can rewrite the file, a checkpoint per transaction signed with an
Ed25519 key that ``verify`` checks with the public key alone (docs/journal.md).

The modules, by role (``store.py``'s docstring says how they fit together):

    store.py        Journal: open, the writes the engine needs, the record cache
    writer.py       the single writer task: queue, group commit, one transaction per batch,
                    a signed checkpoint per transaction
    txn.py          one transaction: projection check, hash chain, queued rows
    leases.py       lease and idempotency writes (checked inside the writer's transaction)
    results.py      result chunks, the completeness marker, reading a result back verified
                    (whole, or chunk by chunk: ``ResultStream``)
    audit.py        the auditor's side of results: opening their auditor copies
    reader.py       JournalReader: every read, for the broker and for read-only tools
    views.py        the action and session views (folds over the events table)
    checkpoints.py  the checkpoints table: sign, refuse an unsigned head, read back
    connect.py      opening the SQLite file: WAL and sync pragmas, schema, broker and signing keys
    rows.py         rows to Events/Leases/IdempotencyRecords, attrs to and from canonical JSON
    chain.py        schema, canonical row bytes and the hash chain
    verify.py       verify: chain, checkpoints, anchor, stored results -- public keys only
    signing.py      the Ed25519 signing key, checkpoint messages, public keys, anchors
    sealing.py      the broker key, write-only audit copies, associated data
    errors.py       errors and the small records handed out

Everything that speaks SQL is in store/writer/txn/leases/results/audit/reader/views/
checkpoints/connect/rows and chain's schema; errors, sealing, signing and verify know nothing of
SQLite (a backend hands ``verify`` its rows through ``verify.Source``), nor does the hash
computation.
"""

from .chain import GENESIS
from .errors import (
    IdempotencyMismatch,
    IdempotencyRecord,
    JournalError,
    JournalWriteError,
    Lease,
    LeaseBusy,
    LeaseLost,
    ResultStoreFailed,
    VerifyReport,
)
from .lock import JournalLocked
from .reader import JournalReader
from .results import ResultStream, StoredResult, StreamInfo
from .sealing import AuditOpener, generate_auditor_keypair, open_audit_payload
from .signing import Anchor, Checkpoint, SigningKey, load_anchor, load_public_key, public_key_pem
from .store import Journal
from .writer import Batch, Posted

__all__ = [
    "GENESIS",
    "Anchor",
    "AuditOpener",
    "Batch",
    "Checkpoint",
    "IdempotencyMismatch",
    "IdempotencyRecord",
    "Journal",
    "JournalError",
    "JournalLocked",
    "JournalReader",
    "JournalWriteError",
    "Lease",
    "LeaseBusy",
    "LeaseLost",
    "Posted",
    "ResultStoreFailed",
    "ResultStream",
    "SigningKey",
    "StoredResult",
    "StreamInfo",
    "VerifyReport",
    "generate_auditor_keypair",
    "load_anchor",
    "load_public_key",
    "open_audit_payload",
    "public_key_pem",
]
