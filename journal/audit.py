"""The auditor's side of results: open a stored result's auditor copy with the auditor's private
key, checked against the same chained hashes as the broker's copy.

DESIGN, "Journal": "the audit copy can be sealed to an auditor's public key so the broker appends
what it cannot read back".  With ``[journal] auditor_public_key`` set, every result chunk and
summary is sealed twice -- to the broker key (the broker reads it back) and to the auditor's
X25519 key (``result_audit``).  The marker lists each auditor copy's SHA-256 and the chained event
carries the marker's, so the auditor checks a copy against the signed chain before opening it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from .errors import NoAuditorCopy, ResultUnverified
from .results import SUMMARY_STREAM, Store, StoredResult, load_marker
from .sealing import AuditOpener, chunk_aad, summary_aad
from .signing import Checkpoint

__all__ = ["read_result"]


def read_result(
    store: Store,
    invocation_id: str,
    private_key_file: str | os.PathLike[str],
    *,
    covered: Callable[[int], Checkpoint],
) -> StoredResult | None:
    """The auditor copy of a stored result, verified; None without a completeness marker.
    Its RESULT_COMMITTED row must be covered by a trusted checkpoint (``covered``), whatever
    the result's age: the copies are sealed to a public key.
    ``NoAuditorCopy`` if its chained event names no auditor copy of it (stored while no
    auditor key was configured); ``ResultUnverified`` if any part of it
    fails verification (``SealUnopened``: a proven copy the key does not open -- not the
    auditor key it was sealed to)."""
    marker = load_marker(store, invocation_id, covered=covered)
    if marker is None:
        return None
    bad = f"auditor copy of the result of invocation {invocation_id} (seq {marker.seq})"
    want_summary = marker.attrs.get("audit_summary_sha256")
    if want_summary is None:
        if any(info.audit is not None for info in marker.streams.values()):
            raise ResultUnverified(f"{bad}: stream copies listed, no summary copy chained")
        raise NoAuditorCopy(f"{bad} does not exist (no auditor key was configured when stored)")
    opener = AuditOpener.load(private_key_file)
    blobs = {(str(s), int(i)): d for s, i, d in store.tables.chunks(True, invocation_id)}
    summary_blob = blobs.get((SUMMARY_STREAM, 0))
    if summary_blob is None or hashlib.sha256(summary_blob).hexdigest() != want_summary:
        raise ResultUnverified(f"{bad}: the summary copy differs from the chained event")
    summary_plain = opener.open(summary_blob, summary_aad(invocation_id))
    if hashlib.sha256(summary_plain).hexdigest() != marker.attrs.get("summary_sha256"):
        raise ResultUnverified(f"{bad}: the summary differs from the chained event")
    streams: dict[str, bytes] = {}
    for name, info in marker.streams.items():
        if info.audit is None:
            raise ResultUnverified(f"{bad}: stream {name!r} has no auditor copy")
        parts: list[bytes] = []
        for idx, want in enumerate(info.audit):
            blob = blobs.get((name, idx))
            if blob is None or hashlib.sha256(blob).hexdigest() != want:
                raise ResultUnverified(f"{bad}: stream {name!r} copy {idx} differs from its hash")
            parts.append(opener.open(blob, chunk_aad(invocation_id, name, idx)))
        body = b"".join(parts)
        if hashlib.sha256(body).hexdigest() != info.sha256:
            raise ResultUnverified(f"{bad}: stream {name!r} differs from the chained event")
        streams[name] = body
    summary: Mapping[str, Any] = json.loads(summary_plain)
    return StoredResult(invocation_id, summary, streams, marker.sha256, marker.seq)
