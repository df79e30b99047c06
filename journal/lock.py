"""Who may write a journal: any number of embedded writers, or one owner (the daemon) alone.

An advisory lock on ``<journal>.lock`` (flock(2)) beside the file the journal is, whatever name
it is opened under (``lock_path``).  Embedded writers (``affidavit call``,
``Broker.open``) take it shared, so several of them may still share a journal as before (SQLite
serialises their transactions).  An owner -- ``affidavit serve`` -- takes it exclusive: it
starts only when no embedded writer has the journal open, and while it runs every embedded
writer is refused with ``JournalLocked``, whose message is the owner's own description (the
socket to use instead) -- or, from an owner holding it for one job (``affidavit journal
migrate``: ``JOB``), that it is busy with that job until it finishes.  Never two writers racing,
one of them unaware.  Readers take no lock:
the views may still read a journal a daemon owns.

A flock belongs to the open file description, so it is released however the holder exits,
SIGKILL included: a killed daemon never leaves a stale lock behind.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shlex
import stat
import threading
from collections.abc import Sequence
from pathlib import Path

from affidavit.privatefile import other_names, run_as_owner, theirs_for_root

from .errors import JournalError
from .exposure import is_serving, journal_files
from .names import beside, journal_file

__all__ = ["JournalLocked", "NoLockToHold", "WriterLock", "lock_path", "refuse_root_on_theirs"]

_MAX_OWNER = 4096
_TRIES = 3
"""Times a writer opens and locks ``<journal>.lock`` anew when the file it locked is no longer
the one at the path (removed or replaced between the open and the flock)."""


class JournalLocked(JournalError):
    """The journal is owned by another process (``owner`` describes it when it said; ``job``:
    it holds the journal for one job -- ``affidavit journal migrate`` -- not as a daemon)."""

    def __init__(self, message: str, owner: str | None, *, job: bool = False) -> None:
        self.owner = owner
        self.job = job
        super().__init__(message)


class NoLockToHold(JournalError):
    """A lock taken ``reads_only`` on a read-only mount where no lock file is there to hold
    (none can be made): nothing keeps a writer through another mount out."""


JOB = "job: "
"""Before the description in the lock of an owner that holds it for one job and then lets go
(``affidavit journal migrate``; ``WriterLock.acquire(job=True)``): a writer it refuses is told
to wait for that job, not to ask a daemon -- there is none.  A description without it -- a
daemon's, and every one an earlier affidavit wrote -- is an owner's that serves."""


def _holder(text: str) -> tuple[str, bool]:
    """A lock's description read (``_read_owner``): the holder it names, and whether it holds
    the journal for one job (``JOB``)."""
    if text.startswith(JOB) and text[len(JOB) :].strip():
        return text[len(JOB) :].strip(), True
    return text, False


def lock_path(journal: Path) -> Path:
    """The journal's lock: ``<journal>.lock`` beside the file ``journal`` names -- through a
    link (a chain of them, a dangling one: where the first open makes the journal), ``..`` and
    a relative name all resolved (``os.path.realpath``) -- in the directory SQLite keeps its
    ``-wal`` and ``-shm`` (its unix VFS resolves links too), and the one the root refusal
    judges: a daemon's journal opened through a link is refused as through its own name (it
    was given a lock of its own beside the link, and wrote beside the daemon).  Not a lock of
    the inode (the journal file itself): SQLite's locks are POSIX ones, which the close of
    *any* descriptor of the file drops for the whole process -- so a second name, a hard link,
    is refused instead (``_refuse_other_names``)."""
    return beside(journal, ".lock")


def _refuse_other_names(journal: Path, real: Path) -> None:
    """``JournalError`` if the journal's file has more than one name (a hard link): SQLite keeps
    a ``-wal`` and ``-shm`` beside the name it was opened under, so a writer under another name
    writes a WAL of its own into the same file -- two writers unaware of each other, the
    corruption SQLite warns of (its "How To Corrupt", multiple links) -- and its lock
    (``lock_path``) would be another file too.  Every writer checks as it opens: once the file
    has a second name no writer opens it under either (one open already keeps it; the next
    under another name is refused).  Refused before anything is made; a journal not there yet
    has no links, a directory's are not names of a file (opening it says what it is)."""
    found = other_names(real)  # (none yet, not a regular file: opening it says why)
    if found is not None:
        links, names = found
        raise JournalError(
            f"journal {journal} has {links} names (hard links): SQLite keeps a -wal beside the "
            "name a journal is opened under, so a writer under another name would write a WAL "
            f"of its own into the same file; remove the other names (`{names}` lists them)",
            public="the journal file has other names (hard links), which would each get a WAL "
            "of their own; the operator must remove them",
        )


