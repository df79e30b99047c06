"""A file's identity as a stat sees it, when that stat vouches for the bytes read, and how such a
file is read: one rule for every file the broker re-reads when it moves -- the config
(affidavit/engine/snapshot.py) and the files a target trusts (its ``account_hash`` there, a CA
file in adapters/http/trust.py).
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["MAX_TRUST_FILE", "SETTLED_NS", "identity", "read_regular", "stat_key"]

MAX_TRUST_FILE = 16 << 20
"""A file a target trusts (a CA bundle) larger than this is refused (the system's is about
200 KiB): its read is bounded, never a multi-GB file read whole."""

SETTLED_NS = 2_000_000_000
"""How long before a read the file's ctime must lie for its stat to vouch for the bytes read.

The stat a reader keys on is ``stat_key``: device and inode (a rename over the file, or a
replacement, is another inode), ctime (which no user-space call sets back: ``cp -p``, ``rsync
-t`` and ``touch -r`` restore the mtime, not the ctime), mtime and size.  Even that misses one
case: a timestamp is taken from a clock that may tick only every few milliseconds (Linux's
coarse clock, one jiffy, before multigrain timestamps; a network file system's server clock),
so a same-size write in place in the tick of the read leaves every field as the read saw it,
and the broker would keep the content of a half-done edit for good.  As git does with a
"racily clean" index entry, a read is trusted only once the file's ctime lies this far before
it: until then every use reads the file again (the config snapshot: a read and a digest, no
parse unless the bytes moved) -- for at most this long after an edit.  2 s covers any local
tick, FAT's 2 s mtime and a server clock some way off ours; a server clock behind ours by more
than that can still make a fresh stat look settled."""


def stat_key(path: str | os.PathLike[str]) -> tuple[int, ...] | None:
    """``identity`` of the file at ``path`` (None: no such file, or no stat)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return identity(st)


def identity(st: os.stat_result) -> tuple[int, ...]:
    """Device, inode, ctime, mtime and size."""
    return (st.st_dev, st.st_ino, st.st_ctime_ns, st.st_mtime_ns, st.st_size)


def read_regular(
    path: str | os.PathLike[str], limit: int = MAX_TRUST_FILE
) -> tuple[bytes, os.stat_result]:
    """The bytes of the regular file at ``path`` and its ``fstat``, at most ``limit`` of them.

    Never blocks on what is not a regular file: opened ``O_NONBLOCK`` (a FIFO put in the
    file's place opens at once instead of waiting for a writer) and refused by the stat of the
    descriptor read, not of the path, so a swap between the two cannot slip one in.  Raises
    ``OSError``: missing, unreadable, not a regular file (EINVAL), larger than ``limit``
    (EFBIG, also when it grew past it while read)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        if st.st_size > limit:
            raise OSError(errno.EFBIG, "file too large")
        chunks = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise OSError(errno.EFBIG, "file too large")
        return b"".join(chunks), st
    finally:
        os.close(fd)
