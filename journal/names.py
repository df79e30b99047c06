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

import os
import shlex
from pathlib import Path

from .errors import JournalError

__all__ = ["beside", "journal_file", "refuse_left_beside"]


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
