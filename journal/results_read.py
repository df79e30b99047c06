"""Stored results, the read side: the completeness marker checked against its chained event
(``load_marker``), and a result opened verified -- whole, or chunk by chunk from any chunk on
(``open_result``, ``ResultStream``).  What is checked, and why, is in ``results.py``'s docstring;
the write side is ``results_write.py``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from affidavit.statemachine import EventKind

from .chain import canonical_json
from .errors import JournalError, ResultUnverified
from .sealing import BrokerKey, chunk_aad, summary_aad
from .signing import Checkpoint
from .tables import Tables

__all__ = [
    "CURRENT_RESULT_ATTRS",
    "SUMMARY_STREAM",
    "Marker",
    "ResultStream",
    "Store",
    "StoredResult",
    "StreamInfo",
    "load_marker",
    "open_result",
    "whole_sha256",
]


class Store(Protocol):
    """What reading a result needs of the reader holding it."""

    @property
    def tables(self) -> Tables: ...

    def snapshot(self) -> AbstractContextManager[None]:
        """One read transaction (the marker and its event read together)."""
        ...

    def guarded(self, what: str) -> Guard:
        """A database error inside becomes a ``JournalError`` naming ``what``."""
        ...


class Guard(Protocol):
    """A context manager that never swallows an exception (it may replace one)."""

    def __enter__(self) -> None: ...

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None: ...


SUMMARY_STREAM = ""
"""``result_audit``'s stream name for the summary's auditor copy (no result stream is empty)."""


@dataclass(frozen=True, slots=True)
class StoredResult:
    """A complete stored result: only ever built from a completeness marker whose hashes match.
    ``from_chunk`` > 0: each stream holds its bytes from that chunk on (a resumed read)."""

    invocation_id: str
    summary: Mapping[str, Any]
    streams: dict[str, bytes]
    sha256: str
    seq: int
    """The RESULT_COMMITTED event's seq."""
    from_chunk: int = 0


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """One stream as its completeness marker declares it."""

    chunks: int
    bytes: int
    sha256: str
    """Hex SHA-256 of the stream's (redacted) plaintext."""
    sealed: tuple[str, ...] | None
    """Hex SHA-256 of each sealed chunk as stored (None: a result from before they were kept)."""
    audit: tuple[str, ...] | None
    """Hex SHA-256 of each chunk's auditor copy (None: no auditor key was configured)."""


Fetch = Callable[[str, int], "bytes | None"]


class ResultStream:
    """A committed result whose marker matches its chained event: the summary and the stream
    table are verified; ``chunks`` reads and verifies one chunk at a time.  The seam for
    resumable delivery (``affidavit result --from-chunk``, the daemon, MCP): nothing it yields
    has failed verification, and a chunk that fails stops the iteration with ``JournalError``."""

    def __init__(
        self,
        invocation_id: str,
        seq: int,
        sha256: str,
        summary: Mapping[str, Any],
        streams: Mapping[str, StreamInfo],
        fetch: Fetch,
        key: BrokerKey,
    ) -> None:
        self.invocation_id = invocation_id
        self.seq = seq
        self.sha256 = sha256
        self.summary = summary
        self.streams = dict(streams)
        self._fetch = fetch
        self._key = key

    def _bad(self, stream: str, what: str) -> ResultUnverified:
        return ResultUnverified(
            f"stored result of invocation {self.invocation_id} (seq {self.seq}) fails "
            f"verification: stream {stream!r} {what}"
        )

    def chunks(
        self, stream: str, from_chunk: int = 0, to_chunk: int | None = None
    ) -> Iterator[bytes]:
        """The stream's plaintext chunks from ``from_chunk`` on (up to ``to_chunk``, excluded,
        when given: a page), each verified before it is yielded (its sealed bytes against the
        chained hash, then the AEAD tag); reading from chunk 0 to the end also checks the
        stream's plaintext hash.  ``KeyError`` for a stream the result does not have."""
        if from_chunk < 0:
            raise ValueError("from_chunk must be >= 0")
        return self._chunks(stream, self.streams[stream], from_chunk, to_chunk)

    def _chunks(
        self, stream: str, info: StreamInfo, from_chunk: int, to_chunk: int | None
    ) -> Iterator[bytes]:
        end = info.chunks if to_chunk is None else min(to_chunk, info.chunks)
        if info.sealed is None:
            # A result from before per-chunk hashes: only the whole stream can be checked.
            whole = self._legacy_stream(stream, info)
            yield from whole[from_chunk:end]
            return
        plain = hashlib.sha256() if from_chunk == 0 and end == info.chunks else None
        for idx in range(from_chunk, end):
            data = self._fetch(stream, idx)
            if data is None:
                raise self._bad(stream, f"is incomplete: chunk {idx} is missing")
            if hashlib.sha256(data).hexdigest() != info.sealed[idx]:
                raise self._bad(stream, f"chunk {idx} differs from its chained hash")
            chunk = self._open(data, stream, idx)
            if plain is not None:
                plain.update(chunk)
            yield chunk
        if plain is not None and plain.hexdigest() != info.sha256:
            raise self._bad(stream, "is incomplete or altered (plaintext hash differs)")

    def _open(self, data: bytes, stream: str, idx: int) -> bytes:
        """A chunk opened with the broker key; one that does not open is ``ResultUnverified``
        (a verdict on the stored bytes, as every other check's), whatever the chunk's age."""
        try:
            return self._key.open(data, chunk_aad(self.invocation_id, stream, idx))
        except JournalError as exc:
            raise self._bad(stream, f"chunk {idx} does not open: {exc}") from None

    def _legacy_stream(self, stream: str, info: StreamInfo) -> list[bytes]:
        out: list[bytes] = []
        for idx in range(info.chunks):
            data = self._fetch(stream, idx)
            if data is None:
                raise self._bad(stream, f"is incomplete: chunk {idx} is missing")
            out.append(self._open(data, stream, idx))
        if hashlib.sha256(b"".join(out)).hexdigest() != info.sha256:
            raise self._bad(stream, "is incomplete or altered")
        return out

    def read(self, from_chunk: int = 0, to_chunk: int | None = None) -> StoredResult:
        """Every stream (from ``from_chunk`` on, up to ``to_chunk`` excluded when given) as one
        ``StoredResult``: held whole -- the embedded reads' (a process's own memory); the
        daemon streams its answers chunk by chunk instead (``affidavit/daemon/results.py``)."""
        streams = {s: b"".join(self.chunks(s, from_chunk, to_chunk)) for s in self.streams}
        return StoredResult(
            self.invocation_id, self.summary, streams, self.sha256, self.seq, from_chunk
        )


