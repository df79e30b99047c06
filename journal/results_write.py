"""Stored results, the write side: each sealed chunk (``chunk_op``), what a writer sealed
(``ChunkLog``), a result's chunks posted as they arrive (``PostingWriter``), and the completeness
marker with its RESULT_COMMITTED event (``commit_op``).  What the marker and the event carry is
in ``results.py``'s docstring; the read side is ``results_read.py``.
"""

from __future__ import annotations

import collections
import hashlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from affidavit.statemachine import STATES, Event

from .chain import canonical_json
from .errors import JournalError, ResultStoreFailed
from .results_read import SUMMARY_STREAM, _sha, whole_sha256
from .sealing import AuditSealer, BrokerKey, chunk_aad, summary_aad
from .tables import Tables
from .txn import Txn, row_args

if TYPE_CHECKING:
    from .requests import Posted

__all__ = [
    "IN_FLIGHT",
    "ChunkLog",
    "PostingWriter",
    "ResultStreams",
    "ResultWriter",
    "chunk_op",
    "commit_op",
    "stream_info",
]

IN_FLIGHT = 16
"""Chunks of one result handed to the journal and not yet stored, at most (1 MiB): bounded
back-pressure instead of one wait per chunk, so the writer takes several chunks at a time while
the adapter reads on (issue 15: a 50 MiB response waited for 800 transactions one by one)."""

ResultStreams = dict[str, dict[str, Any]]
"""Per stream, its marker entry: chunks, bytes, sha256, sealed (and audit) hashes."""


def stream_info(audit: bool) -> dict[str, Any]:
    """An empty marker entry, for a stream's chunks to be counted into."""
    info: dict[str, Any] = {"chunks": 0, "bytes": 0, "sealed": []}
    if audit:
        info["audit"] = []
    return info


class ResultWriter(Protocol):
    """How one result's chunks reach the journal (``Journal.result_writer``): the sink calls
    ``put``, ``drain`` and ``flush`` on the trio thread; ``commit_result(writer=)`` then asks it,
    in the committing transaction, for each stream's marker entry and the rows still to write."""

    invocation_id: str

    async def put(self, stream: str, index: int, data: bytes, *, last: bool = False) -> None:
        """Store chunk ``index`` of ``stream``; chunks come in order, every one ``RESULT_CHUNK``
        bytes but a stream's ``last``.  ``ResultStoreFailed`` once storing this result failed
        (the chunk may or may not be stored; the result will not be)."""
        ...

    async def drain(self) -> None:
        """Wait until every chunk put so far is stored; ``ResultStoreFailed`` if one was not."""
        ...

    async def flush(self) -> None:
        """``drain``, and make what is stored durable enough for the commit to name it."""
        ...

    def prepare(
        self, txn: Txn, key: BrokerKey, audit: AuditSealer | None, expect: Mapping[str, str]
    ) -> tuple[ResultStreams, Callable[[Tables], None]]:
        """In the committing transaction (writer thread): each stream's marker entry, and the
        write of what is not yet in the journal -- run only once the RESULT_COMMITTED event is
        accepted, so a refused commit writes nothing."""
        ...


