"""Reading a small secret file without ever blocking or exhausting the broker.

A credential (``file:PATH``) and the vault's files are read inside the event loop, before a
call's record can finish.  A plain ``open()``/``read()`` there is a denial of service: a FIFO
blocks ``open`` until something writes to it (the whole daemon freezes, SIGTERM included), and
``/dev/zero`` or a huge file reads until memory runs out.  So:

* ``O_NONBLOCK``: opening a FIFO returns at once (then refused below) instead of waiting for a
  writer; on a regular file the flag has no effect.  ``O_NOCTTY``: naming a terminal never makes
  it the broker's controlling terminal.
* ``fstat`` on the opened descriptor (no check-then-open race): only a regular file is read.
* ``private``: this user's (or root's) and no one else's -- no group or other permission bits,
  and with an access ACL no entry but this user's (and root's) reaching it (``affidavit.acl``).
  One rule for a credential, the vault's unlock key and the journal's key files
  (``journal.sealing.read_secret_file``: ``key_file``, ``signing_key``, the auditor's private
  key), which all read through here (``FileExposed``) -- and that the start judges them by
  (``journal.exposure.CREDENTIAL``).  Run as root, another user's file is refused too, with
  the advice to run as its owner: a ``chown`` to root would lock that user (the daemon's) out
  -- unless this is root's daemon (``serving``), the broker root runs: the ``chown`` alone.
* at most ``limit`` bytes: the size is checked before reading and the read itself stops one byte
  past the limit (a file may grow, and ``/proc`` files report size 0).

A leaf below ``affidavit.secrets`` (credentials, the vault) and ``journal.sealing`` (the key
files), which read every secret file through it: the journal may import it, not the secrets.

Symlinks are followed, as for ``[journal] key_file`` and ``signing_key`` (a mounted secret is
often a symlink); the file the link names is what is checked.  Every message names the path and
what is wrong with it, never a byte of the contents.

Writing one is ``write_private_file``: the vault's files and the journal's key files alike;
``remove_leftovers`` removes the temp files a crash left of one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shlex
import stat
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from affidavit.acl import ACCESS, access_entries, grants, read_may, setfacl

__all__ = [
    "OPEN_FLAGS",
    "FileExposed",
    "FileMissing",
    "FileRefused",
    "OwnerNotKept",
    "is_serving",
    "other_names",
    "read_small_file",
    "remove_leftovers",
    "root_copy",
    "run_as_owner",
    "serving",
    "write_private_file",
]

OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)


_serving: ContextVar[bool] = ContextVar("serving", default=False)
"""Whether the broker's daemon is judging its files (``serving``)."""


@contextlib.contextmanager
def serving() -> Iterator[None]:
    """While in it, the files are judged for the broker's daemon (``affidavit serve``, from its
    start to its end): a file another user owns is mended by a ``chown`` to this process's
    user, root too -- root running the broker will own every file it makes from then on, and
    the file's owner is no daemon to be locked out (``journal.exposure._owned_fix``, a key
    file's or credential's refusal here, ``journal.lock``).  Here, below the journal, as every
    secret file's read asks it."""
    token = _serving.set(True)
    try:
        yield
    finally:
        _serving.reset(token)


def is_serving() -> bool:
    """Whether this context is the broker's daemon judging its files (``serving``)."""
    return _serving.get()


def run_as_owner(uid: int, chown: str | None = None) -> str:
    """What a root process is told of a file user ``uid`` owns (the daemon's, most often: ``sudo
    affidavit journal ...`` on its journal or keys): to run as that user (in a container: as
    its uid), not to ``chown`` the file to root -- which would lock its owner, the daemon, out
    -- or, if root is to run the broker from now on, ``chown`` (the command giving root the
    file, if any).  The one wording: the key files' and credentials' refusals
    (``_refuse_shared``), the journal's warnings (``journal.exposure``) and a root writer's
    refusal (``journal.lock``) say it so."""
    said = (
        f"run this as its owner, not as root (sudo -u '#{uid}' affidavit ...; in a container: "
        f"--user {uid}): a chown to root would lock its owner out"
    )
    return f"{said}; or, if root is to run the broker from now on: {chown}" if chown else said