def whole_sha256(per_stream: Mapping[str, Mapping[str, Any]]) -> str:
    """The whole result's hash: SHA-256 of the canonical JSON ``{stream: stream_sha256}``."""
    return hashlib.sha256(
        canonical_json({s: v["sha256"] for s, v in per_stream.items()}).encode()
    ).hexdigest()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _hash_list(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(h, str) for h in value):
        raise ValueError("not a list of hashes")
    return tuple(value)


def _stream_table(declared: Any) -> dict[str, StreamInfo]:
    """The marker's stream table, shape-checked (ValueError if it is not one)."""
    if not isinstance(declared, dict):
        raise ValueError("not a table")
    out: dict[str, StreamInfo] = {}
    for name, v in declared.items():
        chunks, size, sha = v["chunks"], v["bytes"], v["sha256"]
        if type(chunks) is not int or type(size) is not int or not isinstance(sha, str):
            raise ValueError("bad stream entry")
        sealed, audit = _hash_list(v.get("sealed")), _hash_list(v.get("audit"))
        for hashes in (sealed, audit):
            if hashes is not None and len(hashes) != chunks:
                raise ValueError("hash list and chunk count differ")
        out[name] = StreamInfo(chunks, size, sha, sealed, audit)
    return out


@dataclass(frozen=True, slots=True)
class Marker:
    """A completeness marker checked against its chained RESULT_COMMITTED event (no key)."""

    invocation_id: str
    seq: int
    sha256: str
    streams: dict[str, StreamInfo]
    attrs: Mapping[str, Any]
    """The chained event's attrs."""
    summary_blob: bytes


CURRENT_RESULT_ATTRS = ("marker_sha256", "sealed_summary_sha256", "summary_sha256")
"""What every RESULT_COMMITTED written since journals are signed carries (and a result without
``marker_sha256`` is one from before: its row must be covered by the ``adopted`` checkpoint)."""


