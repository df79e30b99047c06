"""Long results beside a SQLite journal: append-only segment files, written off the event loop.

Issue 15: a 50 MiB result took more than twice the time its own work needs.  Stored as blobs in
the journal's 4 KiB pages, every byte went through SQLite's B-tree, the WAL, and the checkpoint
that copies the WAL into the file a second time; and every 64 KiB chunk waited for the writer
task, the writer thread and the event loop in turn.  A segment store changes where the bytes of
a *long* result stream go -- not what is recorded, nor when:

* A stream's first ``HOLD`` chunks (256 KiB) stay in memory; a stream that ends within them is
  sealed and stored inline by the commit, in its barrier transaction: a small result costs no
  file and no fsync of its own.
* Once a stream grows past them, its chunks -- those held, then each as it arrives -- are
  sealed (AES-GCM) and go to the segment thread: the auditor's copy sealed, each blob hashed
  and appended to this process's segment file ``<journal>.results/<name>.seg``.  A sync thread ``fdatasync``s the file every
  ``SYNC_BYTES`` meanwhile, so that the flush before the commit has only the last part left.
  The sink runs ahead of the thread by at most ``IN_FLIGHT`` chunks (bounded memory).
* Before the commit the writer is flushed: every chunk written and synced, else
  ``ResultStoreFailed`` and the result is a store failure -- nothing of it is committed.  The
  commit's barrier transaction then writes one reference row per chunk (segment, position,
  size) in ``result_segments``, beside the completeness marker and RESULT_COMMITTED: a
  committed marker never names a byte that was not durable first, and a crash before it leaves
  only bytes no row names.

Nothing read changes: the marker lists every sealed chunk's SHA-256 (chained through
RESULT_COMMITTED), and a chunk read from a segment is checked against it before it is opened,
exactly as one read from a row (``SegmentTables`` resolves the references).  A segment edited,
cut short or removed makes its results fail verification; it never reads as other bytes.

Segments are append-only: bytes of an attempt that never committed stay, unreferenced.  A
writing process appends to a segment of its own (random name), so two processes on one journal
never write the same file.  An ``fdatasync`` that fails leaves what it covered unknown: every
result with bytes in that segment not yet synced fails, and later chunks go to a new segment.

A shared journal (PostgreSQL) has none: its brokers on other hosts must read every result, so
there chunks go to the database as they arrive (``results.PostingWriter``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from .errors import ResultStoreFailed
from .results import IN_FLIGHT, ResultStreams, stream_info
from .sealing import AuditSealer, BrokerKey, chunk_aad
from .tables import Tables

if TYPE_CHECKING:
    from .txn import Txn

__all__ = ["HOLD", "SYNC_BYTES", "SegmentStore", "SegmentTables", "SegmentWriter"]

HOLD = 4
"""Chunks of a stream kept in memory before it spills to a segment (256 KiB): a stream that
ends within them is stored inline by the commit."""
SYNC_BYTES = 4 << 20
"""Unsynced bytes in a segment after which the sync thread runs ``fdatasync`` unasked."""

_NAME = re.compile(r"[0-9a-f]{32}\.seg")
"""A segment's file name; a reference naming anything else is not followed (no path walks)."""


_Item = tuple["SegmentWriter", str, int, bytes, int, bytes | None]
"""A chunk queued for the segment thread: writer, stream, index, sealed blob, plaintext size,
and the plaintext when an auditor's copy is still to be sealed."""


class _Segment:
    """One segment file open for appending (by the segment thread only)."""

    __slots__ = ("end", "failed", "fd", "name", "synced")

    def __init__(self, name: str, fd: int) -> None:
        self.name = name
        self.fd = fd
        self.end = 0
        """Bytes written (changed under the store's lock, after the write)."""
        self.synced = 0
        """Bytes known durable: written before an ``fdatasync`` that returned."""
        self.failed: OSError | None = None
        """An ``fdatasync`` failed: nothing past ``synced`` can be trusted, nothing more is
        appended."""


