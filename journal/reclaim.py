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

The candidates are the rows of ``chunk_owners`` (schema 6 on SQLite, 2 on PostgreSQL): an
invocation is named there with its first chunk and taken out by the transaction that stores its
marker, or by the reclaim that drops its chunks -- so the read is of the few invocations with
uncommitted chunks, not a scan of every chunk row (``tests/benchmarks/reclaim_candidates.py``).
A name whose marker is stored after all (an older broker's commit) is only taken out.

Not reclaimed here: on a SQLite journal a long result's bytes go to segment files and become
rows only with the commit (``segments.py``), so an interrupted attempt leaves unreferenced bytes
in a segment, not rows.  ``Journal.reclaim(segments=True)`` (``affidavit journal reclaim``, a
daemon's start-up) then gives those back too (``compact.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from affidavit.statemachine import STATES

from .compact import Compaction
from .txn import Txn

__all__ = ["BATCH", "Reclaimed", "Reclamation", "reclaim_op"]

BATCH = 200
"""Candidates one writer transaction checks and drops (``Journal.reclaim_chunks``): the
transaction holds the chain head, which every other broker's write waits for at most
``[journal] reconnect`` (then fails).  A caller can leave an interrupted attempt's chunks
behind with every call it cancels mid-body, thousands between two restarts: in one
transaction (~0.5 ms each on PostgreSQL) their check would hold the head past that bound."""


@dataclass(frozen=True, slots=True)
class Reclaimed:
    """What one final record's uncommitted chunks, dropped (or, in a dry run, droppable),
    measured (``reclaim_op(measure=True)``)."""

    invocation_id: str
    chunks: int
    """Its ``result_chunks`` rows."""
    audit: int
    """Its ``result_audit`` rows (auditor copies)."""
    bytes: int
    """The stored (sealed) bytes of both."""


@dataclass(frozen=True, slots=True)
class Reclamation:
    """What one reclaim did (``Journal.reclaim``)."""

    dropped: list[str]
    """The final records whose chunks were dropped (a dry run: would be), by invocation id."""
    kept: list[str]
    """The records with uncommitted chunks that are still open (an attempt under way, here or
    on another broker, or one a stopped broker left for a daemon's start-up recovery): kept."""
    measured: list[Reclaimed]
    """What each of ``dropped`` had stored, in its order -- only when asked (``measure``: the
    command line shows it; a daemon's start-up does not, and spends no reads on it under the
    chain head); else empty."""
    compacted: Compaction | None = None
    """What the compaction of the segment files returned (``compact.py``): only when asked
    (``Journal.reclaim(segments=True)``) and on a SQLite journal."""


def reclaim_op(
    candidates: Sequence[str], *, dry_run: bool = False, measure: bool = False
) -> Callable[[Txn], Reclamation]:
    """The writer op: of ``candidates`` (``Tables.unmarked_chunk_owners``, read outside the
    writer's transaction), drop the chunk rows of each still without a marker whose record is
    final; answer those, with what was dropped.  A candidate with a marker is only taken out
    of ``chunk_owners``.  Every record is checked before the first row is deleted, so a refusal
    (an altered row) leaves the transaction with nothing written.  ``dry_run``: the same
    checks, nothing written.  ``measure``: also what each dropped record had stored
    (``Tables.chunk_sizes``: two reads each, in the transaction that holds the chain head --
    so only when asked)."""

    def op(txn: Txn) -> Reclamation:
        txn.preload(set(candidates))  # their events in a few reads, not one read each
        tables = txn.tables
        marked = {iid for iid in candidates if tables.has_result(iid)}
        drop: list[str] = []
        kept: list[str] = []
        for iid in candidates:
            if iid not in marked:
                (drop if STATES[txn.projector(iid).state].final else kept).append(iid)
        measured = [Reclaimed(iid, *tables.chunk_sizes(iid)) for iid in drop] if measure else []
        if not dry_run:
            for iid in sorted(marked):
                tables.disown_chunks(iid)
            for iid in drop:
                tables.drop_unmarked_chunks(iid)
        return Reclamation(drop, kept, measured)

    return op
