"""Affidavit's journal: durable, append-only, hash-chained and sealed (SQLite, WAL).

Seed: "In-memory-only state helps improve the error text, but it provides no grounds for a retry
after the broker or the caller restarts."  This package is the durable record everything else
rests on: events with a monotonic ``seq``, durability barriers with group commit, a hash chain
``verify`` checks without any key, sealed payloads (broker key plus a write-only auditor copy),
results with completeness markers, leases, idempotency records and the action/session views.
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
from .sealing import generate_auditor_keypair
from .store import Journal, JournalReader, Posted, StoredResult, open_audit_payload

__all__ = [
    "GENESIS",
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