class PostingWriter:
    """A result's chunks stored in the journal's tables as they arrive: each posted to the
    single writer (``chunk_op``), at most ``IN_FLIGHT`` uncommitted; a stream's ``last`` chunk
    is not waited for, so it shares the commit's transaction.  What every backend can do, and a
    shared journal's way (its brokers on other hosts read every result)."""

    def __init__(
        self,
        invocation_id: str,
        post: Callable[[str, int, bytes, ChunkLog], Awaitable[Posted[None]]],
    ) -> None:
        self.invocation_id = invocation_id
        self._post = post
        self.log = ChunkLog()
        self._in_flight: collections.deque[Posted[None]] = collections.deque()
        self._error: ResultStoreFailed | None = None

    async def put(self, stream: str, index: int, data: bytes, *, last: bool = False) -> None:
        if self._error is not None:
            raise self._error
        # The single writer keeps queue order: chunk i lands before chunk i+1.
        posted = await self._post(stream, index, data, self.log)
        if not last:
            self._in_flight.append(posted)
            if len(self._in_flight) >= IN_FLIGHT:
                await self._settle(len(self._in_flight) - IN_FLIGHT // 2)

    async def drain(self) -> None:
        await self._settle(len(self._in_flight))

    async def flush(self) -> None:
        await self.drain()

    async def _settle(self, n: int) -> None:
        """Wait for the ``n`` oldest chunks in flight.  After a refused one the later ones are
        still waited for: nothing of this result may stay queued to share a transaction with
        what is written next."""
        for _ in range(n):
            try:
                await self._in_flight.popleft().wait()
            except JournalError as exc:  # a storage fault, or a chunk refused ("already stored")
                if self._error is None:
                    if not isinstance(exc, ResultStoreFailed):
                        refused = ResultStoreFailed(str(exc))
                        refused.__cause__ = exc
                        exc = refused
                    self._error = exc
        if self._error is not None:
            raise self._error

    def prepare(
        self, txn: Txn, key: BrokerKey, audit: AuditSealer | None, expect: Mapping[str, str]
    ) -> tuple[ResultStreams, Callable[[Tables], None]]:
        # Chunk 0 starts only its own stream over: a stream an earlier, uncommitted attempt
        # wrote and this one did not is still stored.  It is not this result's: left out, and
        # dropped with the commit (as a segment writer's commit drops what was left).  Every
        # other stored chunk is this writer's -- a stale attempt's is refused as it is written
        # (``chunk_op``'s generation) -- or the commit is refused.
        iid = self.invocation_id
        left: set[str] = set()
        per = _logged_streams(txn, iid, self.log, expect, audit is not None, left=left)

        def write(tables: Tables) -> None:
            for stream in sorted(left):
                tables.drop_stream(iid, stream)

        return per, write


def _nothing(tables: Tables) -> None:
    return None


@dataclass(frozen=True, slots=True)
class _Sealed:
    """One chunk as this process sealed it (``ChunkLog``)."""

    sha256: str
    """Hex SHA-256 of the sealed blob: the marker's entry for it."""
    plain: int
    """The plaintext's length."""
    audit: str | None
    """The auditor copy's hex SHA-256, if one was sealed."""


class ChunkLog:
    """What one writer of a result (the engine's sink, one per invocation run) sealed and
    stored, chunk by chunk: each sealed blob's hash is taken in the writer thread as the chunk
    is written (``chunk_op``), so the commit need not decrypt 50 MiB on the barrier's critical
    path (issue 15).  The commit reads what is stored, hashes it and refuses it unless every
    chunk is byte for byte one of these (``commit_op``): the hash the marker records is then
    the stored blob's, not only the writer's."""

    __slots__ = ("_chunks", "_posted")

    def __init__(self) -> None:
        self._chunks: dict[tuple[str, int], _Sealed] = {}
        self._posted: dict[str, int] = {}
        """Per stream, the chunks posted (by ``chunk_op``, in the submitting task): one whose
        batch failed before its op ran was never sealed, so ``_chunks`` cannot tell it lost."""

    def _post(self, stream: str, index: int) -> None:
        self._posted[stream] = index + 1  # index 0 starts the stream over

    def _record(self, stream: str, index: int, sealed: _Sealed) -> None:
        self._chunks[(stream, index)] = sealed

    def _get(self, stream: str, index: int) -> _Sealed | None:
        return self._chunks.get((stream, index))

    def _counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for stream, _ in self._chunks:
            counts[stream] = counts.get(stream, 0) + 1
        return counts


def _sealed_entry(sealed: bytes, plain: int, audit_copy: bytes | None) -> _Sealed:
    return _Sealed(_sha(sealed), plain, None if audit_copy is None else _sha(audit_copy))


def chunk_op(
    key: BrokerKey,
    audit: AuditSealer | None,
    invocation_id: str,
    stream: str,
    index: int,
    data: bytes,
    log: ChunkLog | None = None,
    generation: int | None = None,
) -> Callable[[Txn], None]:
    """The write of one sealed chunk (and its auditor copy).  Index 0 starts the stream over,
    dropping chunks of an earlier, uncommitted attempt; a stored result is never added to.
    ``generation``: the attempt's; the chunk is refused (``ResultStoreFailed``) unless it is
    the record's current generation and its attempt is open -- a worker whose lease was taken
    over must not drop, nor add to, the chunks of the attempt that took over, nor store any
    for an attempt recovery (or a reconciliation) closed (its events are refused alike:
    ``rules_common._stale``, ``rules_common._closed``).

    The chunk is sealed -- and, with ``log``, its sealed blob hashed and recorded -- inside the
    op, in the writer thread, where AES-GCM and hashlib release the GIL: the submitting task
    (the sink, reading a response) spent ~a third of its time on those calls, most of it
    waiting to take the GIL back (issue 15).  Sealed once: a batch run again after a reconnect
    writes the same blobs."""
    if index < 0:
        raise ValueError("chunk index must be >= 0")
    if not stream:
        raise ValueError("a result stream needs a name")
    aad = chunk_aad(invocation_id, stream, index)
    plain = bytes(data)
    blobs: list[tuple[bytes, bytes | None]] = []
    if log is not None:
        log._post(stream, index)

    def op(txn: Txn) -> None:
        if generation is not None:
            proj = txn.projector(invocation_id)
            current = proj.generation
            if current != generation:
                raise ResultStoreFailed(
                    f"result chunk of invocation {invocation_id}: stale generation "
                    f"{generation}; the current one is {current}"
                )
            if STATES[proj.state].final:
                raise ResultStoreFailed(
                    f"result chunk of invocation {invocation_id}: generation {generation}'s "
                    f"attempt is closed ({proj.state})"
                )
        tables = txn.tables
        if tables.has_result(invocation_id):
            raise JournalError(f"the result of invocation {invocation_id} is already stored")
        if not blobs:
            blobs.append((key.seal(plain, aad), audit.seal(plain, aad) if audit else None))
        sealed, audit_copy = blobs[0]
        if index == 0:
            tables.drop_stream(invocation_id, stream)
        tables.put_chunk(False, invocation_id, stream, index, sealed)
        if audit_copy is not None:
            tables.put_chunk(True, invocation_id, stream, index, audit_copy)
        if log is not None:  # the same entry if the batch runs again after a reconnect
            log._record(stream, index, _sealed_entry(sealed, len(plain), audit_copy))

    return op


def _stored_streams(txn: Txn, key: BrokerKey, iid: str) -> dict[str, dict[str, Any]]:
    """Per stream: chunk count, bytes, plaintext SHA-256 and each sealed chunk's SHA-256, read
    back inside the committing transaction, so the marker describes exactly what is stored."""
    per: dict[str, dict[str, Any]] = {}
    hashers: dict[str, Any] = {}
    for stream, idx, data in txn.tables.chunks(False, iid):
        info = per.setdefault(stream, {"chunks": 0, "bytes": 0, "sealed": []})
        if idx != info["chunks"]:
            raise JournalError(
                f"result of invocation {iid}: stream {stream!r} lacks chunk {info['chunks']}"
            )
        plain = key.open(data, chunk_aad(iid, stream, idx))
        hashers.setdefault(stream, hashlib.sha256()).update(plain)
        info["sealed"].append(_sha(data))
        info["chunks"] += 1
        info["bytes"] += len(plain)
    for stream, info in per.items():
        info["sha256"] = hashers[stream].hexdigest()
    return per


def _audit_hashes(txn: Txn, iid: str, per: dict[str, dict[str, Any]]) -> None:
    """Add each stream's auditor-copy hashes; the copies must match the chunks one for one."""
    audit: dict[str, list[str]] = {}
    for stream, idx, data in txn.tables.chunks(True, iid):
        if stream == SUMMARY_STREAM:
            continue
        hashes = audit.setdefault(stream, [])
        if idx != len(hashes):
            break
        hashes.append(_sha(data))
    for stream, info in per.items():
        if len(audit.get(stream, ())) != info["chunks"]:
            raise JournalError(
                f"result of invocation {iid}: stream {stream!r} lacks auditor copies"
            )
        info["audit"] = audit[stream]


def _logged_streams(
    txn: Txn,
    iid: str,
    log: ChunkLog,
    expect: Mapping[str, str],
    audit: bool,
    left: set[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """``_stored_streams`` (and ``_audit_hashes``) from ``log``: every stored chunk -- read
    inside the committing transaction and hashed -- must be one ``log`` recorded (the same
    SHA-256: a byte changed anywhere in it is refused), every stream exactly the chunks its
    writer stored, and the
    streams exactly ``expect``'s, whose plaintext hashes the writer took as it sealed them.
    ``left``: the stored streams ``log`` never posted to are added to it and left out, not
    refused (``PostingWriter.prepare``: an earlier attempt's)."""
    per: dict[str, dict[str, Any]] = {}
    for table in (False, True) if audit else (False,):
        for stream, idx, data in txn.tables.chunks(table, iid):
            if table and stream == SUMMARY_STREAM:
                continue
            if left is not None and stream not in log._posted:
                left.add(stream)
                continue
            info = per.setdefault(stream, {"chunks": 0, "bytes": 0, "sealed": []})
            want = log._get(stream, idx)
            if table:
                hashes = info.setdefault("audit", [])
                copy = want.audit if want is not None else None
                if copy is None or idx != len(hashes) or copy != _sha(data):
                    raise JournalError(
                        f"result of invocation {iid}: stream {stream!r} lacks auditor copies"
                    )
                hashes.append(copy)
                continue
            if idx != info["chunks"]:
                raise JournalError(
                    f"result of invocation {iid}: stream {stream!r} lacks chunk {info['chunks']}"
                )
            if want is None or want.sha256 != _sha(data):
                raise ResultStoreFailed(
                    f"result of invocation {iid}: stored chunk {idx} of stream {stream!r} "
                    "differs from what was written"
                )
            info["sealed"].append(want.sha256)
            info["chunks"] += 1
            info["bytes"] += want.plain
    stored = {s: v["chunks"] for s, v in per.items()}
    if stored != log._counts() or stored != log._posted or set(per) != set(expect):
        raise ResultStoreFailed(
            f"result of invocation {iid}: stored streams differ from what was written"
        )
    for stream, info in per.items():
        if audit and len(info.get("audit", ())) != info["chunks"]:
            raise JournalError(
                f"result of invocation {iid}: stream {stream!r} lacks auditor copies"
            )
        info["sha256"] = expect[stream]
    return per


def commit_op(
    key: BrokerKey,
    audit: AuditSealer | None,
    event: Event,
    summary: Mapping[str, Any],
    expect: Mapping[str, str] | None,
    log: ChunkLog | None = None,
    writer: ResultWriter | None = None,
) -> Callable[[Txn], Event]:
    """The write of the completeness marker and RESULT_COMMITTED (see ``Journal.commit_result``):
    it reads the stored chunks inside the transaction, so the marker describes exactly what is
    stored -- opening and hashing each one, or, given the ``log`` of what the writer sealed
    (and ``expect``), checking that each stored chunk is one it sealed; or, given the result's
    ``writer`` (and ``expect``), taking its account of what it stored and writing the rest."""
    iid = event.invocation_id
    if writer is not None and expect is None:
        raise ValueError("a result's writer is committed with expect=, the streams' hashes")
    summary_bytes = canonical_json(summary).encode("utf-8")
    # The summary's hash rides in the chained event, so the summary (status, headers, exit
    # status) is as tamper-evident as the streams — not only sealed.
    summary_sha = _sha(summary_bytes)
    sealed_summary = key.seal(summary_bytes, summary_aad(iid))
    audit_summary = audit.seal(summary_bytes, summary_aad(iid)) if audit is not None else None

    def op(txn: Txn) -> Event:
        write: Callable[[Tables], None] = _nothing
        if writer is not None:
            assert expect is not None
            per, write = writer.prepare(txn, key, audit, expect)
        elif log is not None and expect is not None:
            per = _logged_streams(txn, iid, log, expect, audit_summary is not None)
        else:
            per = _stored_streams(txn, key, iid)
            if expect is not None and {s: v["sha256"] for s, v in per.items()} != dict(expect):
                raise ResultStoreFailed(
                    f"result of invocation {iid}: stored streams differ from what was written"
                )
            if audit_summary is not None:
                _audit_hashes(txn, iid, per)
        whole = whole_sha256(per)
        marker = canonical_json(per)  # hashed into the event and stored: encoded once
        attrs = {
            **event.attrs,
            "sha256": whole,
            "chunks": {s: v["chunks"] for s, v in per.items()},
            "bytes": sum(v["bytes"] for v in per.values()),
            "summary_sha256": summary_sha,
            "marker_sha256": _sha(marker.encode("utf-8")),
            "sealed_summary_sha256": _sha(sealed_summary),
        }
        if audit_summary is not None:
            attrs["audit_summary_sha256"] = _sha(audit_summary)
        # ``dataclasses.replace(event, attrs=attrs)``, without its walk over the fields (once
        # per committed result, in the single writer: issue 15).
        ev = Event(
            event.kind,
            iid,
            attrs,
            event.source,
            event.seq,
            event.at,
            event.observer,
            event.observer_seq,
        )
        stored = txn.insert(*row_args(ev))
        txn.flush()  # the marker references its event's row (a foreign key on PostgreSQL)
        assert stored.seq is not None
        write(txn.tables)
        txn.tables.insert_result(iid, stored.seq, whole, marker, sealed_summary)
        if audit_summary is not None:
            txn.tables.put_chunk(True, iid, SUMMARY_STREAM, 0, audit_summary)
        return stored

    return op