def refuse_root_on_theirs(
    journal: Path, keys: Sequence[Path] = (), real: Path | None = None
) -> None:
    """``JournalError`` if this process is root and another user owns the journal (its directory,
    while there is none -- that of the file a link names, where SQLite makes it): a root one-off or
    embedded writer (``sudo affidavit journal reclaim``, an embedded ``call``) creates root's files
    beside it -- this lock, result segments and their directory, a signing key, the journal itself,
    the console's login tokens and their directory (a root ``affidavit console-url``, which calls
    this first) -- each ``0600``, which its owner, the daemon's user, then cannot open (SQLite gives
    a ``-wal`` and ``-shm`` root makes the main file's owner; nothing else does). Refused before
    anything is made, with both ways forward: run as the owner, or, if root is to run the broker
    from now on, give root every file of the journal's (``_root_from_now_on``;
    ``privatefile.run_as_owner``). A reader makes none of them; the daemon (an owner, inside
    ``exposure.serving``: an ``owner=`` alone is any embedded program's) is left to its start's
    check of the files (``--allow-exposed-files``: a root daemon that will own all it makes from now
    on).  ``real``: the file ``journal`` names, as the caller resolved it once (``names.py``);
    else resolved here."""
    if os.geteuid() != 0:
        return
    real = journal_file(journal) if real is None else real  # (os.stat follows a link too)
    where, what = real, f"journal {journal}"
    if not os.path.exists(real):
        where, what = real.parent, f"the directory of journal {journal}"
    found = theirs_for_root(where)
    if found is None:
        return  # root's (or it cannot be looked at: opening it says why)
    uid = found[1]
    raise JournalError(
        f"{what} is owned by uid {uid} and this process runs as root, which would make "
        "the files a writer creates beside it (its lock, result segments, keys, console login "
        "tokens) root's, which its owner cannot open; "
        f"{run_as_owner(uid, _root_from_now_on(real, keys))}",
        public="the journal or its directory is owned by another user and the broker runs as "
        "root; run the broker as its owner",
    )


def _root_from_now_on(real: Path, keys: Sequence[Path]) -> str:
    """The commands giving root every file of the journal ``real`` (resolved: every path said
    is absolute, as the files are found) another user owns (``exposure.journal_files``, the
    files in its directories -- segments, login tokens -- and ``keys``: a root-run broker is
    refused or warned of each), and the directory SQLite keeps it in when that is another's:
    with ``chown -R`` when it holds the journal's files alone, else never -- a shared directory
    (``$HOME``, a mount) is not the journal's to give away: its files are to move to one of
    their own."""
    listed = journal_files(real)
    trees = {path for path, _, rule in listed if rule.directory}  # (chown -R: their files too)
    files = [path for path, _, _ in listed] + [journal_file(k) for k in keys]
    home = real.parent
    try:
        home_st = os.stat(home)
        held = set(os.listdir(home))
    except OSError:  # (gone meanwhile: opening it says why)
        home_st, held = None, set()
    mine = {p.name for p in files if p.parent == home}
    root_home = home_st is None or home_st.st_uid == 0
    own = not root_home and held <= mine  # another's directory of the journal's alone
    said = [f"chown -R 0 -- {shlex.quote(str(home))}"] if own else []
    theirs = [p for p in files if _theirs(p) and not (own and p.parent == home)]
    plain = [shlex.quote(str(p)) for p in theirs if p not in trees]
    said += [f"chown -h 0 -- {' '.join(plain)}"] if plain else []  # (-h: a link, not its file)
    said += [f"chown -R 0 -- {shlex.quote(str(p))}" for p in theirs if p in trees]
    if root_home or own:
        return " && ".join(said) or f"chown -h 0 -- {shlex.quote(str(real))}"
    move = (
        f"keep the journal in a directory of its own root owns ({home} holds other files: a "
        "chown of it would take them from their owner)"
    )
    return f"{' && '.join(said)}, and {move}" if said else move


