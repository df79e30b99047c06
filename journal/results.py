"""Stored results: sealed chunks, the completeness marker, and reading a result back verified.

Seed, "A result delivery error must not repeat execution": "Store chunks with sequence numbers
and a final completeness marker ... the broker must not declare the result complete until it
receives the terminator".  A result exists only once its marker does: the marker (``results``
row) and RESULT_COMMITTED are written in one barrier transaction, and both carry the whole
result's SHA-256, so the hash chain covers what the marker promises.  Reading a result back
checks every chunk, every stream's hash, the whole hash and the summary's hash against that
chained event; anything else is a ``JournalError``, never a partial result.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from affidavit.statemachine import Event, EventKind

from .chain import canonical_json
from .errors import JournalError, ResultStoreFailed
from .sealing import BrokerKey, chunk_aad, summary_aad
from .txn import Txn, row_args

__all__ = ["StoredResult", "chunk_op", "commit_op", "read"]


@dataclass(frozen=True, slots=True)
class StoredResult:
    """A complete stored result: only ever built from a completeness marker whose hashes match."""

    invocation_id: str
    summary: Mapping[str, Any]
    streams: dict[str, bytes]
    sha256: str
    seq: int
    """The RESULT_COMMITTED event's seq."""


def whole_sha256(per_stream: Mapping[str, Mapping[str, Any]]) -> str:
    """The whole result's hash: SHA-256 of the canonical JSON ``{stream: stream_sha256}``."""
    return hashlib.sha256(
        canonical_json({s: v["sha256"] for s, v in per_stream.items()}).encode()
    ).hexdigest()


def read(
    conn: sqlite3.Connection, broker_key: Callable[[], BrokerKey], invocation_id: str
) -> StoredResult | None:
    """The stored result, or None unless its completeness marker exists (``broker_key`` is
    called only then)."""
    conn.execute("BEGIN")
    try:
        marker = conn.execute(
            "SELECT seq, sha256, streams, summary FROM results WHERE invocation_id = ?",
            (invocation_id,),
        ).fetchone()
        if marker is None:
            return None
        seq, sha, streams_json, summary_blob = marker
        ev = conn.execute(
            "SELECT kind, invocation_id, attrs FROM events WHERE seq = ?", (seq,)
        ).fetchone()
        chunks = conn.execute(
            "SELECT stream, idx, data FROM result_chunks WHERE invocation_id = ? "
            "ORDER BY stream, idx",
            (invocation_id,),
        ).fetchall()
    finally:
        conn.execute("COMMIT")
    bad = f"stored result of invocation {invocation_id} (seq {seq}) fails verification"
    if ev is None or ev[0] != EventKind.RESULT_COMMITTED.value or ev[1] != invocation_id:
        raise JournalError(f"{bad}: no RESULT_COMMITTED event at its seq")
    chained = json.loads(ev[2])
    if chained.get("sha256") != sha:
        raise JournalError(f"{bad}: marker hash differs from the chained event")
    declared: dict[str, dict[str, Any]] = json.loads(streams_json)
    key = broker_key()
    parts: dict[str, list[bytes]] = {s: [] for s in declared}
    for stream, idx, data in chunks:
        if stream not in parts or idx != len(parts[stream]):
            continue  # chunks beyond the marker's count are not part of the result
        parts[stream].append(key.open(data, chunk_aad(invocation_id, stream, idx)))
    streams: dict[str, bytes] = {}
    for stream, info in declared.items():
        got = parts[stream][: info["chunks"]]
        body = b"".join(got)
        if len(got) != info["chunks"] or hashlib.sha256(body).hexdigest() != info["sha256"]:
            raise JournalError(f"{bad}: stream {stream!r} is incomplete or altered")
        streams[stream] = body
    if whole_sha256(declared) != sha:
        raise JournalError(f"{bad}: whole-result hash differs")
    summary_bytes = key.open(summary_blob, summary_aad(invocation_id))
    want = chained.get("summary_sha256")
    if want is not None and hashlib.sha256(summary_bytes).hexdigest() != want:
        raise JournalError(f"{bad}: summary differs from the chained event")
    summary: Mapping[str, Any] = json.loads(summary_bytes)
    return StoredResult(invocation_id, summary, streams, sha, seq)


