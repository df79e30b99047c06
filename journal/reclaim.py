"""Reclaiming the chunk rows of results that were never committed.

A result's chunks are side storage, not chained rows: ``result_chunks`` and ``result_audit``
rows carry no seq and no hash, and neither the chain nor a checkpoint covers them.  What makes
them evidence is the completeness marker and its RESULT_COMMITTED event, which list every
sealed chunk's SHA-256 (``results.py``).  A stream stored for an attempt whose RESULT_COMMITTED
was never written (a crash, a cancellation or a storage fault mid-body) is named by no committed
record and proves nothing: that attempt's outcome is what its events say (``unknown`` once
dispatched), with or without them.  Until now nothing removed them -- a PostgreSQL journal kept
every interrupted attempt's chunks for ever.

Only the chunks of a record that is *final* are dropped: from a final state no RESULT_COMMITTED
is accepted and ``chunk_op`` refuses new chunks, so nothing may still commit them.  An open
record's (an attempt under way here or on another broker, a result between its last chunk and
its commit) stay.  A record made final by ``interrupted`` may take a retry later; the retry's
first chunk of each stream starts that stream over anyway.  The candidates are found by a read;
the check (no marker, final) and the delete run in one writer transaction, which holds the chain
head (``Backend.begin``): no other broker's chunk or commit can come between them -- one
transaction per ``BATCH`` candidates.  Nothing is
appended: the chain, the checkpoints and ``verify`` are untouched, and what was dropped is the
caller's to log.

Not reclaimed here: on a SQLite journal a long result's bytes go to segment files and become
rows only with the commit (``segments.py``), so an interrupted attempt leaves unreferenced bytes
in a segment, not rows; a segment only grows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from affidavit.statemachine import STATES

from .txn import Txn

__all__ = ["BATCH", "reclaim_op"]

BATCH = 200
"""Candidates one writer transaction checks and drops (``Journal.reclaim_chunks``): the
transaction holds the chain head, which every other broker's write waits for at most
``[journal] reconnect`` (then fails).  A caller can leave an interrupted attempt's chunks
behind with every call it cancels mid-body, thousands between two restarts: in one
transaction (~0.5 ms each on PostgreSQL) their check would hold the head past that bound."""


def reclaim_op(candidates: Sequence[str]) -> Callable[[Txn], list[str]]:
    """The writer op: of ``candidates`` (the invocations a read found with chunk rows and no
    marker, ``Tables.unmarked_chunk_owners`` -- read outside the writer's transaction, so that
    the scan of every chunk row does not hold the chain head other brokers wait for), drop the
    chunk rows of each still without a marker whose record is final; answer those.  Every
    record is checked before the first row is deleted, so a refusal (an altered row) leaves
    the transaction with nothing written."""

    def op(txn: Txn) -> list[str]:
        txn.preload(set(candidates))  # their events in a few reads, not one read each
        tables = txn.tables
        drop = [
            iid
            for iid in candidates
            if not tables.has_result(iid) and STATES[txn.projector(iid).state].final
        ]
        for iid in drop:
            tables.drop_unmarked_chunks(iid)
        return drop

    return op