def theirs_for_root(*paths: Path) -> tuple[Path, int] | None:
    """When this process is root: the first of ``paths`` there that another uid owns
    (``os.stat``: the file a link names), with that uid -- a root writer beside it would make
    files of root's, ``0600``, that their owner (the daemon's user, most often) cannot open.
    None when this process is not root, or none of them is another's (one not there, or that
    cannot be looked at, is passed over: whoever opens it says why).  The one rule of a root
    one-off writer on another user's files: the journal's (``journal.lock``) and the vault's
    (``secrets.vault``), each telling ``run_as_owner``."""
    if os.geteuid() != 0:
        return None
    for path in paths:
        try:
            uid = os.stat(path).st_uid
        except (OSError, ValueError):
            continue
        if uid != 0:
            return Path(path), uid
    return None


def root_copy(path: Path) -> str:
    """What root is told of a target's credential another user owns, for root to run the
    broker with: a copy of its own -- the file is most often another service's secret, which a
    ``chown`` to root would lock that service out of.  The copy's place is suggested from the
    file's name (``/etc/affidavit/<name>``: a directory only root writes); the command apart
    from the prose, to paste as it is.  The journal's own key files are the broker's: their
    owner's ``chown`` stays (``run_as_owner``).  The one wording: a credential's read
    (``read_small_file``, ``credential``) and the start's check (``journal.exposure``)."""
    src = shlex.quote(os.path.abspath(path))
    dst = f"/etc/affidavit/{Path(path).name}"
    return (
        "give root a copy of its own, a new file in a directory only root writes "
        f"(`install -D -o 0 -m 600 -- {src} {shlex.quote(dst)}`, or another such place), then "
        f"point the target's credential at file:{dst}; the copy must be made again whenever "
        "its owner rotates the original. A chown of the original would lock out its owner"
    )


class FileRefused(Exception):
    """The file exists but must not be read; ``str()`` says why (never its contents).
    ``public``: the same without the file's path (for a caller who must not learn it).
    ``errno``: the ``OSError``'s when opening, reading or closing it failed -- some (no
    descriptor left, an I/O error) say nothing of what the path holds, others do (a socket
    there: ENXIO, a symlink loop: ELOOP, a permission: EACCES); the caller judges which
    (``config.loader.TRANSIENT_READ_ERRNOS``); None when this module refused what the path
    holds (not a regular file, too large)."""

    def __init__(
        self, message: str, public: str | None = None, *, errno: int | None = None
    ) -> None:
        super().__init__(message)
        self.public = message if public is None else public
        self.errno = errno


class FileMissing(FileRefused):
    """There is no file at the path."""


class FileExposed(FileRefused):
    """A ``private`` file someone else may reach, or another user owns: the words say who and
    how, and the command that mends it (``str()``), naming the file as the caller's
    ``subject``."""


