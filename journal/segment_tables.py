"""Reading long results' chunks through their segment references (SQLite, schema 4).

``segments.py`` stores a long result's chunks in segment files beside the journal, and the
commit writes one reference row per chunk (segment, position, size) in ``result_segments``.
``SegmentTables`` resolves them, so every reader -- ``read_result``, ``ResultStream``,
``verify``, the auditor's side, ``migrate`` -- sees blobs as from a row, checked against the
marker's chained hashes before anything opens them.

What a reference can make a reader do is bounded, whoever edited the row:

* only a file named ``<32 hex>.seg`` in the segment directory is opened -- no other path, not
  through a symlink (``O_NOFOLLOW``), only a regular file (a FIFO would block), never
  ``size`` past ``MAX_BLOB``;
* a segment file that is not there (removed, or its directory missing) leaves its chunks out:
  they read as *missing* (``verify``'s ``CHUNK_MISSING``, a result "incomplete: chunk N is
  missing"), a loss told apart from an edit;
* a segment that is too short or not a plain file (a symlink, a FIFO), a name or numbers out of
  those bounds, or a chunk stored twice (a row and a reference for one index) read as an empty
  blob: *altered*, which no chained hash matches;
* a segment that exists but cannot be read (permissions, too many open files, an I/O error) is
  a ``JournalError`` saying so -- never reported as tampering, never silently empty.
"""

from __future__ import annotations

import collections
import errno
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import JournalError
from .tables import Tables

__all__ = [
    "MAX_BLOB",
    "SEGMENT_LOCKS",
    "SEGMENT_REFS",
    "SEGMENT_SCHEMA",
    "SEGMENT_SQL",
    "SegmentTables",
    "is_segment_name",
]

MAX_BLOB = 1 << 20
"""No stored chunk is larger (64 KiB of plaintext, sealed): a reference naming more is altered."""

_NAME = re.compile(r"[0-9a-f]{32}\.seg")
_MISSING = (errno.ENOENT, errno.ELOOP, errno.ENXIO, errno.ENOTDIR)
"""``open`` errors that mean "no segment file there" (a symlink is refused: ``ELOOP``)."""
_ABSENT = (errno.ENOENT, errno.ENOTDIR)
"""Of those, the ones where nothing is there at all (the file or its directory gone): its
chunks are missing, not altered."""
_OPEN_FILES = 8
"""Segment files one scan keeps open at once (least recently used closed first)."""


def is_segment_name(name: str) -> bool:
    return _NAME.fullmatch(name) is not None


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
CREATE INDEX IF NOT EXISTS result_segments_segment ON result_segments (segment);
"""
"""Schema 4: one row per chunk stored in a segment (``segments.py``); schema 7: indexed by
segment, which a compaction looks its rows up by (``SEGMENT_REFS``)."""

SEGMENT_REFS = "SELECT segment, pos, size FROM result_segments WHERE segment IN ({})"
"""The reference rows of some segments (``{}``: one ``?`` each), which a compaction keeps
(``compact.py``): through ``result_segments_segment`` -- before schema 7 it scanned every
reference row of the journal (``tests/benchmarks/reclaim_candidates.py --segments``)."""
SEGMENT_LOCKS = "segment_locks"
"""The ``meta`` row that proves every writer of the journal locks its segment files: no writer
of an earlier affidavit can still be writing there (``compact.py``, ``SqliteBackend.create``)."""

_REF_COLUMNS = "invocation_id, audit, stream, idx, segment, pos, size"
_CHUNK_TABLES = {False: "result_chunks", True: "result_audit"}


def _union(table: str, where: str, order: str) -> str:
    return (
        f"SELECT invocation_id, stream, idx, CAST(data AS BLOB), NULL, NULL, NULL FROM {table} "
        f"WHERE {where} UNION ALL SELECT invocation_id, stream, idx, NULL, segment, pos, size "
        f"FROM result_segments WHERE audit = ? AND {where} ORDER BY {order}"
    )


SEGMENT_SQL: dict[str, str] = {
    "has_segment_refs": "SELECT 1 FROM sqlite_master WHERE type = 'table' AND "
    "name = 'result_segments'",
    "any_segment_ref": "SELECT 1 FROM result_segments LIMIT 1",
    "put_segment_refs": f"INSERT INTO result_segments ({_REF_COLUMNS}) VALUES (?,?,?,?,?,?,?)",
    "drop_segment_stream": "DELETE FROM result_segments WHERE invocation_id = ? AND stream = ?",
    "drop_segment_result": "DELETE FROM result_segments WHERE invocation_id = ?",
    **{
        f"{op}_{name}": sql
        for name in _CHUNK_TABLES.values()
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
    resolves its reference (see the module docstring for what a reference can make it do)."""

    __slots__ = ("_refs", "segments")

    def __init__(self, conn: Any, segments: Path | None = None) -> None:
        super().__init__(conn)
        self.segments = segments
        """The segment directory (None: references read as missing)."""
        self._refs = False

    def segments_missing(self) -> bool:
        """Whether some chunk lives in a segment while the segment directory is not there (a
        copy of the journal made without ``<path>.results/``)."""
        if self.segments is None or self.segments.is_dir() or not self._has_refs():
            return False
        return self.one("any_segment_ref") is not None

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
        if self._has_refs():
            self.run("drop_segment_stream", (iid, stream))

    def chunks(self, audit: bool, iid: str) -> Iterator[tuple[str, int, bytes]]:
        if not self._has_refs():
            yield from super().chunks(audit, iid)
            return
        rows = self.rows(f"chunk_refs_{_CHUNK_TABLES[audit]}", (iid, int(audit), iid))
        for _, stream, idx, blob in _resolved(rows, self.segments):
            yield stream, idx, blob

    def chunk(self, audit: bool, iid: str, stream: str, idx: int) -> bytes | None:
        if not self._has_refs():
            return super().chunk(audit, iid, stream, idx)
        params = (iid, stream, idx, int(audit), iid, stream, idx)
        rows = self.rows(f"stream_ref_{_CHUNK_TABLES[audit]}", params)
        got = [blob for *_, blob in _resolved(rows, self.segments)]
        return got[-1] if got else None

    def every_chunk(self, audit: bool) -> Iterator[tuple[str, str, int, bytes]]:
        if not self._has_refs():
            yield from super().every_chunk(audit)
            return
        yield from _resolved(
            self.rows(f"every_ref_{_CHUNK_TABLES[audit]}", (int(audit),)), self.segments
        )


