"""Returning the bytes of interrupted attempts in segment files (SQLite; ``segments.py``).

A segment only grows: a long result's chunks are written to it as they arrive and become
evidence only with the commit, which writes one ``result_segments`` row per chunk.  An attempt
that never committed (a crash, a cancellation, a storage fault mid-body) leaves bytes no row
names -- sealed, unreadable without the broker key, and of no use: nothing can ever name them,
since only the process that wrote them holds where they are, and only until it closes the
journal.  ``compact`` gives them back to the filesystem, at ``affidavit journal reclaim`` and at
a daemon's start-up reclaim:

* Only a segment no live writer holds.  A writing process holds an exclusive ``flock`` on each
  segment it opened until its journal closes (``SegmentStore``), so its bytes in flight --
  written, maybe synced, not yet named by a commit -- are never touched: such a segment is
  skipped (``busy``) and taken at a later reclaim.  A segment is locked here *before* its rows
  are read, so every commit that will ever name its bytes is already in them.  An empty one is
  left alone (a writer may be between creating and locking it; it holds no block anyway).
* Only bytes no ``result_segments`` row names, whatever the row's record: a reference of a
  committed result, or one left by hand, keeps its range.  A row whose numbers are not sane
  keeps the whole segment.
* Only a segment last written before the journal's newest row (``spare_after``): one written
  later holds bytes whose commits, if any, are not in the journal -- in a ``-wal`` that was lost
  (the only sealed copy of their bytes left), or still to come -- and is left whole.
* A segment no row names is removed (``unlink``, then the directory synced); else its tail past
  the last named byte is cut (``ftruncate``) and, on Linux, the unnamed blocks between are
  punched out (``fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)``: the offsets of the
  named bytes do not move, so no row changes).  Where punching is not supported (another OS,
  a filesystem without it) the gaps between named chunks stay; the rest is still returned.

Only on a journal where every writer locks its segments (``SEGMENT_LOCKS``, schema 7): a broker
of an earlier affidavit writes its segment without the lock, so its bytes in flight -- or just
named by a commit this compaction's read did not see -- would look unreferenced, and a removed
file would take a committed result with it.  Until the journal records that no such broker can
be writing (made here, or opened by its daemon since: ``SqliteBackend.create``), the compaction
of a directory with segment files is refused (``UNPROVEN``) and nothing is touched.

Whether holes can be punched is probed once per compaction, on a scratch file in the segment
directory (``probe_holes``): a dry run then reports what the real run would return on this
filesystem, and both say which (``Compaction.holes``).

Nothing in the database changes, and every step leaves a segment whose named bytes are as they
were: a crash (or an error) between any two steps leaves a journal that opens and verifies,
and a rerun finds what is left and finishes (``tests/journal/test_segment_compact.py``).
Punching a hole already punched, or cutting a tail already cut, returns nothing and costs
nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import os
import stat
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .names import beside
from .segment_tables import MAX_BLOB, is_segment_name
from .segments import _fsync_dir

__all__ = [
    "NOT_A_DIRECTORY",
    "UNPROVEN",
    "Compaction",
    "compact",
    "not_a_directory",
    "probe_holes",
    "refusal_message",
]

_PUNCH = 0x02 | 0x01
"""``FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`` (linux/falloc.h)."""
UNPROVEN = "SEGMENT_WRITERS_UNPROVEN"
"""The refusal's stable code: a writer that leaves its segments unlocked may be writing."""
NOT_A_DIRECTORY = "SEGMENT_DIR_UNUSABLE"
"""The refusal's stable code: ``<path>.results`` is there but is not a directory (a regular
file, a dangling link, ...): no segment files can be in it, and none was looked at -- not
"there is no segment directory"."""
_GROUP = 128
"""Segments locked and looked up together (one read of their rows; their descriptors open)."""


@dataclass(frozen=True, slots=True)
class Compaction:
    """What one compaction of the segment files did (a dry run: would do)."""

    segments: int
    """Segment files looked at."""
    removed: int
    """Of those, files no reference names: removed whole."""
    busy: int
    """Files a live writer holds (a result may be in flight there): left for a later reclaim."""
    bytes: int
    """Allocated bytes returned to the filesystem (a dry run: that would be)."""
    holes: bool = False
    """The segment directory's filesystem punches holes (``probe_holes``): the gaps between
    named chunks count (a dry run) and are returned; else only whole files and tails are."""
    refused: str | None = None
    """``UNPROVEN``: there were segment files and none was looked at; ``NOT_A_DIRECTORY``: the
    segment directory's path is something else (``refusal_message`` says why); else None."""
    absent: bool = False
    """No segment directory (no long result was ever stored in a file): nothing to compact,
    nothing looked at -- not "0 files looked at"."""
    spared: int = 0
    """Files last written after the journal's newest row (``spare_after``): left whole -- the
    commits naming their bytes may be in a lost ``-wal``; a later reclaim,
    once newer rows are there, takes what no row names."""


