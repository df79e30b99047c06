"""The stable codes of what ``verify`` finds (``VerifyReport.code``: the first problem's), one
for each kind of break, so a caller -- ``affidavit journal verify --json``, a monitor -- tells
them apart without parsing the sentence.  docs/journal.md ("What verify's codes mean") lists
them; ``tests/journal/test_verify_codes.py`` checks the list, and the code of each common break.
``ANCHOR_KEY_DIFFERS``, ``ANCHOR_HISTORY_DIFFERS`` (``verify.py``) and
``SIGNING_RECORDS_REMOVED`` (``errors.SigningRecordsRemoved``) are codes of this kind too.
"""

from __future__ import annotations

__all__ = [
    "AUDIT_COPY_DIFFERS",
    "AUDIT_COPY_MISSING",
    "AUDIT_COPY_TWICE",
    "BINDING_ALTERED",
    "BINDING_MISSING",
    "CHAIN_BROKEN",
    "CHECKPOINT_INVALID",
    "CHECKPOINT_MISMATCH",
    "CHECKPOINT_MISSING",
    "CHECKPOINT_OUT_OF_PLACE",
    "CHECKPOINT_UNCHECKED",
    "CHUNK_DIFFERS",
    "CHUNK_MISSING",
    "CHUNK_TWICE",
    "LEASE_ALTERED",
    "LEASE_MISSING",
    "LINKED_CALLS_ALTERED",
    "LINKED_CALL_MISSING",
    "MARKER_DIFFERS",
    "MARKER_MISPLACED",
    "MARKER_MISSING",
    "ROWS_REMOVED",
    "ROWS_UNSIGNED",
    "ROWS_UNSIGNED_BEFORE_SIGNING",
    "ROW_ALTERED",
    "ROW_MISSING",
    "SUMMARY_DIFFERS",
]

ROW_ALTERED = "ROW_ALTERED"
"""An event row's hash does not match its columns (an edit, or a column not of its type)."""
ROW_MISSING = "ROW_MISSING"
"""The row after seq N-1 is not seq N: a row was removed (or renumbered)."""
CHAIN_BROKEN = "CHAIN_BROKEN"
"""A row does not link to the row before it (rows reordered, or relinked)."""
ROWS_REMOVED = "ROWS_REMOVED"
"""The journal ends before a checkpoint's seq: rows were cut from its end."""
CHECKPOINT_UNCHECKED = "CHECKPOINT_UNCHECKED"
"""A checkpoint, and no public key to check it with."""
CHECKPOINT_INVALID = "CHECKPOINT_INVALID"
"""A checkpoint not signed by a trusted key (or claiming an adoption mid-journal)."""
CHECKPOINT_MISSING = "CHECKPOINT_MISSING"
"""A checkpoint names a previous one that is not the checkpoint before it: one was removed."""
CHECKPOINT_MISMATCH = "CHECKPOINT_MISMATCH"
"""The rows up to a validly signed checkpoint hash to another head: altered and re-chained."""
CHECKPOINT_OUT_OF_PLACE = "CHECKPOINT_OUT_OF_PLACE"
"""(``verify --since``) a checkpoint appeared among the rows an earlier verify had covered."""
ROWS_UNSIGNED = "ROWS_UNSIGNED"
"""Rows after the last signed checkpoint (appended without the key, or checkpoints removed)."""
ROWS_UNSIGNED_BEFORE_SIGNING = "ROWS_UNSIGNED_BEFORE_SIGNING"
"""Rows written before the journal was signed, not accepted (``--accept-unsigned`` does)."""
MARKER_MISSING = "MARKER_MISSING"
"""A RESULT_COMMITTED event whose completeness marker (``results`` row) is not there."""
MARKER_MISPLACED = "MARKER_MISPLACED"
"""A results row naming another seq than its RESULT_COMMITTED, or altered (a column not of its
type)."""
MARKER_DIFFERS = "MARKER_DIFFERS"
"""A completeness marker that differs from its chained event (or does not read)."""
SUMMARY_DIFFERS = "SUMMARY_DIFFERS"
"""A result's sealed summary, or its auditor copy, differs from its chained hash."""
CHUNK_MISSING = "CHUNK_MISSING"
"""A stored result's chunk is not there (its row removed, or its segment file gone)."""
CHUNK_DIFFERS = "CHUNK_DIFFERS"
"""A stored result's chunk differs from the hash its chained event lists (an edit)."""
CHUNK_TWICE = "CHUNK_TWICE"
"""A chunk stored twice (a row and a segment reference for one index)."""
AUDIT_COPY_MISSING = "AUDIT_COPY_MISSING"
"""A chunk's auditor copy is not there."""
AUDIT_COPY_DIFFERS = "AUDIT_COPY_DIFFERS"
"""A chunk's auditor copy differs from its chained hash."""
AUDIT_COPY_TWICE = "AUDIT_COPY_TWICE"
"""A chunk's auditor copy stored twice."""
BINDING_ALTERED = "BINDING_ALTERED"
"""An idempotency binding row that is not what its chained ACTION_ACCEPTED says."""
BINDING_MISSING = "BINDING_MISSING"
"""An ACTION_ACCEPTED naming an idempotency key with no binding row (removed)."""
LEASE_ALTERED = "LEASE_ALTERED"
"""A lease row that is not what its invocation's last chained lease event says."""
LEASE_MISSING = "LEASE_MISSING"
"""A lease event whose lease row is not there (removed)."""
LINKED_CALL_MISSING = "LINKED_CALL_MISSING"
"""A row naming a linked call that ``linked_calls`` does not hold."""
LINKED_CALLS_ALTERED = "LINKED_CALLS_ALTERED"
"""A ``linked_calls`` row that no event names."""