def _resolved(rows: Iterator[Any], directory: Path | None) -> Iterator[tuple[str, str, int, bytes]]:
    """(invocation, stream, idx, blob) of rows ordered by those keys, references read.  A key
    that comes twice (a row and a reference for one chunk) is yielded again as an empty blob,
    so that whoever keeps the last one per key -- ``verify`` -- sees the chunk as altered.  A
    chunk whose segment file is not there is left out: missing (``_Files.blob``)."""
    files = _Files(directory)
    last: tuple[str, str, int] | None = None
    try:
        for iid, stream, idx, data, seg, pos, size in rows:
            key = (iid, stream, idx)
            blob = b"" if key == last else files.blob(data, seg, pos, size)
            last = key
            if blob is not None:
                yield iid, stream, idx, blob
    finally:
        files.close()
        # The rows' cursor too, now -- while its connection is open -- rather than when a
        # traceback holding this frame is freed, maybe after the reader closed.
        close = getattr(rows, "close", None)
        if close is not None:
            close()


class _Files:
    """Segment files opened for one read, at most ``_OPEN_FILES`` at once."""

    def __init__(self, directory: Path | None) -> None:
        self._dir = directory
        self._fds: collections.OrderedDict[str, int | None] = collections.OrderedDict()
        self._absent: set[str] = set()
        """Segments not there at all (``_ABSENT``)."""

    def close(self) -> None:
        for fd in self._fds.values():
            if fd is not None:
                os.close(fd)
        self._fds.clear()

    def blob(self, data: Any, segment: Any, pos: Any, size: Any) -> bytes | None:
        """The chunk's stored bytes; empty when the reference is altered (no chained hash
        matches); None when its segment file is not there (the chunk is missing)."""
        if data is not None:
            return bytes(data)
        if not (isinstance(segment, str) and is_segment_name(segment)) or self._dir is None:
            return b""
        if not (type(pos) is int and type(size) is int and pos >= 0 and 0 <= size <= MAX_BLOB):
            return b""
        fd = self._open(segment)
        if fd is None:
            return None if segment in self._absent else b""
        try:
            out = os.pread(fd, size, pos)
        except OSError as exc:
            raise self._unreadable(segment, exc) from None
        return out if len(out) == size else b""

    def _open(self, segment: str) -> int | None:
        if segment in self._fds:
            self._fds.move_to_end(segment)
            return self._fds[segment]
        assert self._dir is not None
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd: int | None
        try:
            fd = os.open(self._dir / segment, flags)
        except OSError as exc:
            if exc.errno not in _MISSING:
                raise self._unreadable(segment, exc) from None
            if exc.errno in _ABSENT:
                self._absent.add(segment)
            fd = None
        if fd is not None and not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            fd = None
        if len(self._fds) >= _OPEN_FILES:
            _, old = self._fds.popitem(last=False)
            if old is not None:
                os.close(old)
        self._fds[segment] = fd
        return fd

    def _unreadable(self, segment: str, exc: OSError) -> JournalError:
        return JournalError(
            f"result segment {self._dir / segment if self._dir else segment} cannot be read: "
            f"{exc.strerror or exc}"
        )