def _theirs(path: Path) -> bool:
    """Whether a file at ``path`` is there and root does not own it -- nor, for a directory
    (the results'), every file in it.  The name itself (``lstat``): a link planted at
    ``<journal>.lock`` or ``-wal`` is judged, and given (``chown -h``), as the link -- never
    the file it points at, which root's pasted ``chown`` would have taken from its owner."""
    try:
        st = os.lstat(path)
        if st.st_uid != 0:
            return True
        if not stat.S_ISDIR(st.st_mode):
            return False
        with os.scandir(path) as entries:
            return any(e.stat(follow_symlinks=False).st_uid != 0 for e in entries)
    except OSError:
        return False


FRESH_EVERY = 60.0
"""Seconds between two touches of a held lock file's times (``WriterLock``): an age-based
cleaner of a temporary directory (systemd-tmpfiles, tmpreaper) removes a file none of whose
times moved for days -- a lock under ``/tmp`` never written again would go, and every write
after be refused ``JOURNAL_REPLACED`` until a restart."""


class WriterLock:
    def __init__(
        self, fd: int, path: Path, *, exclusive: bool, beside_name: int | None = None
    ) -> None:
        self._fd: int | None = fd
        self._beside_name = beside_name  # (``<given>.lock``, held with it: ``_hold_beside_name``)
        self.path = path
        self.exclusive = exclusive
        self._released = threading.Event()
        self._keeper = threading.Thread(
            target=self._keep_fresh, args=(fd,), name="affidavit-journal-lock", daemon=True
        )
        self._keeper.start()

    def _keep_fresh(self, fd: int) -> None:
        """Touch the lock file's times every ``FRESH_EVERY`` seconds while it is held (the
        descriptor's: a file put at the path meanwhile is not touched); an error -- a file
        this user may not touch -- leaves it for the next time."""
        while not self._released.wait(FRESH_EVERY):
            with contextlib.suppress(OSError):
                os.utime(fd)

    @classmethod
    def acquire(
        cls,
        journal: Path,
        owner: str | None = None,
        *,
        keys: Sequence[Path] = (),
        real: Path | None = None,
        job: bool = False,
        reads_only: bool = False,
    ) -> WriterLock:
        """Shared for an embedded writer (``owner=None``); exclusive for an owner, which then
        writes ``owner`` into the lock file for the writers it refuses (after ``JOB`` with
        ``job``: an owner holding it for one job, whom they are told to wait for).  ``keys``: the
        journal's key files, which a root writer's refusal names (``refuse_root_on_theirs``).
        ``real``: the file ``journal`` names, resolved once by the caller, which opens that
        same file (``SqliteBackend``); else resolved here.  ``reads_only``: an owner that
        only reads the journal (``affidavit journal migrate``), which on a read-only mount -- a
        read-only bind mount of a writable directory, through whose other mount a writer may
        append -- holds the lock file there opened read-only (a flock needs no write; its
        description cannot be written, so a writer it refuses is told only that another
        process owns the journal), and is refused ``NoLockToHold`` when there is none."""
        real = journal_file(journal) if real is None else real
        if owner is None or not is_serving():  # an ``owner`` outside a daemon: a one-off
            refuse_root_on_theirs(Path(journal), keys, real)
        _refuse_other_names(journal, real)
        path = lock_path(real)
        mode = fcntl.LOCK_EX if owner is not None else fcntl.LOCK_SH
        for _ in range(_TRIES):
            fd = _open_lock(path, reads_only)
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
            except OSError as exc:
                held = _read_owner(fd)
                os.close(fd)
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise JournalError(f"cannot lock {path}: {exc.strerror}") from None
                raise _refusal(journal, held, owner is not None) from None
            try:
                placed = _in_place(fd, path)
            except BaseException:
                os.close(fd)
                raise
            if placed:
                break
            os.close(fd)  # locked a file no longer at the path: it keeps no one out
        else:
            raise JournalError(
                f"the journal's lock {path} was replaced or removed each time it was taken "
                f"({_TRIES} times): something is removing it -- stop that, then open the "
                "journal again"
            )
        try:
            beside_name = _hold_beside_name(journal, path, fd, mode, owner is not None)
        except BaseException:
            os.close(fd)
            raise
        for held_fd in (fd, beside_name):
            if held_fd is not None:
                _describe(held_fd, None if owner is None else (JOB if job else "") + owner)
        return cls(fd, path, exclusive=owner is not None, beside_name=beside_name)

    def in_place(self) -> bool:
        """Whether the file this lock holds is still the one at its path: removed (or replaced)
        since, it keeps no one out -- the next writer creates a new file there and locks that,
        a second owner beside this one.  Nothing at the path (or a lock let go) is False; a
        ``stat`` that fails otherwise raises its ``OSError``: not a replacement."""
        fd = self._fd
        return fd is not None and _in_place(fd, self.path)

    def release(self) -> None:
        """Let go (of ``<given>.lock`` too, when held).  An owner clears its description
        first; a shared holder only closes -- it never takes the lock exclusive on its way out,
        not even for an instant: an embedded writer opening the journal in that instant was
        refused as if a daemon owned it."""
        self._released.set()
        if self._keeper is not threading.current_thread():
            self._keeper.join()  # (before its descriptor is closed: never a reused number)
        fds = (self._beside_name, self._fd)
        self._fd = self._beside_name = None
        for fd in fds:
            if fd is None:
                continue
            if self.exclusive:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, 0)
            os.close(fd)


