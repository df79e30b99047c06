"""A file's identity as a stat sees it, and when that stat vouches for the bytes read: one rule
for every file the broker re-reads when it moves -- the config (affidavit/engine/snapshot.py)
and the files a target trusts (its ``account_hash`` there, a CA file in adapters/http/trust.py).
"""

from __future__ import annotations

import os

__all__ = ["SETTLED_NS", "identity", "stat_key"]

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
