"""Files of the broker's that others may reach: a SQLite journal and its ``-wal``/``-shm``, its
writer lock and its long results' segment files and their directory, the key files, the vault --
and the config that names them all.

The broker creates each of its own files 0600 and the segment directory 0700 whatever the umask
(``sqlite_wal.create_private``, ``lock.py``, ``segments.py``, ``sealing.write_secret_file``, the
vault's own writes), but a file an earlier version created under the umask keeps its 0644, and
an operator may copy or restore one as another user.  Whoever can read the journal reads every
record (targets, paths, what was sent and received, sealed payloads' sizes); whoever can write
it, or a segment file, can delete what the chain then only proves missing -- the result is lost;
whoever can write the segment directory can swap its files, and whoever can list it sees every
long result's size grow, and when; whoever can open the lock file can hold it (flock needs no
write) and keep a daemon from starting; another owner can replace any of them.  So these are
the broker's alone (``PRIVATE``: no bit for group or others, this process's user the owner).

The config is the operator's, not the broker's: it names targets, credential references (never
a value: ``env:``/``file:``/``systemd:``/``vault:``) and the journal, so others reading it is
normal, and root owning it is the usual layout (``root:affidavit 0640``).  Whoever can *write*
it can point a target's credential at their own host, so group/others' write bits and an owner
other than this process's user or root are exposures (``CONFIG``); a PostgreSQL journal's URL
may carry its password, and then others' read bit is one too (``CONFIG_WITH_PASSWORD``).

The files that decide whom the broker trusts -- a target's CA bundle or ``known_hosts`` (any
field a protocol declares ``trust_anchor``), the auditor's public key the journal seals audit
copies to -- are public material, held to the config's rule (``TRUST_ANCHOR``): others may read
them, but whoever can write one (or owns it) can add their own CA or host key and receive the
credential, or have every audit copy of a payload and result sealed to their own key.

A ``file:`` or ``systemd:`` credential is the secret itself: the broker's alone, as its keys
(``CREDENTIAL``) -- or root's, lent to this user by an ACL entry, as systemd's
``LoadCredential=`` makes it (root ``0400`` plus ``user:<the service>:r``).
Whoever can write a directory on the path to any of these files can rename or replace the file
in it, whatever the file's own mode -- a swapped config points a credential at their host -- so
every directory a name on the way is looked up in, from ``/`` (as OpenSSH's StrictModes walks
to ``authorized_keys``; a directory above could be renamed away with everything under it) and
inside each link's target, wherever a link in the middle of the path leads (``walk``), is
held to ``DIRECTORY``: no write bit for group or others unless sticky (in ``/tmp`` only a
file's owner can rename it, and the file's own owner is checked), this user's or root's.  On a
file system mounted read-only as a whole no one writes: a write bit or another owner there is no
exposure (nor could a ``chmod`` mend it); a read bit still is -- and a credential's or key
file's every bit is, as its read refuses them (``CREDENTIAL``).  A read-only *bind* mount is
judged as any other: its source stays writable to whoever its modes let (``read_only``).

With a POSIX access ACL the group bits ``stat`` shows are the ACL's mask: then its entries are
judged instead (``affidavit.acl``) -- a named user other than this user and root, a named group,
the owning group, with effective access the rule forbids, each named (``user:1000 can read``)
with the ``setfacl`` that mends it.  Default ACLs are not judged (they only seed new files; the
files are judged), and an ACL that cannot be read leaves the mode bits to judge, the mask as the
group's: never less than before.  Only a file whose group bits are set is asked for its ACL
(with none set, no entry but the owner's and others' has access): one more ``getxattr`` for few.

Every process that opens the journal says so, once per file, on the operator's log (stderr
without one) -- naming the file and the command that fixes it, never refusing: a reader of the
journal needs no secret kept.  Run as root, a file another user owns is mended by running as
that user, not by a ``chown`` to root that would lock the daemon out -- that only if root is to
run the broker from now on; ``affidavit serve`` is that broker, and is told the ``chown`` alone
(``_owned_fix``).  A root one-off or embedded *writer* of such a journal is refused
(``lock.py``).  ``affidavit serve``, the boundary,
refuses to start instead (docs/deployment.md, "Files others can reach").
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shlex
import stat
import threading
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from affidavit.acl import (
    Grant,
    access_entries,
    grants,
    read_may,
    readable_groups,
    readable_users,
    setfacl,
)
from affidavit.privatefile import is_serving, root_copy, run_as_owner, serving

__all__ = [
    "CONFIG",
    "CONFIG_WITH_PASSWORD",
    "CREDENTIAL",
    "DIRECTORY",
    "PRIVATE",
    "PRIVATE_DIR",
    "TARGET_CREDENTIAL",
    "TRUST_ANCHOR",
    "Exposure",
    "Rule",
    "config_exposure",
    "directories_to",
    "directory_exposures",
    "exposure",
    "holds_password",
    "is_serving",
    "journal_exposures",
    "journal_files",
    "opened_exposures",
    "read_only",
    "serving",
    "summarised",
    "walk",
    "warn_exposed",
]

log = logging.getLogger("affidavit.journal")

JOURNAL_FILES = (("", "journal"), ("-wal", "journal WAL file"), ("-shm", "journal shm file"))
"""A SQLite journal's files: suffix, and what a message calls it."""


