"""Affidavit's journal: durable, append-only, hash-chained and sealed (SQLite, WAL).

Seed: "In-memory-only state helps improve the error text, but it provides no grounds for a retry
after the broker or the caller restarts."  This package is the durable record everything else
rests on: events with a monotonic ``seq``, durability barriers with group commit, a hash chain
``verify`` checks without any key, sealed payloads (broker key plus a write-only auditor copy),
results with completeness markers, leases, idempotency records and the action/session views.

The modules, by role (``store.py``'s docstring says how they fit together):

    store.py     Journal: open, the writes the engine needs, the record cache
    writer.py    the single writer task: queue, group commit, one transaction per batch
    txn.py       one transaction: projection check, hash chain, queued rows
    leases.py    lease and idempotency writes (checked inside the writer's transaction)
    results.py   result chunks, the completeness marker, reading a result back verified
    reader.py    JournalReader: every read, for the broker and for read-only tools
    views.py     the action and session views (folds over the events table)
    connect.py   opening the SQLite file: WAL and sync pragmas, schema, broker key
    rows.py      rows to Events/Leases/IdempotencyRecords, attrs to and from canonical JSON
    chain.py     schema, canonical row bytes, the hash chain and ``verify``
    sealing.py   the broker key, write-only audit copies, associated data
    errors.py    errors and the small records handed out

Everything that speaks SQL is in store/writer/txn/leases/results/reader/views/connect/rows and
chain's schema; errors, sealing and the hash computation know nothing of SQLite.
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
from .reader import JournalReader
from .results import StoredResult
from .sealing import generate_auditor_keypair, open_audit_payload
from .store import Journal
from .writer import Batch, Posted

__all__ = [
    "GENESIS",
    "Batch",
    "IdempotencyMismatch",
    "IdempotencyRecord",
    "Journal",
    "JournalError",
    "JournalReader",
    "JournalWriteError",
    "Lease",
    "LeaseBusy",
    "LeaseLost",
    "Posted",
    "ResultStoreFailed",
    "StoredResult",
    "VerifyReport",
    "generate_auditor_keypair",
    "open_audit_payload",
]