def load_marker(
    store: Store, invocation_id: str, *, covered: Callable[[int], Checkpoint]
) -> Marker | None:
    """The invocation's marker, checked against its chained event, or None if it has none --
    and no RESULT_COMMITTED event either: one without its marker (its results row removed;
    both are written in one transaction) is ``ResultUnverified``, in ``verify``'s words, never
    "no result" (audit 54a: rendered ``result: null`` and recorded RESULT_DELIVERED).
    ``covered(seq)`` returns the signed checkpoint covering the event row at ``seq`` -- the row
    re-hashed from its columns -- or raises: every read proves the event row itself, whatever
    its attrs hold, before they are trusted."""
    with store.snapshot():
        marker = store.tables.marker(invocation_id)
        # Its event, or -- no marker -- whether it has one, read in the same snapshot (a result
        # being committed has both or neither).
        committed = store.tables.committed_at(invocation_id) if marker is None else None
        seq = None if marker is None else marker[0]
        ev = store.tables.event_at(seq) if type(seq) is int else None
    if marker is None:
        if committed is None:
            return None
        raise _unmarked(invocation_id, committed, covered)
    seq, sha, streams_json, summary_blob = marker
    if type(seq) is not int:  # not a row the broker wrote
        raise ResultUnverified(
            f"stored result of invocation {invocation_id} fails verification: its results "
            "row was altered (its seq is not a number)"
        )
    bad = f"stored result of invocation {invocation_id} (seq {seq}) fails verification"
    if ev is None or ev[0] != EventKind.RESULT_COMMITTED.value or ev[1] != invocation_id:
        raise ResultUnverified(f"{bad}: no RESULT_COMMITTED event at its seq")
    try:
        cp = covered(seq)
    except JournalError as exc:
        if type(exc) is not JournalError:  # the journal could not be read (not a verdict)
            raise
        raise ResultUnverified(f"{bad}: its RESULT_COMMITTED event row: {exc}") from None
    try:
        chained = json.loads(ev[2])
        declared = json.loads(streams_json)
        streams = _stream_table(declared)
    except (TypeError, ValueError, KeyError):
        raise ResultUnverified(f"{bad}: its marker or event is not readable") from None
    if not isinstance(chained, dict) or chained.get("sha256") != sha:
        raise ResultUnverified(f"{bad}: marker hash differs from the chained event")
    if whole_sha256(declared) != sha:
        raise ResultUnverified(f"{bad}: whole-result hash differs")
    summary_blob = bytes(summary_blob)
    if "marker_sha256" in chained or not cp.adopted:
        # Written by a signing broker: the current format, whole.  (Per-chunk hashes and
        # signing came together, so only rows the adopted checkpoint covers predate them.)
        missing = [k for k in CURRENT_RESULT_ATTRS if not isinstance(chained.get(k), str)]
        if missing:
            raise ResultUnverified(
                f"{bad}: its RESULT_COMMITTED event was altered: it lacks "
                + ", ".join(missing)
                + ", which every result stored since the journal was signed carries"
            )
        if _sha(canonical_json(declared).encode("utf-8")) != chained["marker_sha256"]:
            raise ResultUnverified(f"{bad}: marker differs from the chained event")
        if _sha(summary_blob) != chained["sealed_summary_sha256"]:
            raise ResultUnverified(f"{bad}: sealed summary differs from the chained event")
    return Marker(invocation_id, int(seq), sha, streams, chained, summary_blob)


def _unmarked(
    invocation_id: str, seq: int, covered: Callable[[int], Checkpoint]
) -> ResultUnverified:
    """A RESULT_COMMITTED event (at ``seq``) whose completeness marker is missing, as ``verify``
    says it -- once its row is proven; an event row that is not is said so instead."""
    try:
        covered(seq)
    except JournalError as exc:
        if type(exc) is not JournalError:  # the journal could not be read (not a verdict)
            raise
        return ResultUnverified(
            f"stored result of invocation {invocation_id} (seq {seq}) fails verification: "
            f"its RESULT_COMMITTED event row: {exc}"
        )
    return ResultUnverified(
        f"the result of invocation {invocation_id} (seq {seq}) has no completeness marker "
        "(its results row was removed)"
    )


def _opened_summary(marker: Marker, plain: bytes) -> Mapping[str, Any]:
    want = marker.attrs.get("summary_sha256")
    if want is not None and _sha(plain) != want:
        raise ResultUnverified(
            f"stored result of invocation {marker.invocation_id} (seq {marker.seq}) fails "
            "verification: summary differs from the chained event"
        )
    try:
        summary: Mapping[str, Any] = json.loads(plain)
    except ValueError:
        raise ResultUnverified(
            f"stored result of invocation {marker.invocation_id}: summary is not JSON"
        ) from None
    return summary


def _fetcher(store: Store, invocation_id: str) -> Fetch:
    def fetch(stream: str, idx: int) -> bytes | None:
        with store.guarded(f"result of invocation {invocation_id}: stream {stream!r} chunk {idx}"):
            return store.tables.chunk(False, invocation_id, stream, idx)

    return fetch


def open_result(
    store: Store,
    broker_key: Callable[[], BrokerKey],
    invocation_id: str,
    *,
    covered: Callable[[int], Checkpoint],
) -> ResultStream | None:
    """The stored result as a ``ResultStream``, or None unless its completeness marker exists
    (``broker_key`` is called only then).  Stored results never change, so its chunks are read
    later, one query each."""
    marker = load_marker(store, invocation_id, covered=covered)
    if marker is None:
        return None
    key = broker_key()
    try:
        plain = key.open(marker.summary_blob, summary_aad(invocation_id))
    except JournalError as exc:  # a verdict on the stored bytes (``ResultUnverified``)
        raise ResultUnverified(
            f"stored result of invocation {invocation_id} (seq {marker.seq}) fails "
            f"verification: its summary does not open: {exc}"
        ) from None
    summary = _opened_summary(marker, plain)
    fetch = _fetcher(store, invocation_id)
    return ResultStream(
        invocation_id, marker.seq, marker.sha256, summary, marker.streams, fetch, key
    )