@dataclass(frozen=True)
class Rule:
    """What no one else may have on a file: ``bits``, the mode bits group and others may not
    have (``why`` says what they would be; those of them in ``read_bits``, ``read_why``), and
    its owner -- this process's user, or root too (``root_may_own``); ``directory``: it is one
    (else a regular file); ``sticky_may_write``: group and others may write it when it is
    sticky."""

    bits: int
    why: str
    root_may_own: bool = False
    directory: bool = False
    read_bits: int = 0
    read_why: str = ""
    sticky_may_write: bool = False
    root_may_lend: bool = False
    """Root may own it when its access ACL lets this process's user read it: how systemd's
    ``LoadCredential=`` hands a service its credential (``affidavit.acl.read_may``)."""
    as_read: bool = False
    """Judged as ``affidavit.privatefile`` reads it (``private``), which refuses any bit for
    group or others: a read-only mount excuses no write bit nor write-only ACL entry."""
    copied: bool = False
    """Another user's file root is to take a copy of, not ``chown`` (``privatefile.root_copy``:
    a target's credential, most often another service's)."""

    def words(self, found: int) -> str:
        """What the offending bits ``found`` (some of ``bits``) make the file."""
        said = [self.why] if found & ~self.read_bits else []
        if found & self.read_bits:
            said.append(self.read_why)
        return " and ".join(said)


PRIVATE = Rule(0o077, "accessible by group or others")
"""The broker's own files: its user's, no bit for anyone else."""
CREDENTIAL = Rule(0o077, "accessible by group or others", root_may_lend=True, as_read=True)
"""A credential (``file:``, ``systemd:``) and a key file (``[journal] key_file``,
``signing_key``: read under a credential's rule, ``sealing.read_secret_file``): as the broker's
own, or root's lent by an ACL entry naming this process's user (the file ``LoadCredential=``
places: ``root``, ``0400`` and ``user:<the service>:r``, shown ``0440``) -- and the vault's
unlock file, read so too.  Judged as read (``as_read``): on a read-only mount as elsewhere."""
TARGET_CREDENTIAL = replace(CREDENTIAL, copied=True)
"""A target's ``file:`` or ``systemd:`` credential: a key file's rule, but root is told to take
a copy of another user's, not to ``chown`` it -- it is most often another service's secret."""
PRIVATE_DIR = Rule(0o077, "accessible by group or others", directory=True)
"""The broker's own directory (the segments'): the same."""
CONFIG = Rule(0o022, "writable by group or others", root_may_own=True)
"""The config: others may read it (references, never a secret), not write it; root may own it."""
CONFIG_WITH_PASSWORD = Rule(
    0o026,
    "writable by group or others",
    root_may_own=True,
    read_bits=0o004,
    read_why="readable by others with the journal URL's password in it",
)
"""The config whose ``[journal] url`` holds a password: nor may others read it."""
TRUST_ANCHOR = CONFIG
"""A file that decides whom the broker trusts (a CA bundle, a ``known_hosts``, the auditor's
public key): public, so others may read it; not write it; root may own it (the system's CA
bundle)."""
DIRECTORY = Rule(
    0o022, "writable by group or others", root_may_own=True, directory=True, sticky_may_write=True
)
"""A directory on the path to one of them: no one else may rename what is in it (sticky: only
a file's owner may, and the files are checked); root may own it."""
_LINK = Rule(0, "", root_may_own=True)
"""A link on that path: its mode means nothing, its owner may replace it in a sticky directory."""
_WRITE = 0o022
_READ = 0o044


