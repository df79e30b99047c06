"""``<journal>.open``: a SQLite journal's -wal may hold commits, so a missing -wal is a loss.

Every commit since the last checkpoint is in ``<journal>-wal`` alone.  Lost after a checkpoint
(removed with the ``-shm``, a backup that copied the main file alone), the file left is a
shorter journal that still verifies -- and a daemon's start-up compaction then deleted the
segment files of the commits lost, the only sealed bytes of requests that were sent.  Nothing
in the main file tells.  This marker does:

* A writer's open makes it (0600, synced with its directory) before SQLite opens the file, and
  it stays while any connection has the journal open: SQLite removes the ``-wal`` only when the
  last connection to the file closes (and could checkpoint all of it).
* A close -- of a writer or of the writing journal's reader -- removes the marker only when the
  ``-wal`` is gone after it: SQLite itself removed it, every commit is in the main file.  One of
  two embedded writers closing leaves the ``-wal`` to the other, and the marker with it.
* An open that finds the marker and no ``-wal`` beside a journal file with a database in it
  (more than 0 bytes) is refused ``JournalLost`` (``JOURNAL_LOST``): the -wal of a journal
  that was open was lost -- killed, then the ``-wal`` removed.  Nothing is opened, so nothing
  (start-up reclaim included) touches the segment files.  A read-only open (``verify``, the
  views) is refused the same way (``refuse_read_if_lost``): SQLite makes an empty ``-wal``
  for it, after which the loss no longer shows -- as it does not after any other SQLite
  program (the ``sqlite3`` shell) opened the file.

An open and a close each hold an exclusive ``flock`` of the marker around their check and
SQLite's open or close, so a close that removes the ``-wal`` and then the marker is never seen
half-done by an open (marker there, ``-wal`` already gone).  Read-only connections (the views)
never checkpoint nor remove the ``-wal``: they only look, under a shared lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from .errors import JournalError, JournalLost
from .names import beside

__all__ = ["MARKER", "closing", "opening", "refuse_read_if_lost"]

MARKER = ".open"
_TRIES = 3
"""Times an open takes the marker anew when a close removed the one it locked."""


def _wal(real: Path) -> Path:
    return Path(f"{real}-wal")


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync(fd: int, marker: Path, where: str) -> None:
    try:
        os.fsync(fd)
        _fsync_dir(marker.parent)
    except OSError as exc:
        raise JournalError(
            f"journal {where}: its open marker {marker} could not be synced "
            f"({exc.strerror or type(exc).__name__}); nothing was opened"
        ) from None


def _in_place(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (st.st_dev, st.st_ino)


def _holds_database(real: Path) -> bool:
    try:
        return real.stat().st_size > 0
    except FileNotFoundError:
        return False


@contextlib.contextmanager
def opening(real: Path, where: str) -> Iterator[None]:
    """Around a writer connection's open of the journal file ``real``: the marker made (or
    found, with the ``-wal`` it promises) and locked until SQLite has the file open.  Raises
    ``JournalLost`` -- nothing opened -- for a marker without its ``-wal``.  A marker that
    cannot be made (no directory, read-only: the open fails there anyway) is not made; an
    error syncing it (``EIO``) propagates."""
    marker = beside(real, MARKER)
    for _ in range(_TRIES):
        try:
            fd = os.open(marker, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            made = True
        except FileExistsError:
            try:
                fd = os.open(marker, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                continue  # (a close removed it meanwhile)
            except OSError as exc:  # (another user's: ``exposure.journal_files`` names it)
                raise JournalError(
                    f"journal {where}: its open marker {marker} cannot be opened "
                    f"({exc.strerror or type(exc).__name__}): give it to the broker's user"
                ) from None
            made = False
        except OSError:
            break  # (no directory, read-only: SQLite's open says so, as it always did)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if not _in_place(fd, marker):
                continue  # a close removed it while this open waited
            if made:
                _sync(fd, marker, where)
            elif _holds_database(real) and not os.path.lexists(_wal(real)):
                raise _lost(real, where, marker)
            try:
                yield
            except BaseException:
                _remove_unless_wal(real, fd, marker)  # (the open failed: what a close does)
                raise
            return
        finally:
            os.close(fd)  # (the lock with it)
    yield  # (unmade, or closes kept removing it: opened and closed meanwhile)


def refuse_read_if_lost(real: Path, where: str) -> None:
    """Before a read-only connection opens the journal file ``real``: ``JournalLost`` for a
    marker without its ``-wal`` -- SQLite's read-only open makes an empty ``-wal`` where there
    is none, after which no writer's open could tell (and ``verify`` would say intact)."""
    marker = beside(real, MARKER)
    try:
        fd = os.open(marker, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_SH)  # (not during a close's removal of both)
        lost = _in_place(fd, marker) and _holds_database(real)
        if lost and not os.path.lexists(_wal(real)):
            raise _lost(real, where, marker)
    finally:
        os.close(fd)


@contextlib.contextmanager
def closing(real: Path) -> Iterator[None]:
    """Around the close of a connection that may be the journal's last (a writer's, the
    writing journal's reader): then, the ``-wal`` gone (SQLite removed it), the marker too."""
    marker = beside(real, MARKER)
    try:
        fd = os.open(marker, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        yield  # (none: a journal opened before markers, or another close took it)
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
        _remove_unless_wal(real, fd, marker)
    finally:
        os.close(fd)


def _remove_unless_wal(real: Path, fd: int, marker: Path) -> None:
    """The marker ``fd`` (locked) removed if the journal has no ``-wal``: SQLite removed it as
    the last connection closed, with every commit in the main file (or never made one)."""
    with contextlib.suppress(OSError):
        if os.path.lexists(_wal(real)) or not _in_place(fd, marker):
            return
        os.unlink(marker)
        _fsync_dir(marker.parent)


def _lost(real: Path, where: str, marker: Path) -> JournalLost:
    return JournalLost(
        f"journal {where}: its -wal ({_wal(real)}) is gone, but {marker} says the journal was "
        "open and never closed: the -wal was lost with every commit since the last checkpoint "
        "(what is left still verifies, shorter) -- restore the -wal (or a backup of the "
        "journal with its -wal) and open it again; nothing was opened and no segment file "
        "touched. To go on with what is left, knowingly, remove the marker "
        f"(`rm {marker}`) and run `affidavit journal verify` against an anchor kept elsewhere",
        public="the journal's -wal was lost while it was open; the operator must restore it",
    )