def _what(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _size(n: int) -> str:
    return f"{n // 1024} KiB" if n % 1024 == 0 else f"{n} bytes"


def _refuse_shared(
    fd: int, st: os.stat_result, path: Path, subject: str = "file", credential: bool = False
) -> None:
    """``FileExposed`` (its words about ``subject``) if another user than this process's and
    root owns the open file ``fd`` at ``path`` (its owner can rewrite the secret, and grant
    itself any access), or group or others may access it: by its mode bits -- or, with an
    access ACL, whose mask the group bits are, by its entries (a named user other than this
    process's and root, a named group, the owning group: systemd's ``LoadCredential=`` file,
    root's ``0400`` plus ``user:<the service>:r``, is private).  Another user's file read as
    root is refused saying to run as its owner, not to ``chown`` it to root (the daemon's
    user could not read it then).  The caller's words (``FileRefused.public``) name no uid,
    gid nor path; the operator's (``str()``) name them and the command that mends it --
    for root and a target's ``credential``, a copy of root's own (``root_copy``)."""
    euid = os.geteuid()
    if st.st_uid not in (euid, 0):
        said = "file is owned by another user, who can rewrite it"
        quoted = shlex.quote(str(path))
        root_fix = root_copy(path) if credential else f"chown 0 {quoted}"
        if euid == 0 and not is_serving():
            # Root running a command on the daemon's files (``sudo affidavit journal ...``): a
            # chown to root would lock their owner, the daemon's user, out of them -- unless
            # root is to run the broker from now on.  Root's daemon is that broker: the chown.
            raise FileExposed(
                f"{subject} is owned by uid {st.st_uid}, who can rewrite it, and this process "
                f"runs as root; {run_as_owner(st.st_uid, root_fix)}",
                f"{said}; run the broker as its owner, not as root",
            )
        if euid == 0:  # root's daemon (``serving``): it must own the file from now on
            raise FileExposed(
                f"{subject} is owned by uid {st.st_uid}, who can rewrite it, and the broker "
                f"runs as root: root must own it: {root_fix}",
                f"{said}; the broker's user must own it",
            )
        raise FileExposed(
            f"{subject} is owned by uid {st.st_uid}, not by this process's user (uid {euid}) "
            f"or root, who can rewrite it; this process's user must own it (or root lend it): "
            f"chown {euid} {quoted}",
            f"{said}; the broker's user must own it (or root lend it)",
        )
    mode = stat.S_IMODE(st.st_mode)
    entries = None
    if mode & 0o070 and not mode & 0o007:
        with contextlib.suppress(OSError, ValueError):  # unreadable: the mode bits decide
            entries = access_entries(fd)
        # Root's file is judged by its ACL only when lent to this user by an entry (systemd's);
        # otherwise the group bits show who reads it, as they say.
        if entries is not None and st.st_uid != euid and not read_may(entries, euid):
            entries = None
    if entries is None and mode & 0o077:
        said = f"is accessible by group or others (mode {mode:04o})"
        quoted = shlex.quote(str(path))
        # Root's file the broker reads through its group: chmod 600 alone would lock it out.
        fix = (
            f"chmod 600 {quoted}"
            if st.st_uid == euid
            else f"chown {euid} {quoted} && chmod 600 {quoted}"
        )
        raise FileExposed(
            f"{subject} {said}; it must be 0600: {fix}", f"file {said}; it must be 0600"
        )
    found = grants(entries, st.st_gid, 7, euid) if entries is not None else []
    if found:
        said = f"is reachable through its access ACL ({'; '.join(map(str, found))})"
        fix = setfacl(found, str(path))
        # The caller's words name no uid nor gid of the entries'.
        raise FileExposed(
            f"{subject} {said}; only this process's user may read it: {fix}",
            "file is reachable through its access ACL by another user or group; only the "
            "broker's user may read it",
        )


def refuse_shared_fd(fd: int, path: Path, subject: str) -> None:
    """``FileRefused`` unless the open ``fd`` (at ``path``) is a regular file only this
    process's user (or root) owns and may reach -- a secret's rule (``_refuse_shared``: mode
    bits, ACL entries, owner), for a file opened to be used, not read: the vault's lock, which
    whoever else can open can hold (flock needs no write)."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise FileRefused(f"{subject} is {_what(st.st_mode)}", f"file is {_what(st.st_mode)}")
    _refuse_shared(fd, st, path, subject)


def read_small_file(
    path: Path,
    limit: int,
    *,
    private: bool = False,
    subject: str = "file",
    credential: bool = False,
    opener: Callable[[Path], int] | None = None,
) -> tuple[bytes, os.stat_result]:
    """The contents of the regular file at ``path`` (at most ``limit`` bytes) and its ``fstat``.
    ``FileMissing`` if absent, ``FileRefused`` (a reason) otherwise.  ``private``: refuse a file
    anyone but this user (or root) may read, or another user owns (``FileExposed``, its words
    about ``subject``), as ``[journal] key_file`` and ``signing_key`` are refused
    (``journal.sealing.read_secret_file``): a secret others can read is already disclosed.
    ``opener``: opens ``path`` read-only and ``O_NONBLOCK`` (``OPEN_FLAGS``) instead, for a
    caller that judges the very file it opens (``api.trusted``: the config's bytes parsed are
    those of the file judged); its ``OSError`` is this one's, anything else its own."""
    try:
        fd = opener(path) if opener is not None else os.open(path, OPEN_FLAGS)
    except FileNotFoundError:
        raise FileMissing("file not found") from None
    except OSError as exc:
        raise FileRefused(f"cannot open file ({exc.strerror})", errno=exc.errno) from None
    try:
        read = _read_open(fd, path, limit, private, subject, credential)
    except BaseException:
        with contextlib.suppress(OSError):  # the refusal in flight says more
            os.close(fd)
        raise
    try:
        os.close(fd)
    except OSError as exc:  # EIO on a network file system: the read proves nothing
        raise FileRefused(f"cannot close file ({exc.strerror})", errno=exc.errno) from None
    return read


def _read_open(
    fd: int, path: Path, limit: int, private: bool, subject: str, credential: bool
) -> tuple[bytes, os.stat_result]:
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(f"is {_what(st.st_mode)}, not a regular file")
        if private:
            _refuse_shared(fd, st, path, subject, credential)
        too_large = FileRefused(f"file is larger than the {_size(limit)} limit")
        if st.st_size > limit:
            raise too_large
        chunks: list[bytes] = []
        got = 0
        while got <= limit:
            chunk = os.read(fd, limit + 1 - got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > limit:
            raise too_large
        return b"".join(chunks), st
    except OSError as exc:
        raise FileRefused(f"cannot read file ({exc.strerror})", errno=exc.errno) from None


FileId = tuple[int, int]
"""A file's (``st_dev``, ``st_ino``): which file a name led to."""


def write_private_file(
    path: Path,
    data: bytes,
    *,
    replace: bool = True,
    mode: int = 0o600,
    keep: bool = False,
) -> FileId:
    """Write ``data`` to ``path``, written and fsynced before it has the name, then put in
    place: renamed over ``path`` (``replace``) or linked to it, never replacing one
    (``FileExistsError``: a key is never clobbered), and the directory fsynced -- so a crash
    leaves the old file or the whole new one, never a torn or short one, and a name the
    journal records survives with it.  The secret never sits in a wider-mode file; ``mode``
    (a public key's 0644) is set whatever the umask, before the file has a byte.  ``keep``
    (``init --force``): a regular file ``path`` names is replaced in kind (``_kept``) --
    ``OwnerNotKept``, before anything is written, when this process cannot give the new file
    that file's owner and group (never a file quietly become this user's).

    Where the platform allows (Linux ``O_TMPFILE``, linked in through ``/proc/self/fd``), the
    file has no name until it is whole: a process killed mid-write (SIGKILL at its fsync) leaves
    nothing behind -- the temp file of an interrupted ``vault unlock`` held the derived vault
    key, and copied into place it opened the vault without the passphrase.  ``replace`` still
    takes a temp name for the instant between the link and the rename (no call replaces a name
    with an unnamed file).  Elsewhere (no ``O_TMPFILE``, or the file system refuses it) a named
    0600 temp file beside it, as before, removed when the write fails; a crash can leave it,
    which ``remove_leftovers`` (run by the vault's lock, unlock and open and by key creation)
    removes.  Answers the written file's ``FileId`` (``unlink_if_made``)."""
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        kept = _kept(path) if keep else None
        if kept is not None and kept.owner is not None and not _may_give(dfd, *kept.owner):
            raise OwnerNotKept(path, *kept.owner)
        kept = kept or _Kept(mode, None, None)
        made = _write_unnamed(dfd, path.name, data, replace, kept)
        if made is None:
            made = _write_named(dfd, path.name, data, replace, kept)
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return made


def unlink_if_made(path: Path, made: FileId) -> bool:
    """Remove ``path`` only while it still names the file ``write_private_file`` answered
    ``made`` for (``replace=False``: created exclusively there, never one that was already
    there): a file another process put at the name since -- a key path shared with another
    journal -- is left.  False: nothing removed (another file there, or none)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if (st.st_dev, st.st_ino) != made:
        return False
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


_UNSUPPORTED = frozenset({errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT})
"""What ``open(O_TMPFILE)`` or its link through ``/proc`` answers where the kernel, the file
system or the mount (no ``/proc``) does not support it: the named temp file is used instead."""


def _write_unnamed(dfd: int, name: str, data: bytes, replace: bool, kept: _Kept) -> FileId | None:
    """``write_private_file`` through an unnamed file in the directory ``dfd``; None (nothing
    written, nothing left) where that is not supported."""
    flag = getattr(os, "O_TMPFILE", None)
    if flag is None:
        return None
    try:
        fd = os.open(".", flag | os.O_WRONLY | os.O_CLOEXEC, 0o600, dir_fd=dfd)
    except OSError as exc:
        if exc.errno in _UNSUPPORTED:
            return None
        raise
    try:
        made = _fill(fd, data, kept)
        target = _tmp_name(name) if replace else name
        try:
            # linkat(AT_SYMLINK_FOLLOW) of the descriptor's /proc name: a dst_dir_fd makes
            # Python call linkat, not link (which would not follow the /proc link).
            os.link(f"/proc/self/fd/{fd}", target, dst_dir_fd=dfd, follow_symlinks=True)
        except OSError as exc:  # EEXIST among them: not in _UNSUPPORTED, raised
            if exc.errno in _UNSUPPORTED:
                return None
            raise
    finally:
        os.close(fd)
    if replace:
        try:
            os.replace(target, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(target, dir_fd=dfd)
            raise
    return made


def _write_named(dfd: int, name: str, data: bytes, replace: bool, kept: _Kept) -> FileId:
    """``write_private_file`` through a 0600 temp file beside ``name``, removed if the write
    fails (a retry is then not blocked by a short file)."""
    tmp = _tmp_name(name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=dfd)
    try:
        try:
            made = _fill(fd, data, kept)
        finally:
            os.close(fd)
        if replace:
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        else:
            os.link(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
            os.unlink(tmp, dir_fd=dfd)  # (EEXIST: FileExistsError, the temp file removed below)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dfd)
        raise
    return made


@dataclass(frozen=True)
class _Kept:
    """What a new file gets before its first byte (``write_private_file``)."""

    mode: int
    owner: tuple[int, int] | None
    acl: bytes | None


def _kept(path: Path) -> _Kept | None:
    """What a file put in place of the regular file at ``path`` keeps of it: its mode less
    group and others' write, its owner and group (``root:affidavit 0640`` stays so: the daemon
    reads it through its group) and its access ACL, if any (its mask set from that mode, less
    write too).  None: no regular file there -- a link is replaced, never followed, and its
    target is not asked."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    acl = None
    with contextlib.suppress(OSError, AttributeError):  # none, no ACL support, or no xattrs
        acl = os.getxattr(path, ACCESS, follow_symlinks=False)
    return _Kept(stat.S_IMODE(st.st_mode) & 0o755, _owner(st), acl)


def _fill(fd: int, data: bytes, kept: _Kept) -> FileId:
    if kept.owner is not None and kept.owner != _owner(os.fstat(fd)):
        os.fchown(fd, *kept.owner)
    if kept.acl is not None:
        os.setxattr(fd, ACCESS, kept.acl)  # (its mask: the mode's group bits, set next)
    if kept.mode != 0o600 or kept.acl is not None:
        os.fchmod(fd, kept.mode)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.fsync(fd)
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino)