@dataclass(frozen=True)
class Exposure:
    """``path`` (a ``what``) others may reach: ``why``, and the shell command that mends it;
    ``holding``: for a directory, the files on whose path it is."""

    path: Path
    what: str
    why: str
    fix: str
    bits: int = 0
    """The mode bits found that the rule forbids (0: none)."""
    owner: int | None = None
    """The uid found owning it, when that is not allowed (None: the owner is fine)."""
    holding: str = ""
    granted: tuple[str, ...] = ()
    """Those an access ACL lets in that the rule does not (``user:1000``), if any."""

    def __str__(self) -> str:
        on = f" (on the path to the {self.holding})" if self.holding else ""
        return f"{self.what} {self.path}{on} is {self.why}: {self.fix}"


def exposure(path: Path, what: str, rule: Rule = PRIVATE) -> Exposure | None:
    """The exposure of the file or directory at ``path`` (its target, if a link) under
    ``rule``, or None: its owner and mode keep the rule -- or it is not there, is not of the
    rule's kind (a regular file, or a directory), or cannot be looked at (whoever opens it
    says why)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    if not (stat.S_ISDIR if rule.directory else stat.S_ISREG)(st.st_mode):
        return None  # a directory, a device...: whoever opens it says it is no journal or key
    return _judged(Path(path), what, rule, st)


def _judged(
    path: Path, what: str, rule: Rule, st: os.stat_result, holding: str = ""
) -> Exposure | None:
    """``path``'s exposure under ``rule``, ``st`` what ``stat`` (``lstat`` for a link: never
    on a read-only mount, then -- the mount is the target's) says of it.  With an access ACL
    the group bits are its mask: its entries are judged instead (``_acl``)."""
    uid = os.geteuid()
    mode = stat.S_IMODE(st.st_mode)
    link = stat.S_ISLNK(st.st_mode)
    bits = rule.bits & ~_WRITE if rule.sticky_may_write and mode & stat.S_ISVTX else rule.bits
    entries = None if link or not mode & 0o070 else _acl(path)
    foreign = st.st_uid != uid and not (
        st.st_uid == 0
        and (rule.root_may_own or (rule.root_may_lend and read_may(entries or (), uid)))
    )
    # (A file the broker reads as a secret is refused for a write bit wherever it is mounted:
    # start-up judges it as the read will.)
    if (foreign or mode & bits & _WRITE) and not link and not rule.as_read and read_only(path):
        bits &= ~_WRITE  # no one writes here; another owner could only read, if others may not
        foreign = foreign and bool(rule.bits & _READ)
    granted: list[Grant] = []
    if entries is not None:
        granted = grants(entries, st.st_gid, (bits >> 3) & 7, uid)
        bits &= ~0o070  # the mask: the entries above say who has what
    whys: list[str] = []
    fixes: list[str] = []
    quoted = shlex.quote(str(path))
    chown = ""
    if foreign:
        whys.append(
            f"owned by uid {st.st_uid}, not by this process's uid {uid}"
            + (" or root" if rule.root_may_own and uid != 0 else "")
            + (
                f" (or root's, lent by an access ACL entry user:{uid}:r)"
                if rule.root_may_lend and not rule.root_may_own and uid != 0
                else ""
            )
        )
        chown = (
            root_copy(path)
            if rule.copied and uid == 0 and not link
            else f"chown {'-h ' if link else ''}{uid} {quoted}"
        )
    if mode & bits:
        whys.append(f"{rule.words(mode & bits)} (mode {mode:04o})")
        fixes.append(f"chmod {mode & ~bits:03o} {quoted}")
    if granted:
        whys.append(f"reachable through its access ACL ({'; '.join(map(str, granted))})")
        fixes.append(setfacl(granted, str(path)))
    if not whys:
        return None
    if foreign and rule.copied and uid == 0 and not link and fixes:
        # Root copies another's credential (private, whatever the original's bits): a chmod or
        # setfacl of the original changes another service's file -- its owner's to make.
        fixes = []
        chown += "; who else may read the original is for its owner to mend"
    owner = st.st_uid if foreign else None
    fix = " && ".join(fixes) if owner is None else _owned_fix(chown, fixes, [owner])
    held = tuple(g.who for g in granted)
    return Exposure(path, what, " and ".join(whys), fix, mode & bits, owner, holding, held)


def _owned_fix(chown: str, commands: list[str], owners: list[int]) -> str:
    """The fix of a file (or files) ``owners`` own, not this process's user: ``chown`` (to this
    user), then ``commands`` (group and others' bits, ACL entries) -- unless this process is
    root and no daemon (``serving``).  Root (``sudo affidavit journal verify``, ``reclaim``,
    ``migrate`` on the daemon's journal) is told ``commands`` (the owner's daemon needs them
    too), and to run as the owner (``privatefile.run_as_owner``, most of them's) -- the
    ``chown`` to root only if root is to run the broker from now on: a file of the journal's
    root owns is one its owner, the daemon, cannot open."""
    if os.geteuid() != 0 or is_serving():
        return " && ".join([chown, *commands])
    most = max(set(owners), key=owners.count)
    advice = run_as_owner(most, chown)
    return f"{' && '.join(commands)}; and {advice}" if commands else advice


def _acl(path: Path) -> tuple[tuple[int, int, int], ...] | None:
    """``path``'s access ACL entries (``affidavit.acl``), or None: it has none -- or it cannot
    be read, and then the mode bits are judged as they show (the mask as the group's: never
    less than an ACL grants)."""
    try:
        return access_entries(path)
    except (OSError, ValueError):
        return None


MOUNTINFO = Path("/proc/self/mountinfo")
"""Where this process's mounts and their file systems' super block options are listed."""


def read_only(path: Path) -> bool:
    """Whether ``path`` is on a file system mounted read-only as a whole (a squashfs, a tmpfs
    remounted ``ro``, a container's read-only root), so that no mount of it anywhere writes.
    Not a read-only *bind* mount (``ProtectSystem=strict``, ``docker -v src:dst:ro``): that
    mount is read-only, its source is not -- whoever may write the source changes the file
    under the broker.  Linux: the super block's options in ``/proc/self/mountinfo``; elsewhere
    never (judged as any other file)."""
    try:
        if not os.statvfs(path).f_flag & os.ST_RDONLY:
            return False
        st = os.stat(path)
        device = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
        with open(MOUNTINFO, encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 2 and fields[2] == device and " - " in line:
                    super_options = line.rsplit(" - ", 1)[1].split()[2:3]
                    return bool(super_options) and "ro" in super_options[0].split(",")
    except (OSError, ValueError, IndexError):
        return False
    return False


def directories_to(*starts: Path) -> list[tuple[Path, os.stat_result]]:
    """The directories ``starts`` (absolute) and every one (or link) above each, nearest first,
    each once, with what ``lstat`` says of it (``OSError`` if one cannot be looked at)."""
    seen: dict[Path, os.stat_result] = {}
    for start in starts:
        for where in (start, *start.parents):
            if where not in seen:
                seen[where] = os.lstat(where)
    return list(seen.items())


_DIRECTORY_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC
"""How the walk holds a directory: ``O_PATH`` (search permission is all a lookup needs)."""
MAX_LINKS = 40
"""Links a walk follows before it gives up, as the kernel does (``ELOOP``)."""


_MAGIC_TARGET = re.compile(r"[a-z_]+:\[[0-9]+\]|anon_inode:.*")
"""What a ``/proc`` link names that is no path: ``pipe:[4026]``, ``socket:[77]``,
``anon_inode:[eventfd]``."""


class Unjudgeable(OSError):
    """A name the walk cannot follow by its text: a ``/proc/<pid>/fd/N`` link (``/dev/stdin``,
    ``<(...)``'s ``/dev/fd/63``) -- the kernel resolves it to the open file itself, which its
    text (a pipe, a socket, a deleted file) may not name -- or another ``/proc`` link to no
    path."""

    def __init__(self, text: str) -> None:
        said = "not a path this broker can judge: name the file itself"
        super().__init__(errno.EINVAL, said, text)


def _magic(where: list[str], target: str) -> bool:
    """Whether a link in the directory ``/<where>`` with ``target`` is a ``/proc`` magic link
    (``Unjudgeable``): any in a ``fd`` directory under ``/proc``, or one naming no path."""
    return where[:1] == ["proc"] and (where[-1] == "fd" or bool(_MAGIC_TARGET.fullmatch(target)))


def walk(
    path: Path, steps: list[tuple[Path, os.stat_result]], flags: int | None = None
) -> tuple[int, Path]:
    """Resolve ``path`` as the kernel does, one name at a time from ``/`` (a relative one from
    the working directory), each directory held open (``openat``, ``O_NOFOLLOW``), appending
    to ``steps`` every directory a name is looked up in, with the ``fstat`` of the very
    directory looked in -- inside each link's target too, wherever a link in the middle of the
    path or of another link leads -- and every link followed in a sticky directory, with its
    ``lstat``: there its owner may replace it; in any other only the directory's writers may,
    and the directory is judged.  With ``flags``, the final name is opened (``O_NOFOLLOW``
    added: its links were followed here) from the directory judged, and its descriptor
    returned (the caller's to close); without, nothing is opened (-1) -- each with where the
    final name is, every link resolved.  Raises
    ``OSError`` where the walk cannot go on (``FileNotFoundError``: a name is missing), what it
    judged so far already in ``steps``; ``Unjudgeable`` at a ``/proc`` link that names no path
    to judge; ``NotADirectoryError`` for a final name that is no directory, with a ``/`` (or
    ``/.``) after it, as the kernel answers."""
    text = os.fspath(path)
    if not text.startswith("/"):
        text = os.path.join(os.getcwd(), text)
    names = text.split("/")[::-1]  # a stack: the next name to look up is the last
    fd = os.open("/", _DIRECTORY_FLAGS)
    where: list[str] = []
    links = 0
    try:
        held = os.fstat(fd)  # the directory ``fd`` holds: a link's lstat is not its stickiness
        steps.append((Path("/"), held))
        while names:
            name = names.pop()
            last = all(n in ("", ".") for n in names)
            if name in ("", "."):
                continue
            if name != "..":
                st = os.lstat(name, dir_fd=fd)
                if stat.S_ISLNK(st.st_mode):
                    links += 1
                    if links > MAX_LINKS:
                        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), text)
                    if held.st_mode & stat.S_ISVTX:
                        steps.append((Path("/", *where, name), st))
                    target = os.readlink(name, dir_fd=fd)
                    if _magic(where, target):
                        raise Unjudgeable(text)
                    names.extend(target.split("/")[::-1])
                    if target.startswith("/"):
                        root = os.open("/", _DIRECTORY_FLAGS)  # before the close: ``fd`` is
                        os.close(fd)  # closed once, whatever fails
                        fd = root
                        where = []
                        held = os.fstat(fd)
                        steps.append((Path("/"), held))
                    continue
            if last and names and name != ".." and not stat.S_ISDIR(st.st_mode):
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), text)
            if last:
                final = Path("/", *where, name) if name != ".." else Path("/", *where[:-1])
                if flags is None:
                    return -1, final
                return os.open(name, flags | os.O_NOFOLLOW, dir_fd=fd), final
            inner = os.open(name, _DIRECTORY_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = inner
            if name == "..":
                del where[-1:]
            else:
                where.append(name)
            held = os.fstat(fd)
            steps.append((Path("/", *where), held))
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), text)
    finally:
        os.close(fd)


def _step_exposures(steps: Iterable[tuple[Path, os.stat_result, str]]) -> list[Exposure]:
    """Those of ``walk``'s steps (each with the file, a ``what``, on whose path it is): each
    directory held to ``DIRECTORY``, each link to its owner (``_LINK``), once, naming every
    file it is on the path to."""
    seen: dict[Path, tuple[os.stat_result, list[str]]] = {}
    for where, st, what in steps:
        held = seen.setdefault(where, (st, []))[1]
        if what not in held:
            held.append(what)
    found = (
        _judged(
            where,
            "link" if stat.S_ISLNK(st.st_mode) else "directory",
            _LINK if stat.S_ISLNK(st.st_mode) else DIRECTORY,
            st,
            held[0] if len(held) == 1 else f"{', the '.join(held[:-1])} and the {held[-1]}",
        )
        for where, (st, held) in seen.items()
    )
    return [e for e in found if e is not None]


def directory_exposures(files: Iterable[tuple[Path, str]]) -> list[Exposure]:
    """Those of the directories on the path to each file (a ``what``) of ``files``: every one a
    name is looked up in on the way to it (``walk``: from ``/``, through each link's target),
    held to ``DIRECTORY``, and each link followed in a sticky directory (``_LINK``: only its
    owner).  A path that cannot be walked further is left to whoever opens the file (it says
    why); a missing file's directory is still looked at (whoever can write it can put the
    file there first)."""
    steps: list[tuple[Path, os.stat_result, str]] = []
    for path, what in files:
        walked: list[tuple[Path, os.stat_result]] = []
        with contextlib.suppress(OSError, ValueError):
            walk(Path(path), walked)
        steps += ((where, st, what) for where, st in reversed(walked))  # nearest first
    return _step_exposures(steps)


def opened_exposures(
    path: Path, what: str, rule: Rule, flags: int
) -> tuple[int | None, list[Exposure]]:
    """Open the file at ``path`` (``walk``, with ``flags``) and judge what was opened: the
    file's owner and mode by ``fstat`` of the descriptor (under ``rule``, named by where it
    resolved to, when a regular file: whoever reads it refuses any other), then every directory
    and link on the way (``directory_exposures``' rule).  The descriptor (the caller's to
    close; None: no file there) and the exposures: the file judged is the file read from it --
    nothing can be swapped between a check and an open.  ``OSError`` when it cannot be opened
    for another reason than a missing name."""
    steps: list[tuple[Path, os.stat_result]] = []
    fd: int | None = None
    with contextlib.suppress(FileNotFoundError):
        fd, real = walk(Path(path), steps, flags)
    found: list[Exposure | None] = []
    if fd is not None:
        try:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode):
                found.append(_judged(real, what, rule, st))
        except BaseException:
            os.close(fd)
            raise
    return fd, [e for e in found if e is not None] + _step_exposures(
        (where, st, what) for where, st in reversed(steps)
    )


def config_exposure(
    path: Path,
    journal_url: str | None,
    agent_gids: Iterable[int] = (),
) -> Exposure | None:
    """That of the config file at ``path`` (``CONFIG``; ``CONFIG_WITH_PASSWORD`` when its
    ``journal_url`` holds a password -- and then its group may read it only if that group is
    none of ``agent_gids``, the groups the daemon's socket admits: a password every agent can
    read lets them write the journal; no user an access ACL names may, but the daemon's and
    root)."""
    if journal_url is None or not holds_password(journal_url):
        return exposure(path, "config file", CONFIG)
    found = exposure(path, "config file", CONFIG_WITH_PASSWORD)
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return found
    if not (stat.S_ISREG(st.st_mode) and st.st_mode & 0o040):
        return found
    entries = _acl(Path(path))  # with one, the group bits are its mask: who reads is in it
    admitted = set(agent_gids)
    groups = [(st.st_gid, False)] if entries is None else readable_groups(entries, st.st_gid)
    readers = [
        (
            f"group {g}, which the daemon's socket admits",
            f"setfacl -x g:{g}" if named else "chgrp <the daemon's group>",
        )
        for g, named in groups
        if g in admitted
    ]
    # A user an entry names could be an agent the socket admits by a group its account does
    # not list (a unit's SupplementaryGroups=, sg, a container): each is named, whoever it is.
    readers += [
        (f"user {u} (an access ACL entry)", f"setfacl -x u:{u}")
        for u in readable_users(entries or ())
        if u not in (os.geteuid(), 0)
    ]
    if not readers:
        return found
    listed = "; ".join(who for who, _ in readers)
    why = f"readable by {listed}, with the password in it"
    fix = " && ".join(f"{command} {shlex.quote(str(path))}" for _, command in readers)
    if found is None:
        return Exposure(Path(path), "config file", why, fix)
    return Exposure(Path(path), "config file", f"{found.why} and {why}", f"{found.fix} && {fix}")


def holds_password(url: str) -> bool:
    """Whether a PostgreSQL journal URL or conninfo carries a password: libpq's reading of it
    (``postgres.url_password``); without psycopg installed (the journal cannot be opened then,
    and says so), any sign of one -- a user part with a password, or the word at all."""
    try:
        from .postgres import url_password  # (psycopg: only for a PostgreSQL journal)
    except ImportError:
        from .backend import split_url

        try:
            has = split_url(url).password is not None
        except ValueError:
            has = False
        return has or "password" in url.lower()
    return url_password(url) is not None


def journal_files(path: Path) -> list[tuple[Path, str, Rule]]:
    """The files a SQLite journal at ``path`` is, but for its key files (configured apart) and
    the segment files in its results directory: the journal and its ``-wal`` and ``-shm`` --
    beside the file a link at ``path`` names, where SQLite keeps them (its unix VFS resolves
    links) -- and the files the broker keeps beside that file too (``names.py``): its writer
    lock ``<path>.lock`` (``lock.lock_path``), the console's login tokens' directory
    ``<path>.console-tokens`` (``console.auth.token_dir``, which holds it to this rule too:
    the daemon's user's, 0700) and its long results' directory ``<path>.results``
    (``segments.py``), last; each with what a
    message calls it and the rule it is held to.  The one list: the exposure checks and a root
    writer's refusal (``lock.py``) name these."""
    real = os.path.realpath(path)
    files = [
        (Path(f"{real if suffix else path}{suffix}"), what, PRIVATE)
        for suffix, what in JOURNAL_FILES
    ]
    files.append((Path(f"{real}.lock"), "journal lock file", PRIVATE))
    files.append((Path(f"{real}.console-tokens"), "console token directory", PRIVATE_DIR))
    files.append((Path(f"{real}.results"), "result segment directory", PRIVATE_DIR))
    return files


def journal_exposures(path: Path, *, segments: bool = False) -> list[Exposure]:
    """Those of the files of a SQLite journal at ``path`` (``journal_files``) and of the
    segment files in its results directory.  The segment files are listed and looked at when
    the directory is exposed, else only if ``segments`` (a broker's start, ``exposed_files``):
    in a directory that is this user's alone no one else reaches them, and every reader of the
    journal (the daemon's view pool, each CLI view) would list and stat them all at its first
    connect."""
    from .segment_tables import is_segment_name  # (it imports tables, which import this)

    *files, (results, what, rule) = journal_files(path)
    found = [exposure(file, said, judged) for file, said, judged in files]
    directory = exposure(results, what, rule)
    found.append(directory)
    names: list[str] = []
    if segments or directory is not None:
        with contextlib.suppress(OSError):  # none yet, not a directory, or gone meanwhile
            names = sorted(n for n in os.listdir(results) if is_segment_name(n))
    found += (exposure(results / name, SEGMENT_FILE) for name in names)
    return [e for e in found if e is not None]


SEGMENT_FILE = "result segment file"
"""What an exposure names a segment file (``journal_exposures``)."""
EXAMPLES = 3
"""Exposed segment files of one directory a summary names (``summarised``): past that many, one
entry stands for them all."""


def summarised(exposures: Iterable[Exposure]) -> list[str]:
    """``exposures`` as a refusal lists them, one entry each -- except the segment files of a
    results directory, once more than ``EXAMPLES`` of them: a ``chmod -R`` on a directory of
    thousands would make a line of thousands of entries.  Those are one entry: the directory,
    how many, a few by name, and one command that mends them all (``find``, as many files as
    there are; each file's own command is what it runs on it: ``chown`` to this process's uid
    first, then group and others' bits cleared -- the rule of the broker's own files)."""
    return [words for _key, words in _entries(exposures)]


def _entries(exposures: Iterable[Exposure]) -> list[tuple[tuple[str, str], str]]:
    """``summarised``'s entries, each with what it is about: ``(path, why)`` of a file, or
    ``(directory, SEGMENT_FILE and the reasons)`` of the summary of its segment files (other
    reasons found later -- another owner, an ACL, other bits, or fewer of them after a partial
    fix -- are another entry, said again)."""
    exposures = list(exposures)
    segments: dict[Path, list[Exposure]] = {}
    for e in exposures:
        if e.what == SEGMENT_FILE:
            segments.setdefault(e.path.parent, []).append(e)
    many = {d: found for d, found in segments.items() if len(found) > EXAMPLES}
    said: list[tuple[tuple[str, str], str]] = []
    for e in exposures:
        directory = e.path.parent if e.what == SEGMENT_FILE else None
        if directory not in many:
            said.append(((str(e.path), e.why), str(e)))
        elif e is many[directory][0]:
            found = many[directory]
            bits = 0
            for f in found:
                bits |= f.bits
            owned, granted = any(f.owner is not None for f in found), any(f.granted for f in found)
            key = (str(directory), f"{SEGMENT_FILE} owned={owned} bits={bits:o} acl={granted}")
            said.append((key, _summary(directory, found)))
    return said


def _summary(directory: Path, found: list[Exposure]) -> str:
    """One entry for the exposed segment files ``found`` in ``directory``."""
    uid = os.geteuid()
    # ``directory/``: find descends into a results directory that is a link, too.
    find = f"find {shlex.quote(str(directory) + '/')} -maxdepth 1 -type f -name '*.seg'"
    whys: list[str] = []
    fixes: list[str] = []
    owners = [e.owner for e in found if e.owner is not None]
    if owners:
        whys.append(f"owned by another uid than this process's uid {uid}")
    bits = 0
    for e in found:
        bits |= e.bits
    if bits:
        whys.append(f"accessible by group or others (bits {bits:03o} among them)")
        fixes.append(f"{find} -perm /077 -exec chmod go= {{}} +")
    if any(e.granted for e in found):
        whys.append("reachable through their access ACLs")
        fixes.append(f"{find} -exec setfacl -b {{}} +")
    names = ", ".join(e.path.name for e in found[:EXAMPLES])
    chown = f"{find} ! -user {uid} -exec chown {uid} {{}} +"
    fix = _owned_fix(chown, fixes, owners) if owners else " && ".join(fixes)
    said = " or ".join(whys)
    return f"{len(found)} result segment files in {directory} are {said} (e.g. {names}): {fix}"


_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def warn_exposed(exposures: Iterable[Exposure]) -> None:
    """One warning line on the operator's log for each exposure this process has not warned of
    yet (a journal is opened by many readers; the same words once are enough) -- the entries
    of a refusal (``summarised``): a results directory's many exposed segment files are one
    line, once, where each had its own (10k segment files, 10k lines at every start)."""
    for key, words in _entries(exposures):
        with _warned_lock:
            if key in _warned:
                continue
            _warned.add(key)
        log.warning("%s", words)