@dataclass(frozen=True, slots=True)
class _Spilled:
    """One chunk as the segment thread stored it."""

    segment: _Segment
    pos: int
    size: int
    sha256: str
    """Hex SHA-256 of the sealed blob: the marker's entry for it."""
    plain: int
    audit: tuple[int, int, str] | None
    """The auditor copy's (pos, size, sha256) in the same segment, if one was sealed."""


class SegmentStore:
    """The segments of one writing journal, and the two threads that fill and sync them
    (started by the first stream that spills)."""

    def __init__(
        self, directory: Path, where: str, key: BrokerKey, audit: AuditSealer | None
    ) -> None:
        self.directory = directory
        self._where = where
        self._key = key
        self._audit = audit
        self._lock = threading.Lock()
        self._sync_due = threading.Condition(self._lock)
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._current: _Segment | None = None
        self._segments: list[_Segment] = []
        self._flushing: set[SegmentWriter] = set()
        self._sync_asked = False
        self._stop = False
        self._threads: list[threading.Thread] = []

    def writer(self, invocation_id: str) -> SegmentWriter:
        """The writer of one result (one run of one invocation), on the trio thread."""
        return SegmentWriter(self, invocation_id, trio.lowlevel.current_trio_token())

    def close(self) -> None:
        """Let the threads finish what is queued and stop; close the files."""
        with self._lock:
            self._stop = True
            self._sync_due.notify_all()
        self._queue.put(None)
        for t in self._threads:
            t.join()
        self._threads.clear()
        for seg in self._segments:
            with contextlib.suppress(OSError):
                os.close(seg.fd)
        self._segments.clear()
        self._current = None

    # -- the segment thread ---------------------------------------------------------------------

    def _submit(self, writer: SegmentWriter, stream: str, index: int, plain: bytes) -> None:
        """Queue a chunk for the segment thread, sealed here: AES-GCM gives the GIL up and
        takes it back, and taking it back is what the segment thread waits for while the event
        loop's thread reads (issue 15: sealing here made a 50 MiB result ~14% faster).  The
        auditor's copy -- an X25519 agreement per chunk -- is sealed on the thread."""
        aad = chunk_aad(writer.invocation_id, stream, index)
        sealed = self._key.seal(plain, aad)
        copy = plain if self._audit is not None else None
        item: _Item = (writer, stream, index, sealed, len(plain), copy)
        if not self._threads:
            for target, name in ((self._fill, "fill"), (self._sync, "sync")):
                t = threading.Thread(target=target, name=f"affidavit-segments-{name}", daemon=True)
                t.start()
                self._threads.append(t)
        self._queue.put(item)

    def _fill(self) -> None:
        while (item := self._queue.get()) is not None:
            writer = item[0]
            try:
                if writer._error is None:
                    self._write(*item)
            except OSError as exc:
                writer._fail(self._error(exc))
            except Exception as exc:  # a bug: this result fails, the thread goes on
                writer._fail(ResultStoreFailed(f"writing a result segment failed: {exc!r}"))
            finally:
                writer._processed_one()

    def _write(
        self,
        writer: SegmentWriter,
        stream: str,
        index: int,
        sealed: bytes,
        plain_size: int,
        plain: bytes | None,
    ) -> None:
        copy = None
        if self._audit is not None and plain is not None:
            copy = self._audit.seal(plain, chunk_aad(writer.invocation_id, stream, index))
        seg = self._current or self._open()
        pos = self._append(seg, sealed)
        audit = None
        if copy is not None:
            audit = (self._append(seg, copy), len(copy), hashlib.sha256(copy).hexdigest())
        entry = _Spilled(
            seg, pos, len(sealed), hashlib.sha256(sealed).hexdigest(), plain_size, audit
        )
        with self._lock:
            writer._entries.setdefault(stream, []).append(entry)
            writer._ends[seg] = seg.end
            if seg.end - seg.synced >= SYNC_BYTES:
                self._sync_asked = True
                self._sync_due.notify()

    def _append(self, seg: _Segment, data: bytes) -> int:
        pos = seg.end
        view = memoryview(data)
        done = 0
        while done < len(view):
            n = os.pwrite(seg.fd, view[done:], pos + done)
            if n <= 0:
                raise OSError(5, "short write")
            done += n
        with self._lock:
            seg.end = pos + len(data)
        return pos

    def _open(self) -> _Segment:
        """A new segment file (and the directory, the first time), durably named: its entry
        is synced before anything in it can be referenced."""
        new_dir = not self.directory.is_dir()
        if new_dir:
            self.directory.mkdir(mode=0o700, exist_ok=True)
            _fsync_dir(self.directory.parent)
        name = os.urandom(16).hex() + ".seg"
        fd = os.open(self.directory / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        seg = _Segment(name, fd)
        with self._lock:
            self._segments.append(seg)
        _fsync_dir(self.directory)
        self._current = seg
        return seg

    def _error(self, exc: OSError) -> ResultStoreFailed:
        return ResultStoreFailed(
            f"journal {self._where}: writing a result segment in {self.directory} failed: "
            f"{exc.strerror or exc}"
        )

    # -- the sync thread ------------------------------------------------------------------------

    def _sync(self) -> None:
        while True:
            with self._lock:
                while not self._sync_asked and not self._stop:
                    self._sync_due.wait()
                if self._stop and not self._sync_asked:
                    return
                self._sync_asked = False
                todo = [(s, s.end) for s in self._segments if s.failed is None and s.end > s.synced]
            for seg, target in todo:
                try:
                    os.fdatasync(seg.fd)
                except OSError as exc:
                    with self._lock:
                        seg.failed = exc
                        if self._current is seg:
                            self._current = None  # the fill thread opens a new one
                else:
                    with self._lock:
                        seg.synced = max(seg.synced, target)
            with self._lock:
                waiting = list(self._flushing)
            for writer in waiting:
                writer._poke()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SegmentWriter:
    """One result's chunks: what the sink calls on the trio thread (``put``, ``drain``,
    ``flush``), and what the commit calls in the writer thread (``store``)."""

    def __init__(self, store: SegmentStore, invocation_id: str, token: trio.lowlevel.TrioToken):
        self.invocation_id = invocation_id
        self._store = store
        self._token = token
        self._held: dict[str, list[bytes]] = {}
        """Per stream, the chunks not sent to the segment thread (all of a short stream's; the
        tail of a long one), stored inline by the commit."""
        self._sent: dict[str, int] = {}
        """Per stream that spilled, the chunks sent to the segment thread."""
        self._queued = 0
        # Written by the threads, read under the store's lock:
        self._processed = 0
        self._error: ResultStoreFailed | None = None
        self._entries: dict[str, list[_Spilled]] = {}
        self._ends: dict[_Segment, int] = {}
        """Per segment this result wrote to, the end of its last bytes there."""
        self._event: trio.Event | None = None
        self._ready: Callable[[], bool] | None = None
        self._inline: dict[tuple[str, int], tuple[bytes, bytes | None]] = {}
        """Inline chunks as the commit sealed them (sealed once, should the commit run again)."""

    # -- the sink's side (trio thread) ----------------------------------------------------------

    async def put(self, stream: str, index: int, data: bytes, *, last: bool = False) -> None:
        """Store chunk ``index`` of ``stream`` (chunks in order, ``last`` for a stream's short
        tail).  ``ResultStoreFailed`` once a chunk of this result could not be written."""
        self._raise()
        held = self._held.setdefault(stream, [])
        sent = self._sent.get(stream)
        if index != (sent or 0) + len(held):
            raise ValueError(f"chunk {index} of stream {stream!r} is out of order")
        if last or (sent is None and len(held) < HOLD):
            held.append(bytes(data))
            return
        first = sent or 0
        chunks = [*held, bytes(data)]
        held.clear()
        self._sent[stream] = first + len(chunks)
        for i, chunk in enumerate(chunks):
            self._queued += 1
            self._store._submit(self, stream, first + i, chunk)
        if self._queued - self._processed >= IN_FLIGHT:
            await self._wait(lambda: self._queued - self._processed <= IN_FLIGHT // 2)
        self._raise()

    async def drain(self) -> None:
        """Wait until every chunk sent is written; ``ResultStoreFailed`` if one was not."""
        await self._wait(lambda: self._processed == self._queued)
        self._raise()

    async def flush(self) -> None:
        """``drain``, then wait until every byte written is synced: the commit may then name
        them.  ``ResultStoreFailed`` if a write or a sync failed."""
        await self.drain()
        store = self._store
        if not self._ends:
            return
        with store._lock:
            store._flushing.add(self)
            store._sync_asked = True
            store._sync_due.notify()
        try:
            await self._wait(self._synced)
        finally:
            with store._lock:
                store._flushing.discard(self)
        with store._lock:
            lost = [s for s, end in self._ends.items() if s.synced < end]
            if lost and self._error is None:
                exc = lost[0].failed
                self._error = store._error(exc if exc is not None else OSError(5, "not synced"))
        self._raise()

    def _synced(self) -> bool:
        return all(s.synced >= end or s.failed is not None for s, end in self._ends.items())

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    async def _wait(self, ready: Callable[[], bool]) -> None:
        lock = self._store._lock
        while True:
            with lock:
                if self._error is not None or ready():
                    return
                event = self._event = trio.Event()
                self._ready = ready
            try:
                await event.wait()
            finally:
                with lock:
                    if self._event is event:
                        self._event = self._ready = None

    # -- the threads' side ----------------------------------------------------------------------

    def _fail(self, error: ResultStoreFailed) -> None:
        with self._store._lock:
            if self._error is None:
                self._error = error

    def _processed_one(self) -> None:
        with self._store._lock:
            self._processed += 1
        self._poke()

    def _poke(self) -> None:
        """Wake the waiting task if what it waits for holds (or this result failed)."""
        with self._store._lock:
            event, ready = self._event, self._ready
            if event is None or ready is None or (self._error is None and not ready()):
                return
            self._event = self._ready = None
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(event.set)

    # -- the commit's side (writer thread, inside the barrier transaction) ---------------------

    def prepare(
        self, txn: Txn, key: BrokerKey, audit: AuditSealer | None, expect: Mapping[str, str]
    ) -> tuple[ResultStreams, Callable[[Tables], None]]:
        """Each stream's marker entry, and the write of the result's chunk rows -- a reference
        per spilled chunk, the held chunks sealed inline -- for the commit to run once its
        event is accepted (nothing is written before: a refused commit changes nothing).  Runs
        after ``flush``: every spilled chunk is durable in its segment.  The write first drops
        the rows an earlier, uncommitted attempt left."""
        iid = self.invocation_id
        if self._error is not None or self._processed != self._queued:
            raise ResultStoreFailed(f"result of invocation {iid}: its chunks were not all stored")
        per: ResultStreams = {}
        refs: list[tuple[str, int, str, int, str, int, int]] = []
        inline: list[tuple[bool, str, int, bytes]] = []
        for stream in sorted(self._held.keys() | self._sent.keys()):
            spilled = self._entries.get(stream, [])
            if len(spilled) != self._sent.get(stream, 0):
                raise ResultStoreFailed(f"result of invocation {iid}: chunks of a stream lost")
            info = per[stream] = stream_info(audit is not None)
            for idx, e in enumerate(spilled):
                refs.append((iid, 0, stream, idx, e.segment.name, e.pos, e.size))
                info["sealed"].append(e.sha256)
                if e.audit is not None:
                    refs.append((iid, 1, stream, idx, e.segment.name, *e.audit[:2]))
                    info["audit"].append(e.audit[2])
                info["bytes"] += e.plain
            for idx, plain in enumerate(self._held.get(stream, ()), start=len(spilled)):
                sealed, copy = self._sealed_inline(key, audit, stream, idx, plain)
                inline.append((False, stream, idx, sealed))
                info["sealed"].append(hashlib.sha256(sealed).hexdigest())
                if copy is not None:
                    inline.append((True, stream, idx, copy))
                    info["audit"].append(hashlib.sha256(copy).hexdigest())
                info["bytes"] += len(plain)
            info["chunks"] = len(info["sealed"])
        if per.keys() != expect.keys():
            raise ResultStoreFailed(
                f"result of invocation {iid}: stored streams differ from what was written"
            )
        for stream, info in per.items():
            info["sha256"] = expect[stream]

        def write(tables: Tables) -> None:
            assert isinstance(tables, SegmentTables)
            tables.drop_result(iid)
            tables.put_segment_refs(refs)
            for table, stream, idx, blob in inline:
                tables.put_chunk(table, iid, stream, idx, blob)

        return per, write

    def _sealed_inline(
        self, key: BrokerKey, audit: AuditSealer | None, stream: str, idx: int, plain: bytes
    ) -> tuple[bytes, bytes | None]:
        got = self._inline.get((stream, idx))
        if got is None:
            aad = chunk_aad(self.invocation_id, stream, idx)
            got = key.seal(plain, aad), audit.seal(plain, aad) if audit is not None else None
            self._inline[(stream, idx)] = got
        return got


# -- reading: the reference rows -----------------------------------------------------------------


_REF_COLUMNS = "invocation_id, audit, stream, idx, segment, pos, size"
_CHUNK_TABLES = {False: "result_chunks", True: "result_audit"}

SEGMENT_SCHEMA = """
CREATE TABLE IF NOT EXISTS result_segments (
  invocation_id TEXT NOT NULL,
  audit         INTEGER NOT NULL CHECK (audit IN (0, 1)),
  stream        TEXT NOT NULL,
  idx           INTEGER NOT NULL CHECK (idx >= 0),
  segment       TEXT NOT NULL,
  pos           INTEGER NOT NULL CHECK (pos >= 0),
  size          INTEGER NOT NULL CHECK (size >= 0),
  PRIMARY KEY (invocation_id, audit, stream, idx)
);
"""
"""Schema 4: one row per chunk stored in a segment (``SegmentStore``)."""


def _union(table: str, where: str, order: str) -> str:
    return (
        f"SELECT invocation_id, stream, idx, CAST(data AS BLOB), NULL, NULL, NULL FROM {table} "
        f"WHERE {where} UNION ALL SELECT invocation_id, stream, idx, NULL, segment, pos, size "
        f"FROM result_segments WHERE audit = ? AND {where} ORDER BY {order}"
    )


SEGMENT_SQL: dict[str, str] = {
    "has_segment_refs": "SELECT 1 FROM sqlite_master WHERE type = 'table' AND "
    "name = 'result_segments'",
    "put_segment_refs": f"INSERT INTO result_segments ({_REF_COLUMNS}) VALUES (?,?,?,?,?,?,?)",
    "drop_segment_stream": "DELETE FROM result_segments WHERE invocation_id = ? AND stream = ?",
    "drop_segment_result": "DELETE FROM result_segments WHERE invocation_id = ?",
    **{
        f"{op}_{name}": sql
        for audit, name in _CHUNK_TABLES.items()
        for op, sql in {
            "drop_result": f"DELETE FROM {name} WHERE invocation_id = ?",
            "chunk_refs": _union(name, "invocation_id = ?", "stream, idx"),
            "stream_ref": _union(name, "invocation_id = ? AND stream = ? AND idx = ?", "idx"),
            "every_ref": _union(name, "1", "invocation_id, stream, idx"),
        }.items()
    },
}
"""The statements of the reference rows (SQLite only: a shared journal has no segments)."""


class SegmentTables(Tables):
    """A backend's ``Tables`` whose result chunks may live in segments: every chunk read
    resolves its reference, so the readers, ``verify`` and the migration see blobs as ever.
    A reference whose segment is missing or too short reads as an empty blob (which no chained
    hash matches), one naming anything but a segment file as well."""

    __slots__ = ("_refs", "segments")

    def __init__(self, conn: Any, segments: Path | None = None) -> None:
        super().__init__(conn)
        self.segments = segments
        """The segment directory (None: references read as missing)."""
        self._refs = False

    def _has_refs(self) -> bool:
        """Whether the journal has the reference table (a read-only journal from before schema
        4 has not; it is looked for again until found)."""
        if not self._refs:
            self._refs = self.one("has_segment_refs") is not None
        return self._refs

    def put_segment_refs(self, rows: list[tuple[str, int, str, int, str, int, int]]) -> None:
        if rows:
            self.many("put_segment_refs", rows)

    def drop_result(self, iid: str) -> None:
        """Forget every chunk row of an invocation's result (an uncommitted attempt's)."""
        for table in _CHUNK_TABLES.values():
            self.run(f"drop_result_{table}", (iid,))
        self.run("drop_segment_result", (iid,))

    def drop_stream(self, iid: str, stream: str) -> None:
        super().drop_stream(iid, stream)
        self.run("drop_segment_stream", (iid, stream))

    def chunks(self, audit: bool, iid: str) -> Iterator[tuple[str, int, bytes]]:
        if not self._has_refs():
            yield from super().chunks(audit, iid)
            return
        with _Files(self.segments) as files:
            rows = self.rows(f"chunk_refs_{_CHUNK_TABLES[audit]}", (iid, int(audit), iid))
            for _, stream, idx, data, seg, pos, size in rows:
                yield stream, idx, files.blob(data, seg, pos, size)

    def chunk(self, audit: bool, iid: str, stream: str, idx: int) -> bytes | None:
        if not self._has_refs():
            return super().chunk(audit, iid, stream, idx)
        row = self.one(
            f"stream_ref_{_CHUNK_TABLES[audit]}", (iid, stream, idx, int(audit), iid, stream, idx)
        )
        if row is None:
            return None
        with _Files(self.segments) as files:
            return files.blob(*row[3:])

    def every_chunk(self, audit: bool) -> Iterator[tuple[str, str, int, bytes]]:
        if not self._has_refs():
            yield from super().every_chunk(audit)
            return
        with _Files(self.segments) as files:
            for iid, stream, idx, data, seg, pos, size in self.rows(
                f"every_ref_{_CHUNK_TABLES[audit]}", (int(audit),)
            ):
                yield iid, stream, idx, files.blob(data, seg, pos, size)


class _Files:
    """Segment files opened for one read, each once."""

    def __init__(self, directory: Path | None) -> None:
        self._dir = directory
        self._fds: dict[str, int | None] = {}

    def __enter__(self) -> _Files:
        return self

    def __exit__(self, *exc: object) -> None:
        for fd in self._fds.values():
            if fd is not None:
                os.close(fd)

    def blob(self, data: Any, segment: Any, pos: Any, size: Any) -> bytes:
        if data is not None:
            return bytes(data)
        if not (isinstance(segment, str) and _NAME.fullmatch(segment)) or self._dir is None:
            return b""
        if not (isinstance(pos, int) and isinstance(size, int) and pos >= 0 and size >= 0):
            return b""
        if segment not in self._fds:
            try:
                self._fds[segment] = os.open(self._dir / segment, os.O_RDONLY)
            except OSError:
                self._fds[segment] = None
        fd = self._fds[segment]
        if fd is None:
            return b""
        try:
            out = os.pread(fd, size, pos)
        except OSError:
            return b""
        return out if len(out) == size else b""