class OwnerNotKept(PermissionError):
    """``write_private_file(keep=True)`` would replace a file whose owner (``uid``) and group
    (``gid``) this process cannot give a file: not root, and another user's, or a group it is
    not in.  Raised before anything is written."""

    def __init__(self, path: Path, uid: int, gid: int) -> None:
        super().__init__(errno.EPERM, "cannot keep its owner and group", str(path))
        self.uid = uid
        self.gid = gid


def _may_give(dfd: int, uid: int, gid: int) -> bool:
    """Whether a file this process makes in the directory ``dfd`` can be given ``uid`` and
    ``gid`` (``fchown``): root may; another user only their own uid, and a group they are in
    -- or the setgid directory's, which a new file has from the start."""
    if os.geteuid() == 0:
        return True
    directory = os.fstat(dfd)
    inherited = directory.st_gid if directory.st_mode & stat.S_ISGID else os.getegid()
    return uid == os.geteuid() and gid in {inherited, os.getegid(), *os.getgroups()}


def _owner(st: os.stat_result) -> tuple[int, int]:
    return st.st_uid, st.st_gid


_TMP_HEX = 12
"""Hex digits of a temp name's random part: ``.<name>.<12 hex>.tmp``."""


def _tmp_name(name: str) -> str:
    return f".{name}.{secrets.token_hex(_TMP_HEX // 2)}.tmp"