def _open_lock(path: Path, reads_only: bool = False) -> int:
    """The lock file open (made when not there).  ``reads_only``: on a read-only mount
    (``EROFS``) the file there is opened as it may be (``_open_existing``: read-only, a flock
    needs no write) -- ``NoLockToHold`` when there is none."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if reads_only and exc.errno == errno.EROFS:
            fd = _open_existing(path)
            if fd is None:
                raise NoLockToHold(f"no lock file {path} on a read-only mount") from None
            return fd
        raise JournalError(
            f"cannot open the journal's lock {path}: {exc.strerror} (its directory must "
            "exist and be writable by this user: fix that, or name another journal with "
            "[journal] path or --journal)"
        ) from None


def _in_place(fd: int, path: Path) -> bool:
    """The file open as ``fd`` is the one at ``path`` (``os.stat``: the open followed a link
    there too).  Nothing there is False; another ``stat`` error propagates."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return os.path.samestat(os.fstat(fd), st)


def _describe(fd: int, owner: str | None) -> None:
    """An owner's description into a lock it holds exclusive, for the writers it refuses; held
    shared, no owner is alive: a description in the file is a killed owner's, cleared.  (A lock
    this process cannot write, or a FIFO, keeps what it has.)"""
    with contextlib.suppress(OSError):
        if owner is not None:
            os.ftruncate(fd, 0)
            os.pwrite(fd, owner.encode("utf-8")[:_MAX_OWNER], 0)
        elif os.fstat(fd).st_size:
            os.ftruncate(fd, 0)


