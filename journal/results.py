"""Stored results: sealed chunks, the completeness marker, and reading a result back verified --
whole, or chunk by chunk from any chunk on.

Seed, "A result delivery error must not repeat execution": "Store chunks with sequence numbers
and a final completeness marker ... The caller may resume delivery from the last verified chunk,
but the broker must not declare the result complete until it receives the terminator".  A result
exists only once its marker does: the marker (``results`` row) and RESULT_COMMITTED are written
in one barrier transaction.

What the chained RESULT_COMMITTED event carries, so that every stored byte is covered by the hash
chain and the signed checkpoints without any key:

* ``sha256`` -- the whole result (SHA-256 over the streams' plaintext hashes), as the marker;
* ``summary_sha256`` -- the summary's plaintext (status, headers, exit status);
* ``marker_sha256`` -- the marker's stream table, which lists the SHA-256 of every *sealed* chunk
  (and of every auditor copy), so one chunk is checked on its own, before it is opened;
* ``sealed_summary_sha256`` (and ``audit_summary_sha256``) -- the sealed summary blobs.

Reading checks the event, the marker and each chunk against those hashes; anything else is a
``JournalError`` naming the invocation, stream and chunk -- never a partial or altered result.
Every read first proves the RESULT_COMMITTED row itself: re-hashed from its columns and covered by
a validly signed checkpoint, whatever its attrs say.  Results stored before ``marker_sha256``
existed (before the journal was signed: only rows its ``adopted`` checkpoint covers) are then
checked as before: by opening every chunk of a stream and comparing the stream's plaintext hash
(so they are read whole).  A result event after that lacking the current fields is altered.

The code is split along that seam: ``results_read.py`` reads (``load_marker``, ``open_result``,
``ResultStream``), ``results_write.py`` writes (``chunk_op``, ``ChunkLog``, ``PostingWriter``,
``commit_op``).  This module names both, so callers import from one place.
"""

from __future__ import annotations

from .results_read import (
    CURRENT_RESULT_ATTRS,
    SUMMARY_STREAM,
    Marker,
    ResultStream,
    Store,
    StoredResult,
    StreamInfo,
    load_marker,
    open_result,
    whole_sha256,
)
from .results_write import (
    IN_FLIGHT,
    ChunkLog,
    PostingWriter,
    ResultStreams,
    ResultWriter,
    chunk_op,
    commit_op,
    stream_info,
)

__all__ = [
    "CURRENT_RESULT_ATTRS",
    "IN_FLIGHT",
    "SUMMARY_STREAM",
    "ChunkLog",
    "Marker",
    "PostingWriter",
    "ResultStream",
    "ResultStreams",
    "ResultWriter",
    "Store",
    "StoredResult",
    "StreamInfo",
    "chunk_op",
    "commit_op",
    "load_marker",
    "open_result",
    "stream_info",
    "whole_sha256",
]