def remove_leftovers(path: Path) -> int:
    """Remove the temp files ``write_private_file`` names for ``path`` that a crash left beside
    it (a killed ``vault unlock``'s held the derived vault key): only names of exactly that
    pattern (``.<name>.<12 lowercase hex>.tmp``), regular files this user owns, judged and
    removed by name in the directory (``lstat``: a link there is never followed, and removing
    it removes the link).  Returns how many went.  Run where no write of the same file can be
    in flight, or that write fails (a named temp file only exists where ``O_TMPFILE`` is
    not used, and for an instant of ``replace``): the vault under its lock; key creation
    inside the journal's first write transaction.  A directory that cannot be read is left."""
    prefix, uid, removed = f".{path.name}.", os.geteuid(), 0
    try:
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        for entry in os.listdir(dfd):
            middle = entry[len(prefix) : -len(".tmp")]
            if not (entry.startswith(prefix) and entry.endswith(".tmp")) or not _hex(middle):
                continue
            try:
                st = os.stat(entry, dir_fd=dfd, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and st.st_uid == uid:
                    os.unlink(entry, dir_fd=dfd)
                    removed += 1
            except OSError:
                continue
    except OSError:
        pass
    finally:
        os.close(dfd)
    return removed


def _hex(text: str) -> bool:
    return len(text) == _TMP_HEX and all(c in "0123456789abcdef" for c in text)


def other_names(real: str | os.PathLike[str]) -> tuple[int, str] | None:
    """``(names, how to list them)`` if the regular file at ``real`` (resolved by the caller)
    has more than one name (hard links), else None -- not there, not a regular file (opening
    it says what it is), or one name.  A file a broker rewrites by rename, or keeps files beside
    (the journal's ``-wal`` and lock, the vault's unlock file and lock), under two names is two
    files to a writer under each: the journal's and the vault's refusal both ask this.  The
    command is a ``find`` on the file's mount, where every hard link of it is."""
    try:
        st = os.stat(real)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_nlink <= 1:
        return None
    where = Path(real).parent
    while not os.path.ismount(where) and where != where.parent:
        where = where.parent
    names = f"find {shlex.quote(str(where))} -xdev -samefile {shlex.quote(str(real))}"
    return st.st_nlink, names