def refusal_message(where: str, code: str = UNPROVEN) -> str:
    """What an operator is told of a refusal ``code`` (stable words, no path but the
    journal's)."""
    if code == NOT_A_DIRECTORY:
        return (
            f"journal {where}: result segment files not compacted ({NOT_A_DIRECTORY}): "
            f"{beside(where, '.results')} is not a directory. A broker keeps a long result's "
            "bytes in segment files there, and makes the directory when it stores the first; "
            "move what is at that path away"
        )
    return (
        f"journal {where}: result segment files not compacted ({UNPROVEN}): a broker of an "
        "earlier affidavit may still be writing this journal, and it does not lock its segment "
        "files, so bytes it is writing would look unreferenced. Stop every broker of an earlier "
        "version; the journal's daemon (affidavit serve) then records that none is left when it "
        "starts, and compacts them"
    )


def not_a_directory(directory: Path | None) -> bool:
    """``directory`` (a journal's segment directory, ``Backend.segments``) is there but is not
    a directory (``NOT_A_DIRECTORY``): a regular file, a dangling link, ... -- no long result's
    bytes can be stored in it.  One ``lstat`` and one ``stat``; False when absent (the first
    long result makes it) or None (no segment files: PostgreSQL)."""
    return directory is not None and os.path.lexists(directory) and not directory.is_dir()


def _step(name: str) -> None:
    """A point between two steps of a compaction; tests make it raise, as a crash would."""


def compact(
    directory: Path | None,
    read_refs: Callable[[Sequence[str]], Iterator[tuple[Any, Any, Any]]],
    *,
    proven: bool,
    dry_run: bool = False,
    spare_after: float | None = None,
) -> Compaction:
    """Compact every segment file in ``directory`` that no live writer holds; ``read_refs``
    answers the (segment, pos, size) reference rows of the named segments.  ``spare_after``:
    the newest row's time -- a segment modified later is left whole (``spared``).  ``proven``: no
    writer that leaves its segments unlocked can be writing (``SEGMENT_LOCKS``); if not, a
    directory with segment files is refused (``UNPROVEN``, none touched) -- one without is
    not: the files listed here are the only ones a compaction takes, so none is nothing to
    refuse."""
    if not_a_directory(directory):
        return Compaction(0, 0, 0, 0, refused=NOT_A_DIRECTORY)
    if directory is None or not directory.is_dir():
        return Compaction(0, 0, 0, 0, absent=True)
    names = sorted(e.name for e in os.scandir(directory) if is_segment_name(e.name))
    if names and not proven:
        return Compaction(0, 0, 0, 0, refused=UNPROVEN)
    holes = probe_holes(directory) if names else False
    seen = removed = busy = returned = spared = 0
    for start in range(0, len(names), _GROUP):
        held: dict[str, int] = {}
        try:
            for name in names[start : start + _GROUP]:
                fd = _lock(directory / name)
                seen += 1
                if fd is None:
                    busy += 1
                elif fd >= 0 and spare_after is not None and os.fstat(fd).st_mtime > spare_after:
                    os.close(fd)
                    spared += 1
                elif fd >= 0:
                    held[name] = fd
            _step("locked")
            spans: dict[str, list[tuple[int, int]] | None] = {name: [] for name in held}
            for seg, pos, size in read_refs(list(held)):
                got = spans.get(seg)
                if got is None:
                    continue
                if type(pos) is int and type(size) is int and pos >= 0 and 0 <= size <= MAX_BLOB:
                    got.append((pos, pos + size))
                else:
                    spans[seg] = None  # not sane: keep the whole segment
            for name, fd in held.items():
                named = spans[name]
                if named is None:
                    continue
                gone, freed = _compact_one(directory, name, fd, named, dry_run, holes)
                removed += gone
                returned += freed
        finally:
            for fd in held.values():
                os.close(fd)
    return Compaction(seen, removed, busy, returned, holes, spared=spared)


