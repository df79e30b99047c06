"""The files a SQLite journal keeps beside itself follow the file, not the name it is opened under.

Its writer lock ``<journal>.lock`` (``lock.py``), its long results' directory
``<journal>.results/`` (``segments.py``), its default key files ``<journal>.key`` and
``<journal>.signing.key`` and the console's ``<journal>.console-tokens/`` are all beside
``journal_file(path)``: the path resolved (``os.path.realpath``: links, a chain of them, a
dangling one, ``..``, a relative name), the directory SQLite keeps its ``-wal`` and ``-shm`` in.
A journal opened through a link in another directory otherwise found no segment directory and
called its long results altered, and found no key.

A deployment that always opened its journal through a link has those files beside the link:
``refuse_left_beside`` refuses it, naming both paths and the ``mv`` that fixes it, rather than
make a fresh key or segment directory beside the file, or claim a result altered.  PostgreSQL
URLs are not paths and never come here.
"""

from __future__ import annotations

import contextlib
import os
import shlex
from pathlib import Path

from .errors import JournalError, JournalLost

__all__ = ["beside", "journal_file", "refuse_left_beside", "refuse_lost"]


def journal_file(path: str | os.PathLike[str]) -> Path:
    """The file a journal's ``path`` names: the one name its derived files are kept beside."""
    return Path(os.path.realpath(path))


def beside(path: str | os.PathLike[str], suffix: str) -> Path:
    """``<journal_file(path)><suffix>``: a file the journal keeps beside itself."""
    return Path(f"{journal_file(path)}{suffix}")


def refuse_left_beside(
    given: str | os.PathLike[str], suffix: str, what: str, used: Path | None = None
) -> None:
    """``JournalError`` if the journal's ``what`` (``beside(given, suffix)``) is not there but
    ``<given><suffix>``, another file, is: an earlier affidavit kept it beside the name the
    journal was opened under.  Operator words name both paths and the ``mv``; public words
    none.  Nothing when the given name is the file's (the usual case: two ``lstat`` calls), nor
    when the file used is another one (``used``: a key file configured elsewhere)."""
    if used is not None and used != beside(given, suffix):
        return
    used = beside(given, suffix)
    if os.path.lexists(used):
        return
    old = Path(f"{given}{suffix}")
    if not os.path.lexists(old) or os.path.realpath(old) == str(used):
        return
    raise JournalError(
        f"journal {given} is the file {journal_file(given)}, whose {what} is kept beside it "
        f"({used}), but it is beside the name given ({old}), where an earlier affidavit kept "
        f"it: move it there (`mv {shlex.quote(str(old))} {shlex.quote(str(used))}`), then open "
        "the journal again",
        public=f"the journal's {what} is beside another name of the journal file than the "
        "file's own; the operator must move it",
    )


MADE_BESIDE = (".key", ".signing.key")
"""The files beside a journal only a journal made there leaves (``refuse_lost``): its default
key files (``bind_keys`` makes them with its schema), and its segment directory when not
empty."""


def refuse_lost(given: str | os.PathLike[str], where: str) -> None:
    """``JournalLost`` if the file ``given`` names holds no journal (the caller found no
    ``events`` table, in a file that held SQLite's header before this open: a first open
    finds it absent or empty, and is not asked) yet files only a journal made there leaves
    are beside it: its ``-wal`` was lost, with every commit since the last checkpoint, the
    schema too -- or a first open was killed before it committed.  Never a new journal
    signed with the old keys (``verify`` would say intact, a same-key call send again, a
    compaction delete the surviving segment files).  Operator words name the files and the way
    out; public words none."""
    left = [p for p in (beside(given, s) for s in MADE_BESIDE) if os.path.lexists(p)]
    segments = beside(given, ".results")
    with contextlib.suppress(OSError):
        if segments.is_dir() and any(segments.iterdir()):
            left.append(segments)
    if not left:
        return
    names = ", ".join(str(p) for p in left)
    moves = " ".join(shlex.quote(str(p)) for p in left)
    raise JournalLost(
        f"journal {where} holds no journal, but {names} of a journal made there "
        f"{'is' if len(left) == 1 else 'are'} beside it: its -wal was lost (every commit since "
        "the last checkpoint goes with it), or its first open never committed -- restore the "
        "-wal (or a backup of the journal with its -wal) and open it again; nothing was "
        "created. To start a new journal there "
        f"deliberately, move {'it' if len(left) == 1 else 'them'} away first (`mkdir old && "
        f"mv {moves} old/`)",
        public="the journal file holds no journal but its key files or segments are beside "
        "it (its -wal was lost); the operator must restore it",
    )