def chunk_op(
    key: BrokerKey, invocation_id: str, stream: str, index: int, data: bytes
) -> Callable[[Txn], None]:
    """The write of one sealed chunk (sealed here, in the submitting task).  Index 0 starts the
    stream over, dropping chunks of an earlier, uncommitted attempt; a stored result is never
    added to."""
    if index < 0:
        raise ValueError("chunk index must be >= 0")
    sealed = key.seal(bytes(data), chunk_aad(invocation_id, stream, index))

    def op(txn: Txn) -> None:
        done = txn.conn.execute(
            "SELECT 1 FROM results WHERE invocation_id = ?", (invocation_id,)
        ).fetchone()
        if done is not None:
            raise JournalError(f"the result of invocation {invocation_id} is already stored")
        if index == 0:
            txn.conn.execute(
                "DELETE FROM result_chunks WHERE invocation_id = ? AND stream = ?",
                (invocation_id, stream),
            )
        txn.conn.execute(
            "INSERT OR REPLACE INTO result_chunks (invocation_id, stream, idx, data) "
            "VALUES (?,?,?,?)",
            (invocation_id, stream, index, sealed),
        )

    return op


def commit_op(
    key: BrokerKey,
    event: Event,
    summary: Mapping[str, Any],
    expect: Mapping[str, str] | None,
) -> Callable[[Txn], Event]:
    """The write of the completeness marker and RESULT_COMMITTED (see ``Journal.commit_result``):
    it re-reads and hashes the stored chunks inside the transaction, so the marker describes
    exactly what is stored."""
    iid = event.invocation_id
    summary_bytes = canonical_json(summary).encode("utf-8")
    # The summary's hash rides in the chained event, so the summary (status, headers, exit
    # status) is as tamper-evident as the streams — not only sealed.
    summary_sha = hashlib.sha256(summary_bytes).hexdigest()
    sealed_summary = key.seal(summary_bytes, summary_aad(iid))

    def op(txn: Txn) -> Event:
        per: dict[str, dict[str, Any]] = {}
        hashers: dict[str, Any] = {}
        for stream, idx, data in txn.conn.execute(
            "SELECT stream, idx, data FROM result_chunks WHERE invocation_id = ? "
            "ORDER BY stream, idx",
            (iid,),
        ):
            info = per.setdefault(stream, {"chunks": 0, "bytes": 0})
            if idx != info["chunks"]:
                raise JournalError(
                    f"result of invocation {iid}: stream {stream!r} lacks chunk {info['chunks']}"
                )
            plain = key.open(data, chunk_aad(iid, stream, idx))
            hashers.setdefault(stream, hashlib.sha256()).update(plain)
            info["chunks"] += 1
            info["bytes"] += len(plain)
        for stream, info in per.items():
            info["sha256"] = hashers[stream].hexdigest()
        if expect is not None and {s: v["sha256"] for s, v in per.items()} != dict(expect):
            raise ResultStoreFailed(
                f"result of invocation {iid}: stored streams differ from what was written"
            )
        whole = whole_sha256(per)
        attrs = {
            **event.attrs,
            "sha256": whole,
            "chunks": {s: v["chunks"] for s, v in per.items()},
            "bytes": sum(v["bytes"] for v in per.values()),
            "summary_sha256": summary_sha,
        }
        ev = dataclasses.replace(event, attrs=attrs)
        stored = txn.insert(*row_args(ev))
        txn.conn.execute(
            "INSERT INTO results (invocation_id, seq, sha256, streams, summary) VALUES (?,?,?,?,?)",
            (iid, stored.seq, whole, canonical_json(per), sealed_summary),
        )
        return stored

    return op