def _lock(path: Path) -> int | None:
    """``path`` opened for writing and locked exclusive; None: a writer holds it; -1: nothing
    to do (not a regular file, gone, or empty -- let go at once: its writer may be waiting to
    lock it)."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError:
        return -1
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                os.close(fd)
                return None
            raise
        if os.fstat(fd).st_size == 0:
            raise OSError(errno.ENODATA, "empty")
    except OSError:
        os.close(fd)
        return -1
    return fd


def _compact_one(
    directory: Path, name: str, fd: int, named: list[tuple[int, int]], dry_run: bool, holes: bool
) -> tuple[int, int]:
    """(1 if removed, bytes returned) for one locked segment."""
    st = os.fstat(fd)
    size, allocated = st.st_size, st.st_blocks * 512
    if not named:
        if not dry_run:
            os.unlink(directory / name)
            _step("unlinked")
            _fsync_dir(directory)
        return 1, allocated
    block = max(st.st_blksize, 512)
    end = min(max(e for _, e in named), size)
    gaps = [(_up(a, block), _down(b, block)) for a, b in _gaps(sorted(named), end)]
    gaps = [(a, b) for a, b in gaps if a < b]
    punch = _punch_fn() if holes else None
    if dry_run:
        freed = _data(fd, _up(end, block), size) if end < size else 0
        if punch is not None:
            freed += sum(_data(fd, a, b) for a, b in gaps)
        return 0, freed
    # Each change keeps the segment's times: its mtime is when its writer last wrote it,
    # which ``spare_after`` judges (a compaction's own change never makes a segment spared).
    times = (st.st_atime_ns, st.st_mtime_ns)
    if end < size:
        os.ftruncate(fd, end)
        os.utime(fd, ns=times)
        _step("truncated")
    if punch is not None:
        for a, b in gaps:
            if punch(fd, _PUNCH, a, b - a) != 0:
                if ctypes.get_errno() in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                    break  # not on this filesystem: the gaps stay
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
            os.utime(fd, ns=times)
            _step("punched")
    os.fsync(fd)
    return 0, max(allocated - os.fstat(fd).st_blocks * 512, 0)


def _gaps(spans: list[tuple[int, int]], end: int) -> Iterator[tuple[int, int]]:
    """The ranges below ``end`` no span covers (``spans`` sorted)."""
    at = 0
    for a, b in spans:
        if a > at:
            yield at, min(a, end)
        at = max(at, b)
        if at >= end:
            return


def _up(n: int, block: int) -> int:
    return -(-n // block) * block


def _down(n: int, block: int) -> int:
    return n // block * block


def _data(fd: int, start: int, stop: int) -> int:
    """Bytes of ``[start, stop)`` the file holds data for (all of them where holes cannot be
    told apart)."""
    seek_data, seek_hole = getattr(os, "SEEK_DATA", None), getattr(os, "SEEK_HOLE", None)
    if seek_data is None or seek_hole is None:
        return max(stop - start, 0)
    total, at = 0, start
    while at < stop:
        try:
            data = os.lseek(fd, at, seek_data)
        except OSError:  # ENXIO: no data past ``at``
            break
        if data >= stop:
            break
        hole = min(os.lseek(fd, data, seek_hole), stop)
        total += hole - data
        at = hole
    return total


_PROBE = ".punch-probe-"


def probe_holes(directory: Path) -> bool:
    """Whether a hole can be punched in a file of ``directory``: tried on a scratch file there
    (two blocks written, the first punched; removed at once -- or, left by a crash, by the next
    probe -- its name no segment's), so that a dry run answers what the real run would return,
    not what Linux could.  Anything that fails on the way answers no: a report never counts
    bytes a run could not return."""
    punch = _punch_fn()
    if punch is None:
        return False
    for entry in os.scandir(directory):  # a crashed probe's (one running now keeps its fd)
        if entry.name.startswith(_PROBE):
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
    path = directory / f"{_PROBE}{os.urandom(8).hex()}"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return False
    try:
        block = max(os.fstat(fd).st_blksize, 512)
        os.pwrite(fd, b"\1" * (2 * block), 0)
        return bool(punch(fd, _PUNCH, 0, block) == 0)
    except OSError:
        return False
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)


_fallocate: Any = None


def _punch_fn() -> Any:
    """libc's ``fallocate`` (Linux), or None."""
    global _fallocate
    if _fallocate is None:
        _fallocate = False
        if sys.platform.startswith("linux"):
            with contextlib.suppress(OSError, AttributeError):
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
                fn = libc.fallocate
                fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
                fn.restype = ctypes.c_int
                _fallocate = fn
    return _fallocate or None
