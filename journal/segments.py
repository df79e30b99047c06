"""Long results beside a SQLite journal: segment files, written off the event loop.

Issue 15: a 50 MiB result took more than twice the time its own work needs.  Stored as blobs in
the journal's 4 KiB pages, every byte went through SQLite's B-tree, the WAL, and the checkpoint
that copies the WAL into the file a second time; and every 64 KiB chunk waited for the writer
task, the writer thread and the event loop in turn.  A segment store changes where the bytes of
a *long* result stream go -- not what is recorded, nor when:

* A stream's first ``HOLD`` chunks (256 KiB) stay in memory; a stream that ends within them is
  sealed and stored inline by the commit, in its barrier transaction: a small result costs no
  file and no fsync of its own.
* Once a stream grows past them, its chunks -- those held, then each as it arrives -- are
  sealed (AES-GCM) and each sealed blob hashed on the event loop's thread, and handed to the
  segment thread ``BATCH`` at a time, which seals and hashes the auditor's copies and writes
  the batch with one ``pwritev`` at the end of this process's segment file
  ``<journal>.results/<name>.seg``.  A sync thread ``fdatasync``s the file every
  ``SYNC_BYTES`` meanwhile, so that the flush before the commit has only the last part left.
  The sink runs ahead of the segment thread by at most ``IN_FLIGHT + HOLD`` chunks of a
  result.
* Before the commit the writer is flushed: every chunk written and synced, else
  ``ResultStoreFailed`` and the result is a store failure -- nothing of it is committed.  The
  commit's barrier transaction checks that again, then writes one reference row per chunk
  (segment, position, size) in ``result_segments`` beside the completeness marker and
  RESULT_COMMITTED: a committed marker never names a byte that was not durable first, and a
  crash before it leaves only bytes no row names.

Nothing read changes: the marker lists every sealed chunk's SHA-256 (chained through
RESULT_COMMITTED), and a chunk read through a reference is checked against it before it is
opened, exactly as one read from a row (``segment_tables.py``).

A segment only grows while it is written, and only the bytes below its end -- each written whole
before the end moves past it -- are ever referenced: bytes of an attempt that never committed
stay there, unreferenced, until a reclaim compacts the segment (``compact.py``), and a write
that failed part-way is written over by the next.  A writing process has a segment of its own
(random name, opened anew after a fork), so two processes on one journal never write the same
file; it holds an exclusive ``flock`` on each of its segments while a result there may still
commit, or may have committed unseen (``SegmentStore.doubt``) -- until ``close`` -- which is
what keeps a compaction off bytes in flight.  An
``fdatasync`` that fails leaves what it covered unknown: every result with bytes in that
segment not yet synced fails, and the segment takes no more.

A shared journal (PostgreSQL) has none: its brokers on other hosts must read every result, so
there chunks go to the database as they arrive (``results.PostingWriter``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import queue
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from .errors import ResultStoreFailed
from .results import ResultStreams, stream_info
from .sealing import AuditSealer, BrokerKey, chunk_aad
from .segment_tables import SegmentTables
from .tables import Tables

if TYPE_CHECKING:
    from .txn import Txn

__all__ = ["BATCH", "HOLD", "IN_FLIGHT", "SYNC_BYTES", "SegmentStore", "SegmentWriter"]

HOLD = 4
"""Chunks of a stream kept in memory before it spills to a segment (256 KiB): a stream that
ends within them is stored inline by the commit."""
SYNC_BYTES = 4 << 20
"""Unsynced bytes in a segment after which the sync thread runs ``fdatasync`` unasked."""

BATCH = 16
"""Chunks of a result sealed before they go to the segment thread together (1 MiB, one large
read's worth): it writes them with one ``pwritev`` and does its bookkeeping once for them.
Every call the thread makes gives the GIL up, and taking it back waits for the event loop's
thread; per chunk, that bookkeeping was what that thread in turn waited for (issue 15)."""
IN_FLIGHT = 2 * BATCH
"""Chunks of one result sealed and not yet written, at most (2 MiB): the sink waits once they
are two batches, until the older is written -- the thread writes one while the next is read."""

_Item = tuple[str, int, bytes, str, int, bytes | None]
"""A chunk for the segment thread: stream, index, sealed blob, the blob's hex SHA-256,
plaintext size, and the plaintext when an auditor's copy is still to be sealed."""


class _Segment:
    """One segment file.  Only the segment thread writes it and only the sync thread syncs it;
    its descriptor is closed once neither will use it again (``retired`` and not ``syncing``),
    never while one of them might -- a reused descriptor number would be another file -- and
    no result with bytes in it may still commit (its ``flock`` goes with the descriptor)."""

    __slots__ = ("end", "failed", "fd", "name", "retired", "synced", "syncing", "users")

    def __init__(self, name: str, fd: int) -> None:
        self.name = name
        self.fd = fd
        self.end = 0
        """Bytes written (moved under the store's lock, after the write)."""
        self.synced = 0
        """Bytes known durable: written before an ``fdatasync`` that returned."""
        self.failed: BaseException | None = None
        """An ``fdatasync`` failed: nothing past ``synced`` can be trusted, nothing more is
        written."""
        self.syncing = False
        self.retired = False
        """The segment thread has moved on from it (a failed one, or at close)."""
        self.users: weakref.WeakSet[SegmentWriter] = weakref.WeakSet()
        """The writers with bytes here: a retired segment is kept open (and locked) while one
        of them may still commit."""


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

    @property
    def end(self) -> int:
        return self.audit[0] + self.audit[1] if self.audit is not None else self.pos + self.size


class SegmentStore:
    """The segments of one writing journal, and the two threads that fill and sync them
    (started by the first stream that spills in this process)."""

    def __init__(
        self, directory: Path, where: str, key: BrokerKey, audit: AuditSealer | None
    ) -> None:
        self.directory = directory
        self._where = where
        self._key = key
        self._audit = audit
        self._reset()

    def _reset(self) -> None:
        """A store with no segment and no thread: new, or in a forked child (which must not
        write its parent's segment, and has none of its threads)."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._sync_due = threading.Condition(self._lock)
        self._queue: queue.SimpleQueue[tuple[SegmentWriter, list[_Item]] | None] = (
            queue.SimpleQueue()
        )
        self._current: _Segment | None = None
        self._segments: list[_Segment] = []
        self._retired: list[_Segment] = []
        """Retired segments kept open, and so locked: a result synced there before the
        segment failed may still commit, naming bytes a compaction must not take."""
        self._doubts: list[tuple[set[_Segment], Callable[[], bool]]] = []
        """Segments holding bytes of a result whose commit may yet land (``doubt``), and what
        says it no longer can."""
        self._flushing: set[SegmentWriter] = set()
        self._sync_asked = False
        self._stop = False
        self._threads: list[threading.Thread] = []
        self._dir_synced = False

    def writer(self, invocation_id: str) -> SegmentWriter:
        """The writer of one result (one run of one invocation), on the trio thread."""
        return SegmentWriter(self, invocation_id, trio.lowlevel.current_trio_token())

    def doubt(self, writer: SegmentWriter, settled: Callable[[], bool]) -> None:
        """``writer``'s result ended ``CommitUnknown``: its rows, naming its bytes, may be
        recovered by an open after a crash (SQLite: its frames in the -wal).  Its writer --
        gone once its call ends -- no longer keeps a retired segment open and locked: every
        segment it wrote to stays so until ``settled()`` (a later commit written over those
        frames) or the store closes -- else a compaction could take bytes a recovered marker
        names."""
        with self._lock:
            held = {e.segment for entries in writer._entries.values() for e in entries}
            if held:
                self._doubts.append((held, settled))

    def close(self) -> None:
        """Let the threads finish what is queued and stop; close the files."""
        if self._pid != os.getpid():
            return
        with self._lock:
            self._stop = True
            self._sync_due.notify_all()
        self._queue.put(None)
        for t in self._threads:
            t.join()
        self._threads.clear()
        for fd in [seg.fd for seg in (*self._segments, *self._retired)]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._segments.clear()
        self._retired.clear()
        self._current = None

    # -- the segment thread ---------------------------------------------------------------------

    def _seal(self, writer: SegmentWriter, stream: str, index: int, plain: bytes) -> _Item:
        """A chunk for the segment thread, sealed and its blob hashed here: AES-GCM and
        hashlib give the GIL up and take it back, and taking it back is what the segment thread
        waits for while the event loop's thread reads (issue 15: sealing here made a 50 MiB
        result ~14% faster; hashing here too spares the thread one wait for the GIL per chunk
        -- figures in the commit that moved it).  The auditor's copy -- an X25519 agreement
        per chunk -- is sealed and hashed on the thread."""
        aad = chunk_aad(writer.invocation_id, stream, index)
        sealed = self._key.seal(plain, aad)
        copy = plain if self._audit is not None else None
        return (stream, index, sealed, hashlib.sha256(sealed).hexdigest(), len(plain), copy)

    def _submit(self, writer: SegmentWriter, items: list[_Item]) -> None:
        """Queue a batch of ``writer``'s chunks for the segment thread (starting it)."""
        if self._pid != os.getpid():
            self._reset()
        if not self._threads:
            for target, name in ((self._fill, "fill"), (self._sync, "sync")):
                t = threading.Thread(target=target, name=f"affidavit-segments-{name}", daemon=True)
                t.start()
                self._threads.append(t)
        self._queue.put((writer, items))

    def _fill(self) -> None:
        while (batch := self._queue.get()) is not None:
            writer, items = batch
            try:
                if writer._error is None:
                    self._write(writer, items)
            except OSError as exc:
                writer._fail(self._error(exc))
            except Exception as exc:  # a bug: this result fails, the thread goes on
                writer._fail(ResultStoreFailed(f"writing a result segment failed: {exc!r}"))
            finally:
                writer._processed_some(len(items))
            # Not kept while this thread waits for the next batch: a result's last sealed and
            # plain chunks stayed referenced until then, whoever's result it was (audit 50).
            del batch, writer, items

    def _write(self, writer: SegmentWriter, items: list[_Item]) -> None:
        """Write a batch -- each chunk's sealed blob, then its auditor's copy -- and note where
        each went and its hash (the sealed blob's taken as it was sealed, ``_seal``)."""
        blobs: list[bytes] = []
        copies: list[bytes | None] = []
        audit = self._audit
        for stream, index, sealed, _, _, plain in items:
            blobs.append(sealed)
            copy = None
            if audit is not None and plain is not None:
                copy = audit.seal(plain, chunk_aad(writer.invocation_id, stream, index))
                blobs.append(copy)
            copies.append(copy)
        seg = self._segment()
        pos = self._append(seg, blobs)
        new: list[tuple[str, _Spilled]] = []
        for (stream, _, sealed, sha256, plain_size, _), copy in zip(items, copies, strict=True):
            at = pos
            pos += len(sealed)
            audited = None
            if copy is not None:
                audited = (pos, len(copy), hashlib.sha256(copy).hexdigest())
                pos += len(copy)
            entry = _Spilled(seg, at, len(sealed), sha256, plain_size, audited)
            new.append((stream, entry))
        with self._lock:
            seg.users.add(writer)
            for stream, entry in new:
                writer._entries.setdefault(stream, []).append(entry)
            if seg.end - seg.synced >= SYNC_BYTES:
                self._sync_asked = True
                self._sync_due.notify()

    def _segment(self) -> _Segment:
        """The segment to write to: the current one unless a sync failed it, else a new one."""
        with self._lock:
            seg = self._current
            if seg is not None and seg.failed is None:
                return seg
            if seg is not None:
                seg.retired = True
                self._close_if_idle(seg)
            self._current = None
        return self._open()

    def _append(self, seg: _Segment, blobs: list[bytes]) -> int:
        """Write ``blobs`` whole, one after the other, at the segment's end; then move the end
        past them."""
        pos = seg.end
        total = sum(map(len, blobs))
        pwritev = getattr(os, "pwritev", None)  # (not on every platform)
        done = pwritev(seg.fd, blobs, pos) if pwritev is not None else 0
        if done < total:  # a short write (rare): the rest as one buffer
            rest = memoryview(b"".join(blobs))
            while done < total:
                n = os.pwrite(seg.fd, rest[done:], pos + done)
                if n <= 0:
                    raise OSError(5, "short write")
                done += n
        with self._lock:
            seg.end = pos + total
        return pos

    def _open(self) -> _Segment:
        """A new segment file, durably named before anything in it can be referenced: the
        directory's entry in its parent (synced once per store, until that succeeds) and the
        file's in the directory."""
        if not self._dir_synced:
            self.directory.mkdir(mode=0o700, exist_ok=True)
            _fsync_dir(self.directory.parent)
            self._dir_synced = True
        name = os.urandom(16).hex() + ".seg"
        fd = os.open(
            self.directory / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600
        )
        seg = _Segment(name, fd)
        try:
            # Held until the store closes (``close``, a retired one too): bytes written here and
            # not yet named by a commit are in flight, which a compaction must not touch
            # (``compact.py`` skips a segment it cannot lock).  Blocking: a compaction locks an
            # empty segment only for an instant, and leaves it.
            fcntl.flock(fd, fcntl.LOCK_EX)
            _fsync_dir(self.directory)
        except BaseException:
            os.close(fd)
            raise
        with self._lock:
            self._segments.append(seg)
            self._current = seg
        return seg

    def _close_if_idle(self, seg: _Segment) -> None:
        """Under the lock: close a retired segment's descriptor once no thread may use it and
        no result with bytes in it may still commit (every one failed, or is gone) or may have
        committed (``doubt``) -- its ``flock`` goes with it, and a compaction may then take its
        unnamed bytes.  Those kept are looked at again each time."""
        if seg.retired and not seg.syncing and seg in self._segments:
            self._segments.remove(seg)
            self._retired.append(seg)
        self._doubts = [d for d in self._doubts if not d[1]()]
        doubted = set().union(*(held for held, _ in self._doubts))
        kept: list[_Segment] = []
        for old in self._retired:
            if old in doubted or any(w._error is None for w in old.users):
                kept.append(old)
            else:
                with contextlib.suppress(OSError):
                    os.close(old.fd)
        self._retired = kept

    def _error(self, exc: BaseException) -> ResultStoreFailed:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else repr(exc)
        return ResultStoreFailed(
            f"journal {self._where}: writing a result segment in {self.directory} failed: {why}"
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
                for seg, _ in todo:
                    seg.syncing = True
            for seg, target in todo:
                error: BaseException | None = None
                try:
                    _datasync(seg.fd)
                except Exception as exc:  # EIO, or no way to sync here: never a hang
                    error = exc
                with self._lock:
                    seg.syncing = False
                    if error is None:
                        seg.synced = max(seg.synced, target)
                    else:
                        seg.failed = error
                    self._close_if_idle(seg)
            with self._lock:
                waiting = list(self._flushing)
            # Not kept while this thread waits for the next round (as ``_fill`` does not keep
            # its batch): a writer whose call ended stayed alive until then, and with it the
            # retired segment its bytes are in, locked.
            while waiting:
                waiting.pop()._poke()


def _datasync(fd: int) -> None:
    sync = getattr(os, "fdatasync", None) or os.fsync  # (no fdatasync on macOS)
    sync(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SegmentWriter:
    """One result's chunks: what the sink calls on the trio thread (``put``, ``drain``,
    ``flush``; several tasks may wait on one writer), and what the commit calls in the writer
    thread (``prepare``)."""

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
        self._batch: list[_Item] = []
        self._flushed = False
        # Written by the threads, read under the store's lock:
        self._processed = 0
        self._error: ResultStoreFailed | None = None
        self._entries: dict[str, list[_Spilled]] = {}
        self._waiters: list[tuple[trio.Event, Callable[[], bool]]] = []

    # -- the sink's side (trio thread) ----------------------------------------------------------

    async def put(self, stream: str, index: int, data: bytes, *, last: bool = False) -> None:
        """Store chunk ``index`` of ``stream`` (chunks in order, ``last`` for a stream's short
        tail).  ``ResultStoreFailed`` once a chunk of this result could not be written."""
        if self._flushed:
            raise ValueError(f"result of invocation {self.invocation_id} was already flushed")
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
        try:  # every chunk sealed before anything is counted: a failure leaves no gap to wait on
            items = [self._store._seal(self, stream, first + i, c) for i, c in enumerate(chunks)]
        except Exception as exc:  # a bug or a broken key: this result fails, never hangs
            self._fail(ResultStoreFailed(f"sealing a result chunk failed: {type(exc).__name__}"))
            self._raise()
        held.clear()
        self._sent[stream] = first + len(chunks)
        self._queued += len(items)
        self._batch.extend(items)
        if len(self._batch) >= BATCH:
            self._send()
        if self._queued - self._processed >= IN_FLIGHT:
            self._send()
            await self._wait(lambda: self._queued - self._processed <= IN_FLIGHT // 2)
        self._raise()

    def _send(self) -> None:
        if self._batch:
            self._store._submit(self, self._batch)
            self._batch = []

    async def drain(self) -> None:
        """Wait until every chunk sent is written; ``ResultStoreFailed`` if one was not."""
        # Nothing ever queued (a result held whole, as most are): no thread holds a chunk of
        # it, so there is nothing to wait for nor a lock to take (a small result's sink and
        # commit drain it several times a call, issue 15).
        if self._queued:
            self._send()
            await self._wait(lambda: self._processed == self._queued)
        self._raise()

    async def flush(self) -> None:
        """``drain``, then wait until every byte written is synced: the commit may then name
        them, and nothing more may be put.  ``ResultStoreFailed`` if a write or a sync
        failed."""
        await self.drain()
        if self._flushed:  # (commit_result flushes what the sink flushed already)
            if self._queued:  # (else no byte of it is in a segment: nothing to have synced)
                self._check_synced()
            return
        store = self._store
        if self._entries:
            with store._lock:
                store._flushing.add(self)
                store._sync_asked = True
                store._sync_due.notify()
            try:
                await self._wait(lambda: all(s.synced >= e or s.failed for s, e in self._ends()))
            finally:
                with store._lock:
                    store._flushing.discard(self)
            self._check_synced()
        self._flushed = True

    def _ends(self) -> list[tuple[_Segment, int]]:
        """Per segment this result wrote to, the end of its last bytes there (under the lock, or
        once the segment thread is done with it)."""
        ends: dict[_Segment, int] = {}
        for entries in self._entries.values():
            for e in entries:
                ends[e.segment] = max(ends.get(e.segment, 0), e.end)
        return list(ends.items())

    def _check_synced(self) -> None:
        with self._store._lock:
            lost = [s for s, end in self._ends() if s.synced < end]
            if lost and self._error is None:
                why = lost[0].failed or OSError(5, "not synced")
                self._error = self._store._error(why)
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    async def _wait(self, ready: Callable[[], bool]) -> None:
        lock = self._store._lock
        while True:
            with lock:
                if self._error is not None or ready():
                    return
                waiter = (trio.Event(), ready)
                self._waiters.append(waiter)
            try:
                await waiter[0].wait()
            finally:
                with lock:
                    if waiter in self._waiters:
                        self._waiters.remove(waiter)

    # -- the threads' side ----------------------------------------------------------------------

    def _fail(self, error: ResultStoreFailed) -> None:
        with self._store._lock:
            if self._error is None:
                self._error = error

    def _processed_some(self, n: int) -> None:
        with self._store._lock:
            self._processed += n
        self._poke()

    def _poke(self) -> None:
        """Wake every waiting task whose condition holds (all of them if this result failed)."""
        with self._store._lock:
            woken = [w for w in self._waiters if self._error is not None or w[1]()]
            for w in woken:
                self._waiters.remove(w)
        for event, _ in woken:
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(event.set)

    # -- the commit's side (writer thread, inside the barrier transaction) ---------------------

    def prepare(
        self, txn: Txn, key: BrokerKey, audit: AuditSealer | None, expect: Mapping[str, str]
    ) -> tuple[ResultStreams, Callable[[Tables], None]]:
        """Each stream's marker entry, and the write of the result's chunk rows -- a reference
        per spilled chunk, the held chunks sealed inline -- for the commit to run once its
        event is accepted (nothing is written before: a refused commit changes nothing).  Only
        a flushed writer is taken, every spilled byte of it synced (checked here again).  The
        write first drops the rows an earlier, uncommitted attempt left."""
        iid = self.invocation_id
        with self._store._lock:
            flushed = self._flushed and self._processed == self._queued
        if not flushed:
            raise ResultStoreFailed(f"result of invocation {iid}: its chunks were not flushed")
        self._check_synced()
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
                aad = chunk_aad(iid, stream, idx)
                sealed = key.seal(plain, aad)
                inline.append((False, stream, idx, sealed))
                info["sealed"].append(hashlib.sha256(sealed).hexdigest())
                if audit is not None:
                    copy = audit.seal(plain, aad)
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
            for table, stream, idx, blob in inline:  # the marker follows in this transaction
                tables.put_chunk(table, iid, stream, idx, blob, own=False)

        return per, write
