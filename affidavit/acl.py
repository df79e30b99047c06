"""Who else a file's POSIX access ACL lets in: the mode bits alone say too little of such a file.

With an access ACL (``setfacl``, or systemd's ``LoadCredential=``: a root-owned ``0400`` file
plus ``user:<the service's uid>:r``) the group bits ``stat`` shows are the ACL's *mask*, the
most any named user, named group or the owning group gets -- not what the owning group gets.
So a credential systemd hands over looks ``0440`` (group-readable) though no group can read
it, and a ``0600`` file with ``user:1000:rw`` looks ``0660`` though no group can either:
judging the group bits, the first is a false refusal and the second the right one in the
wrong words.  ``grants`` reads the entries instead (``system.posix_acl_access``, the kernel's
binary form: a little-endian u32 version 2, then entries of u16 tag, u16 perm, u32 id) and
names each one that reaches further than a rule allows, with its effective (masked) access.
Default ACLs (``system.posix_acl_default``) only seed new files in a directory: the files
themselves are judged, not them.

A leaf (``os``, ``struct``), below ``journal.exposure`` and ``affidavit.privatefile``, which
both judge files by it.  No ACL (ENODATA), a file system without them (ENOTSUP) or a platform
without extended attributes: None, and the mode bits are the whole truth.
"""

from __future__ import annotations

import errno
import os
import shlex
import struct
from dataclasses import dataclass

__all__ = [
    "ACCESS",
    "Grant",
    "Unreadable",
    "access_entries",
    "grants",
    "read_may",
    "readable_groups",
    "readable_users",
    "setfacl",
]

ACCESS = "system.posix_acl_access"
"""The extended attribute holding a file's access ACL (Linux)."""
VERSION = 2
USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_HEADER = struct.Struct("<I")
_ENTRY = struct.Struct("<HHI")
_NO_ACL = {errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP}
_WORDS = {4: "read", 2: "write", 1: "execute"}


class Unreadable(ValueError):
    """The attribute is there but is no ACL this parser knows (another version, a torn size)."""


def access_entries(where: str | os.PathLike[str] | int) -> tuple[tuple[int, int, int], ...] | None:
    """The access ACL of the file at ``where`` (a path, followed if a link, or an open
    descriptor): its entries ``(tag, perm, id)``; None when it has none (or cannot have one).
    ``OSError`` when it cannot be read; ``Unreadable`` when it is malformed."""
    getxattr = getattr(os, "getxattr", None)
    if getxattr is None:
        return None  # no extended attributes here (macOS, the BSDs): the mode bits decide
    try:
        raw = getxattr(where, ACCESS)
    except OSError as exc:
        if exc.errno in _NO_ACL:
            return None
        raise
    if len(raw) < _HEADER.size or (len(raw) - _HEADER.size) % _ENTRY.size:
        raise Unreadable(f"an access ACL of {len(raw)} bytes")
    if _HEADER.unpack_from(raw)[0] != VERSION:
        raise Unreadable(f"an access ACL of version {_HEADER.unpack_from(raw)[0]}")
    return tuple(e for e in _ENTRY.iter_unpack(raw[_HEADER.size :]))


@dataclass(frozen=True)
class Grant:
    """One ACL entry reaching further than allowed: ``who`` (``user:1000``, ``group:50``,
    ``the owning group 50``), ``perm`` (its effective bits of ``rwx``: 4, 2, 1, those not
    allowed), and ``fix``: the ``setfacl`` argument that takes them away."""

    who: str
    perm: int
    fix: str

    def __str__(self) -> str:
        said = [word for bit, word in _WORDS.items() if self.perm & bit]
        return f"{self.who} can {' and '.join(said)}"


def _mask(entries: tuple[tuple[int, int, int], ...]) -> int:
    """The most a group-class entry gets (no mask entry: an ACL of the three base ones)."""
    return next((perm for tag, perm, _ in entries if tag == MASK), 7)


def _rwx(perm: int) -> str:
    return "".join(c if perm & bit else "-" for bit, c in zip((4, 2, 1), "rwx", strict=True))


def grants(
    entries: tuple[tuple[int, int, int], ...], gid: int, forbidden: int, uid: int
) -> list[Grant]:
    """Of ``entries`` (``access_entries``) of a file whose group is ``gid``, those of the group
    class -- named users other than ``uid`` and root, named groups, the owning group -- whose
    effective access (masked) holds any of ``forbidden`` (bits of ``rwx``), each with what it
    may not have.  ``other`` is left to the mode bits: its entry is them."""
    mask = _mask(entries)
    found: list[Grant] = []
    for tag, perm, who in entries:
        bad = perm & mask & forbidden
        if not bad or tag not in (USER, GROUP, GROUP_OBJ) or (tag == USER and who in (uid, 0)):
            continue
        kept = perm & ~forbidden
        spec, name = {
            USER: (f"u:{who}", f"user:{who}"),
            GROUP: (f"g:{who}", f"group:{who}"),
            GROUP_OBJ: ("g:", f"the owning group {gid}"),
        }[tag]
        fix = f"-x {spec}" if not kept and tag != GROUP_OBJ else f"-m {spec}:{_rwx(kept)}"
        found.append(Grant(name, bad, fix))
    return found


def setfacl(found: list[Grant], path: str) -> str:
    """One ``setfacl`` command per grant that takes its access away on ``path``."""
    quoted = shlex.quote(path)
    return " && ".join(f"setfacl {g.fix} {quoted}" for g in found)


def readable_groups(entries: tuple[tuple[int, int, int], ...], gid: int) -> list[tuple[int, bool]]:
    """The groups ``entries`` let read (masked): the owning group ``gid`` (False) and each
    named one (True)."""
    mask = _mask(entries)
    return [
        (gid, False) if tag == GROUP_OBJ else (who, True)
        for tag, perm, who in entries
        if tag in (GROUP_OBJ, GROUP) and perm & mask & 4
    ]


def readable_users(entries: tuple[tuple[int, int, int], ...]) -> list[int]:
    """The named users ``entries`` let read (masked)."""
    mask = _mask(entries)
    return [who for tag, perm, who in entries if tag == USER and perm & mask & 4]


def read_may(entries: tuple[tuple[int, int, int], ...], uid: int) -> bool:
    """Whether a named user entry lets ``uid`` read (masked): how systemd lets a service's user
    read the root-owned file ``LoadCredential=`` places."""
    mask = _mask(entries)
    return any(tag == USER and who == uid and perm & mask & 4 for tag, perm, who in entries)