def _hold_beside_name(
    journal: Path, path: Path, lock_fd: int, mode: int, as_owner: bool
) -> int | None:
    """``<journal>.lock`` -- beside the name given, where an earlier affidavit took the lock of
    a journal opened through a link -- when it is there and another file than the lock
    (``path``, open as ``lock_fd``): taken in the lock's own mode and held with it (its
    descriptor returned, let go by ``WriterLock.release``), so a broker of that version is kept
    out while this writer runs, however late it starts, and refuses this one only while it
    really holds it (``JournalLocked``) -- never for a probe's instant.  Never created (none
    there: ``None``; a broker of that version starting later makes it and is not kept out).
    Its cost: a comparison when the name given is the file's absolute one; else an open, and
    two fstats when there is a file (a relative name's is the lock itself, under another
    name)."""
    old = Path(f"{journal}.lock")
    if old == path:
        return None  # (the name given is the file's: its lock is the lock)
    fd = _open_existing(old)
    if fd is None:
        return None
    try:
        if os.path.samestat(os.fstat(fd), os.fstat(lock_fd)):
            os.close(fd)
            return None  # (the same file under another name: held already)
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except OSError as exc:
        held = _read_owner(fd) if not as_owner else None  # (refused shared: an owner holds it)
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise _refusal_beside_name(journal, old, held, as_owner) from None
        return None  # (another error: a lock it cannot take is no holder found)
    return fd


def _open_existing(path: Path) -> int | None:
    """A descriptor of the file at ``path`` if there is one, never creating it: read-write when
    this user may (an owner's description goes in), else read-only (a flock needs neither);
    non-blocking, a FIFO there would hang the open."""
    flags = os.O_CLOEXEC | os.O_NONBLOCK
    for access in (os.O_RDWR, os.O_RDONLY):
        try:
            return os.open(path, access | flags)
        except FileNotFoundError:
            return None
        except OSError:
            continue
    return None


def _refusal_beside_name(
    journal: Path, old: Path, held_by: str | None, as_owner: bool
) -> JournalLocked:
    """Refused by ``<journal>.lock`` held: shared, this one was refused by an exclusive holder,
    an owner, whose description the file holds (it writes its own as it takes it); exclusive,
    by any holder -- an embedded writer or an owner, which ``old`` does not tell apart -- so no
    one is named."""
    if held_by is not None:
        return _refusal(journal, held_by, as_owner)
    who = "an owner (a daemon)" if not as_owner else "another process"
    return JournalLocked(
        f"journal {journal}: {who} holds its lock {old} -- an earlier affidavit's lock of a "
        "journal opened through that name"
        + ("; a daemon must be its only writer -- stop that process first" if as_owner else ""),
        None,
    )


def _read_owner(fd: int) -> str | None:
    try:
        text = os.pread(fd, _MAX_OWNER, 0).decode("utf-8", "replace").strip()
    except OSError:
        return None
    return text or None


def _refusal(journal: Path, held_by: str | None, as_owner: bool) -> JournalLocked:
    if held_by is not None:
        holder, job = _holder(held_by)
        if job:
            return JournalLocked(
                f"journal {journal} is busy: {holder} holds it for that one job; wait for it "
                "to finish, then try again",
                holder,
                job=True,
            )
        return JournalLocked(
            f"journal {journal} is owned by {held_by}: ask the daemon on its socket "
            "(--socket or $AFFIDAVIT_SOCKET) instead of opening the journal",
            held_by,
        )
    if as_owner:
        return JournalLocked(
            f"journal {journal} is open in another process (an embedded broker); a daemon "
            "must be its only writer -- stop that process first",
            None,
        )
    return JournalLocked(f"journal {journal} is owned by another process", None)
