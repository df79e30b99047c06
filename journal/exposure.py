"""Files of the broker's that others may reach: a SQLite journal and its ``-wal``/``-shm``, the key
files, the vault -- mode bits for group or others, or another user as owner.

The broker creates each of them 0600 (``sqlite_wal.create_private``, ``sealing.write_secret_file``,
the vault's own writes), but a file an earlier version created under the umask keeps its 0644,
and an operator may copy or restore one as another user.  Whoever can read the journal reads
every record (targets, paths, what was sent and received, sealed payloads' sizes); whoever can
write it can delete what the chain then only proves missing; another owner can replace it.  So
every process that opens the journal says so, once per file, on the operator's log (stderr
without one) -- naming the file and the command that fixes it, never refusing: a reader of the
journal needs no secret kept.  ``affidavit serve``, the boundary, refuses to start instead
(docs/deployment.md, "Files others can reach").
"""

from __future__ import annotations

import logging
import os
import shlex
import stat
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Exposure", "exposure", "journal_exposures", "warn_exposed"]

log = logging.getLogger("affidavit.journal")

JOURNAL_FILES = (("", "journal"), ("-wal", "journal WAL file"), ("-shm", "journal shm file"))
"""A SQLite journal's files: suffix, and what a message calls it."""


@dataclass(frozen=True)
class Exposure:
    """``path`` (a ``what``) others may reach: ``why``, and the shell command that mends it."""

    path: Path
    what: str
    why: str
    fix: str

    def __str__(self) -> str:
        return f"{self.what} {self.path} is {self.why}: {self.fix}"


def exposure(path: Path, what: str) -> Exposure | None:
    """The exposure of the file at ``path`` (its target, if a link), or None: it is this
    process's user's and neither group nor others have a mode bit on it -- or it is not there,
    is no regular file, or cannot be looked at (whoever opens it says why)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(st.st_mode):
        return None  # a directory, a device...: whoever opens it says it is no journal or key
    whys: list[str] = []
    fixes: list[str] = []
    quoted = shlex.quote(str(path))
    uid = os.geteuid()
    if st.st_uid != uid:
        whys.append(f"owned by uid {st.st_uid}, not by this process's uid {uid}")
        fixes.append(f"chown {uid} {quoted}")
    if st.st_mode & 0o077:
        whys.append(f"accessible by group or others (mode {stat.S_IMODE(st.st_mode):04o})")
        fixes.append(f"chmod 600 {quoted}")
    if not whys:
        return None
    return Exposure(Path(path), what, " and ".join(whys), " && ".join(fixes))


def journal_exposures(path: Path) -> list[Exposure]:
    """Those of a SQLite journal at ``path`` and its ``-wal`` and ``-shm`` files -- beside the
    file a link at ``path`` names, where SQLite keeps them (its unix VFS resolves links)."""
    real = os.path.realpath(path)
    found = (
        exposure(Path(f"{real if suffix else path}{suffix}"), what)
        for suffix, what in JOURNAL_FILES
    )
    return [e for e in found if e is not None]


_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def warn_exposed(exposures: Iterable[Exposure]) -> None:
    """One warning line on the operator's log for each exposure this process has not warned of
    yet (a journal is opened by many readers; the same words once are enough)."""
    for e in exposures:
        with _warned_lock:
            if (str(e.path), e.why) in _warned:
                continue
            _warned.add((str(e.path), e.why))
        log.warning("%s", e)
