"""The secrets vault: one encrypted file, lockable across processes.

Seed, "Validation and credential injection finish before dispatch": a locked vault and a local
key decryption error are *credential_injection* failures with ``outcome=not_attempted``.  So the
vault must tell "locked" apart from "missing entry" apart from "the file was tampered with" — the
engine turns each into its own stable code (see ``affidavit.credentials``).

File layout (all integers big-endian)::

    magic   8  b"AFVAULT\\x01"
    n_log2  1  scrypt cost (N = 2**n_log2), bounded on read so a tampered header cannot make
    r       1  the broker allocate gigabytes
    p       1
    salt   16  scrypt salt
    check  16  HMAC-SHA256(key, "affidavit-vault-check")[:16]: tells a wrong passphrase (or a
               stale unlock file) apart from a tampered ciphertext
    nonce  12  AES-GCM nonce, fresh for every write
    ct     ..  AES-GCM(key, nonce, payload JSON, aad = every header byte before the nonce)

The payload holds every entry (names too: a name can itself be sensitive) with a per-entry
version that ``put`` bumps.  The engine binds that counter *and* a digest of the value to an
invocation (``credentials.resolve``: a re-created or restored vault repeats the counter with
another value; seed: "You may record the secret's identifier or its non-secret version").  The
digest is an HMAC keyed by a MAC key derived from the vault's own key (``Vault.entry``: HKDF,
its own label), never by the journal's: the digest is journaled, and whoever holds the journal
key but not the passphrase (every host of a shared journal, a key backup) must not test guesses
of a vault value against it at HMAC speed -- scrypt stands between them and the value.

Locking works across processes because the broker and ``affidavit vault unlock`` are separate
processes: ``unlock`` derives the key and stores it in ``<vault>.unlock`` (mode 0600, atomic);
``lock`` deletes that file; a process finds the vault locked when neither that file nor
``$AFFIDAVIT_VAULT_PASSPHRASE`` provides a key.  Nothing keeps the key in memory beyond one
operation, so a ``lock`` in another process takes effect on the broker's very next lookup.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
import shlex
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from affidavit.privatefile import (
    FileMissing,
    FileRefused,
    other_names,
    read_small_file,
    refuse_shared_fd,
    remove_leftovers,
    run_as_owner,
    theirs_for_root,
    write_private_file,
)

__all__ = [
    "MAX_VAULT_BYTES",
    "PASSPHRASE_ENV",
    "EntryMissing",
    "InvalidEntry",
    "Vault",
    "VaultBusy",
    "VaultCorrupt",
    "VaultError",
    "VaultExists",
    "VaultHardLinked",
    "VaultLockUnusable",
    "VaultLocked",
    "VaultMissing",
    "VaultNotRoots",
    "VaultUnreadable",
    "VaultWriteFailed",
    "WrongPassphrase",
    "valid_entry_name",
]

PASSPHRASE_ENV = "AFFIDAVIT_VAULT_PASSPHRASE"
MAGIC = b"AFVAULT\x01"
_UNLOCK_MAGIC = b"AFUNLK\x00\x01"
_SALT_LEN, _CHECK_LEN, _NONCE_LEN, _KEY_LEN = 16, 16, 12, 32
MAX_VAULT_BYTES = 64 * 1024 * 1024
"""A vault file larger than this is refused (it is read whole on every ``vault:`` reference)."""
_UNLOCK_MAX_BYTES = 4096  # the unlock file is a few dozen bytes
_HEADER_LEN = len(MAGIC) + 3 + _SALT_LEN + _CHECK_LEN
DEFAULT_N_LOG2 = 15
"""scrypt N = 2**15, r = 8, p = 1: ~32 MiB and ~0.1 s per derivation (RFC 7914's interactive
recommendation), paid once per ``unlock``, not per lookup."""
_N_LOG2_RANGE = range(10, 21)
LOCK_WAIT = 5.0
"""Seconds a vault write waits for the lock another process holds (a ``put`` takes well under
one), then VAULT_BUSY -- never a command that waits without end on a holder it cannot name."""
_LOCK_POLL = 0.05
_ENTRY_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,128}")


class VaultError(Exception):
    """Base class (never raised itself).  Messages name files and entries, never values or
    passphrases; ``code`` is the stable kind the command line prints before the message;
    ``field``: what to fix when it is not the vault's path (``name``, ``value`` of an entry)
    -- None: the vault's path, which the command line names as it was given (``--vault`` or
    the config's ``vault.path``)."""

    code = "VAULT_ERROR"
    field: str | None = None


class InvalidEntry(VaultError):
    """An entry name or value ``put`` cannot store (``field``: ``name`` or ``value``)."""

    code = "INVALID_FIELD"

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class VaultUnreadable(VaultError):
    """The vault file is there but cannot be read: not a regular file (a directory, a FIFO --
    never waited on), larger than ``MAX_VAULT_BYTES``, no permission, an I/O error."""

    code = "VAULT_UNREADABLE"


class VaultWriteFailed(VaultError):
    """Writing the vault file or its unlock file (or removing the unlock file) failed: the
    OS's reason (no space, a read-only directory...).  The old file stays whole (``privatefile.
    write_private_file`` renames a whole new one over it, or nothing)."""

    code = "VAULT_WRITE_FAILED"


class VaultHardLinked(VaultError):
    """The vault file has more than one name (hard links): a write renames a new file onto
    one name, and the others keep the old contents -- a revoked credential a broker reading
    another name keeps sending."""

    code = "VAULT_HARD_LINKED"


class VaultMissing(VaultError):
    """The vault file does not exist."""

    code = "VAULT_MISSING"


class VaultExists(VaultError):
    """``init`` refused to overwrite an existing vault."""

    code = "VAULT_EXISTS"


class VaultLocked(VaultError):
    """No key is available: run ``affidavit vault unlock`` (or set the passphrase variable)."""

    code = "VAULT_LOCKED"


class WrongPassphrase(VaultError):
    """The passphrase (or the stored unlock key) does not open this vault."""

    code = "VAULT_WRONG_PASSPHRASE"


class VaultCorrupt(VaultError):
    """The file is not a vault, or its contents failed authentication (modified or damaged)."""

    code = "VAULT_CORRUPT"


class VaultNotRoots(VaultError):
    """Root would write the vault, its unlock file or its lock where another user -- the
    broker's -- owns them or their directory: the files would be root's ``0600``, which the
    broker cannot read (``Vault.refuse_root_on_theirs``)."""

    code = "VAULT_NOT_ROOTS"


class VaultLockUnusable(VaultError):
    """The vault's lock file cannot be used: it cannot be opened or made, is a link (never
    followed), not a regular file, another user's, or group or others may open it -- and
    whoever can open it can hold it."""

    code = "VAULT_LOCK_UNUSABLE"


class VaultBusy(VaultError):
    """Another process held the vault's lock for all of ``LOCK_WAIT`` seconds."""

    code = "VAULT_BUSY"


class EntryMissing(VaultError, KeyError):
    """No entry with that name."""

    code = "VAULT_ENTRY_MISSING"

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "no such entry"


def valid_entry_name(name: str) -> bool:
    return bool(_ENTRY_NAME.fullmatch(name))


def _derive(passphrase: str, salt: bytes, n_log2: int, r: int, p: int) -> bytes:
    kdf = Scrypt(salt=salt, length=_KEY_LEN, n=2**n_log2, r=r, p=p)
    return kdf.derive(passphrase.encode("utf-8"))


def _check_value(key: bytes) -> bytes:
    return hmac.new(key, b"affidavit-vault-check", hashlib.sha256).digest()[:_CHECK_LEN]


_DIGEST_INFO = b"affidavit-vault-value-digest-v1"
"""HKDF's ``info`` for the MAC key of ``Vault.entry``'s digests: no other use of the vault key
(the AES-GCM key itself, the ``check`` HMAC) shares it."""


def _digester(key: bytes) -> Callable[[str, bytes], str]:
    """``(label, value) -> hex HMAC-SHA256`` keyed by a MAC key derived from the vault key: the
    same in every process that opens this vault (the key is the passphrase's scrypt with the
    header's salt), another in a vault made again (a fresh salt)."""
    mac_key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_DIGEST_INFO).derive(key)

    def digest(label: str, value: bytes) -> str:
        return hmac.new(mac_key, label.encode("utf-8") + b"\0" + value, hashlib.sha256).hexdigest()

    return digest


class _Header:
    __slots__ = ("check", "n_log2", "p", "r", "raw", "salt")

    def __init__(self, raw: bytes) -> None:
        if len(raw) < _HEADER_LEN or raw[: len(MAGIC)] != MAGIC:
            raise VaultCorrupt("not an affidavit vault file (bad magic or truncated header)")
        o = len(MAGIC)
        self.n_log2, self.r, self.p = raw[o], raw[o + 1], raw[o + 2]
        if self.n_log2 not in _N_LOG2_RANGE or not (1 <= self.r <= 32) or not (1 <= self.p <= 16):
            raise VaultCorrupt("vault header has out-of-range key derivation parameters")
        o += 3
        self.salt = raw[o : o + _SALT_LEN]
        o += _SALT_LEN
        self.check = raw[o : o + _CHECK_LEN]
        self.raw = raw[:_HEADER_LEN]


class Vault:
    """An encrypted secrets file.  Construct with ``Vault.init`` or ``Vault.open``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        # The file the path names, resolved once (links, a chain of them, a dangling one: where
        # ``init`` makes it; ``..``; a relative name), as the journal's (``journal.names``): a
        # write renames onto the file itself, not onto a link (which became a file of its own,
        # and the file the config names kept the revoked value), and the unlock file and lock
        # are beside the file, one for every name it is reached by.
        self.path = Path(os.path.realpath(path))
        self.given = Path(path)
        self.unlock_path = self.path.with_name(self.path.name + ".unlock")
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self._env_cache: tuple[str, bytes, bytes] | None = None

    def __repr__(self) -> str:
        return f"Vault({str(self.path)!r})"

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def init(cls, path: str | Path, passphrase: str, *, n_log2: int = DEFAULT_N_LOG2) -> Vault:
        """Create an empty vault at ``path`` (0600).  It starts locked: ``unlock`` to use it."""
        if not passphrase:
            raise WrongPassphrase("the passphrase must not be empty")
        if n_log2 not in _N_LOG2_RANGE:
            raise ValueError(f"n_log2 must be within {_N_LOG2_RANGE.start}..{_N_LOG2_RANGE.stop}")
        vault = cls(Path(path))
        if vault.path.exists():
            raise VaultExists(f"{vault.path}: a vault already exists; refusing to overwrite it")
        salt = secrets.token_bytes(_SALT_LEN)
        r, p = 8, 1
        key = _derive(passphrase, salt, n_log2, r, p)
        header = MAGIC + bytes([n_log2, r, p]) + salt + _check_value(key)
        with vault._exclusive():
            if vault.path.exists():
                raise VaultExists(f"{vault.path}: a vault already exists; refusing to overwrite it")
            vault._write(_Header(header), key, {})
        return vault

    @classmethod
    def open(cls, path: str | Path) -> Vault:
        vault = cls(Path(path))
        vault.refuse_other_names()
        vault._read_header()
        vault._sweep()
        return vault

    def refuse_other_names(self) -> None:
        """``VaultHardLinked`` if the vault file has more than one name (hard links): a write
        renames a new file onto this one, and every other name keeps the old one.  Asked at
        every open, by each ``put`` under the lock, and by a broker's start (``Broker.open``)."""
        found = other_names(self.path)
        if found is not None:
            links, names = found
            raise VaultHardLinked(
                f"{self.path}: the vault file has {links} names (hard links): a write replaces "
                "the file under one name and the others keep the old entries (a revoked value); "
                f"remove the other names (`{names}` lists them) or reach it by a symbolic link"
            )

    # -- locking --------------------------------------------------------------------------

    def unlock(self, passphrase: str) -> None:
        """Derive the key, prove it opens the vault, and store it in the 0600 unlock file."""
        header = self._read_header()
        key = _derive(passphrase, header.salt, header.n_log2, header.r, header.p)
        if not hmac.compare_digest(_check_value(key), header.check):
            raise WrongPassphrase(f"{self.path}: wrong passphrase")
        self._decrypt(header, key, self._read_raw())  # tampering is reported at unlock already
        with self._exclusive():
            self._remove_leftovers()
            try:
                write_private_file(self.unlock_path, _UNLOCK_MAGIC + header.salt + key)
            except OSError as exc:
                raise VaultWriteFailed(
                    f"{self.unlock_path}: cannot write the unlock file: {exc.strerror}"
                ) from None

    def lock(self) -> None:
        """Forget the stored key (every process sees the vault locked from now on) -- and any
        copy of it an interrupted ``unlock`` left in a temp file (``_remove_leftovers``).  The
        unlock file goes first, without the lock: a lock file that cannot be opened (its path
        made a directory, a read-only directory) or a holder that keeps it must not leave the
        key on disk; the leftovers are then removed under the lock, as best it can (``_sweep``:
        an ``unlock`` writing meanwhile keeps its temp file)."""
        try:
            os.unlink(self.unlock_path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise VaultWriteFailed(
                f"{self.unlock_path}: cannot remove the unlock file: {exc.strerror}"
            ) from None
        self._sweep()

    @property
    def is_locked(self) -> bool:
        try:
            self.require_key()
        except VaultLocked:
            return True
        return False

    def require_key(self) -> None:
        """Raise what keeps this process from the vault's key -- ``VaultLocked`` saying why
        (no unlock file; one it may not read, and what is wrong with it; one of another
        vault's), ``WrongPassphrase`` for the variable's -- where ``is_locked`` only says
        whether."""
        self._key(self._read_header())

    # -- entries --------------------------------------------------------------------------

    def put(self, name: str, value: bytes) -> int:
        """Store ``value`` under ``name``; returns the entry's new version (1 for a new entry)."""
        if not valid_entry_name(name):
            raise InvalidEntry("entry names are 1-128 characters of A-Z a-z 0-9 _ . -", "name")
        if not isinstance(value, bytes) or not value:
            raise InvalidEntry("the value must be non-empty bytes", "value")
        # Root on another user's vault is refused first: not VaultLocked, nor an scrypt spent.
        self.refuse_root_on_theirs()
        # The key first, outside the lock: from $AFFIDAVIT_VAULT_PASSPHRASE it is an scrypt
        # (a second or more), which every other write would wait out; kept (``_env_cache``)
        # for the header read under the lock, unless the vault was made again meanwhile.
        self._key(self._read_header())
        with self._exclusive():
            self.refuse_other_names()  # (a name made since the open: under the lock, as written)
            raw = self._read_raw()
            header = _Header(raw)
            key = self._key(header)
            entries = self._decrypt(header, key, raw)
            old = entries.get(name)
            version = (int(old["version"]) if old else 0) + 1
            entries[name] = {
                "value": base64.b64encode(value).decode("ascii"),
                "version": version,
                "updated_at": time.time(),
            }
            self._write(header, key, entries)
        return version

    def get(self, name: str) -> tuple[bytes, int]:
        """The entry's value and its version."""
        value, version, _ = self.entry(name)
        return value, version

    def entry(self, name: str) -> tuple[bytes, int, Callable[[str, bytes], str]]:
        """The entry's value, its version and a keyed digest function (``(label, value) ->
        hex``) whose MAC key is derived from the key that opened it, in the same read: the
        value's non-secret version, which only those who can open the vault can reproduce."""
        raw = self._read_raw()
        header = _Header(raw)
        key = self._key(header)
        entry = self._decrypt(header, key, raw).get(name)
        if entry is None:
            raise EntryMissing(f"{self.path}: no entry with that name")
        return base64.b64decode(entry["value"]), int(entry["version"]), _digester(key)

    def list(self) -> list[tuple[str, int, float]]:
        """``(name, version, updated_at)`` for every entry, sorted by name.  Never values."""
        raw = self._read_raw()
        header = _Header(raw)
        entries = self._decrypt(header, self._key(header), raw)
        return [
            (name, int(e["version"]), float(e["updated_at"])) for name, e in sorted(entries.items())
        ]

    # -- internals ------------------------------------------------------------------------

    @contextlib.contextmanager
    def _exclusive(self, wait: float | None = None) -> Iterator[None]:
        """Serialize read-modify-write across processes (two concurrent ``put``s must not lose
        one another's entry) -- never as root on another user's vault, which every write
        holds this for (``refuse_root_on_theirs``).  Waits ``wait`` seconds for another
        holder (None: ``LOCK_WAIT``; 0: one try), then ``VaultBusy``."""
        self.refuse_root_on_theirs()
        fd = self._open_lock()
        wait = LOCK_WAIT if wait is None else wait
        try:
            deadline = time.monotonic() + wait
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise VaultBusy(
                            f"{self.lock_path}: another process has held the vault's lock for "
                            f"{wait:g} s: let it finish and try again (`fuser -v "
                            f"{shlex.quote(str(self.lock_path))}` names it)"
                        ) from None
                    time.sleep(_LOCK_POLL)
            yield
        finally:
            os.close(fd)

    def _open_lock(self) -> int:
        """The lock file, opened (made 0600 if absent) never through a link (``O_NOFOLLOW``:
        one planted there would have the lock made, or held, elsewhere), and only if it is a
        regular file no one but this user (or root) owns or may open (``refuse_shared_fd``):
        whoever else can open it can hold its flock (no write needed) and stall every write."""
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(self.lock_path, flags, 0o600)
        except OSError as exc:
            # A missing directory or a read-only one: a clear error, never a traceback (the
            # message is the OS's reason and our own path, no caller value).
            reason = "it is a link, never followed" if exc.errno == errno.ELOOP else exc.strerror
            raise VaultLockUnusable(
                f"{self.lock_path}: cannot open the lock file: {self._whose_lock() or reason}"
            ) from None
        try:
            refuse_shared_fd(fd, self.lock_path, "vault lock file")
        except FileRefused as exc:
            os.close(fd)
            raise VaultLockUnusable(f"{self.lock_path}: cannot use the lock file: {exc}") from None
        return fd

    def _whose_lock(self) -> str | None:
        """Why this user may not open a lock file another uid owns -- root's, most often, left
        by a ``sudo affidavit vault put`` -- and the command that mends it; None when it is
        this user's (or not there, or not to be looked at: the OS's reason says it)."""
        try:
            uid = os.lstat(self.lock_path).st_uid
        except OSError:
            return None
        me = os.geteuid()
        if uid == me:
            return None
        quoted = shlex.quote(str(self.lock_path))
        return (
            f"it is owned by uid {uid}, not by this process's uid {me} (a vault command run as "
            f"that user -- sudo -- made it), and no one else may open it: `chown {me} {quoted}` "
            f"as uid {uid} or root (it holds nothing: removing it does as well)"
        )

    def refuse_root_on_theirs(self) -> None:
        """Every write's first step, and a command's before it asks for a value or the
        passphrase: ``VaultNotRoots`` if this process is root and another user owns the vault, its
        unlock file, its lock or their directory (``privatefile.theirs_for_root``: the
        journal's rule): ``sudo affidavit vault put`` or ``unlock`` on the daemon's vault would
        leave files of root's, ``0600``, that the daemon cannot read -- the vault, or the key
        the next lookup needs.  Raised before anything is written, naming the file, its owner
        and ``sudo -u`` that owner; an open's sweep then passes (``_sweep``)."""
        files = (self.path, self.unlock_path, self.lock_path, self.path.parent)
        found = theirs_for_root(*files)
        if found is None:
            return
        path, uid = found
        # The files there and their directory: root's broker needs them all, and a name
        # not there yet is made root's by its first write anyway.
        there = [f for f in files[:3] if os.path.lexists(f)]
        named = [*there, Path(os.path.abspath(self.path.parent))]
        chown = f"chown 0 {' '.join(shlex.quote(str(f)) for f in named)}"
        raise VaultNotRoots(
            f"{path} is owned by uid {uid} and this process runs as root, which would make the "
            "vault's files it writes (the vault, its unlock file, its lock) root's, 0600, which "
            f"their owner cannot read; {run_as_owner(uid, chown)}"
        )

    def _remove_leftovers(self) -> None:
        """The temp files a killed write of the vault or its unlock file left (``privatefile.
        remove_leftovers``: a killed ``unlock``'s held the derived key, which copied into place
        opened the vault without the passphrase).  Called under ``_exclusive``, which every
        write of either file holds, so no write in flight loses its temp file."""
        remove_leftovers(self.unlock_path)
        remove_leftovers(self.path)

    def _sweep(self) -> None:
        """``_remove_leftovers`` at an open, when the lock can be had at once (one ``LOCK_NB``
        try: ``vault list`` and ``lock`` never wait on a holder): a reader in a directory it
        cannot write (no lock file to make) reads the vault as before."""
        try:
            with self._exclusive(wait=0):
                self._remove_leftovers()
        except VaultError:
            pass

    def _read_raw(self) -> bytes:
        # Read inside the event loop on every vault: reference: never block on a FIFO, never
        # read a device or an unbounded file (affidavit/privatefile.py).
        try:
            return read_small_file(self.path, MAX_VAULT_BYTES)[0]
        except FileMissing:
            raise VaultMissing(
                f"{self.path}: no vault file (create one with `affidavit vault init`)"
            ) from None
        except FileRefused as exc:
            raise VaultUnreadable(f"{self.path}: cannot read the vault file: {exc}") from None

    def _read_header(self) -> _Header:
        return _Header(self._read_raw())

    def _key(self, header: _Header) -> bytes:
        passphrase = os.environ.get(PASSPHRASE_ENV)
        if passphrase:
            cached = self._env_cache
            if cached and cached[0] == passphrase and cached[1] == header.raw:
                return cached[2]
            key = _derive(passphrase, header.salt, header.n_log2, header.r, header.p)
            if not hmac.compare_digest(_check_value(key), header.check):
                raise WrongPassphrase(f"{self.path}: ${PASSPHRASE_ENV} does not open this vault")
            self._env_cache = (passphrase, header.raw, key)
            return key
        try:
            blob = read_small_file(self.unlock_path, _UNLOCK_MAX_BYTES, private=True)[0]
        except FileMissing:
            raise VaultLocked(
                f"{self.path}: the vault is locked (`affidavit vault unlock` as the broker's "
                f"user){self._left_beside()}"
            ) from None
        except FileRefused as exc:
            raise VaultLocked(
                f"{self.unlock_path}: cannot read the unlock file ({exc}); unlock again"
            ) from None
        if (
            len(blob) != len(_UNLOCK_MAGIC) + _SALT_LEN + _KEY_LEN
            or blob[: len(_UNLOCK_MAGIC)] != _UNLOCK_MAGIC
        ):
            raise VaultLocked(f"{self.unlock_path}: unreadable unlock file; unlock again")
        salt = blob[len(_UNLOCK_MAGIC) : len(_UNLOCK_MAGIC) + _SALT_LEN]
        key = blob[len(_UNLOCK_MAGIC) + _SALT_LEN :]
        if salt != header.salt or not hmac.compare_digest(_check_value(key), header.check):
            # The vault was re-created (or its header edited) since the unlock: the stored key
            # belongs to another vault, so for this one we are locked.
            raise VaultLocked(f"{self.path}: the unlock key belongs to another vault; unlock again")
        return key

    def _left_beside(self) -> str:
        """What to do about an unlock file an earlier affidavit kept beside the name the vault
        was given, a link, rather than beside the file (``journal.names.refuse_left_beside``
        for the journal's files): '' when there is none."""
        old = Path(f"{self.given}.unlock")
        if old == self.unlock_path or not os.path.lexists(old):
            return ""
        return (
            f"; {old}, beside the link {self.given}, is an unlock file an earlier affidavit "
            f"kept there: unlock again and remove it (`rm {shlex.quote(str(old))}`)"
        )

    def _decrypt(self, header: _Header, key: bytes, raw: bytes) -> dict[str, dict[str, Any]]:
        body = raw[_HEADER_LEN:]
        if len(body) < _NONCE_LEN + 16:
            raise VaultCorrupt(f"{self.path}: vault file is truncated")
        nonce, ct = body[:_NONCE_LEN], body[_NONCE_LEN:]
        try:
            plain = AESGCM(key).decrypt(nonce, ct, header.raw)
        except InvalidTag:
            raise VaultCorrupt(
                f"{self.path}: vault contents failed authentication (modified or corrupted)"
            ) from None
        try:
            doc = json.loads(plain)
            entries = doc["entries"]
            if not isinstance(entries, dict):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            raise VaultCorrupt(f"{self.path}: vault payload is malformed") from None
        return entries

    def _write(self, header: _Header, key: bytes, entries: dict[str, dict[str, Any]]) -> None:
        plain = json.dumps({"entries": entries}, sort_keys=True).encode("utf-8")
        nonce = secrets.token_bytes(_NONCE_LEN)
        ct = AESGCM(key).encrypt(nonce, plain, header.raw)
        try:
            write_private_file(self.path, header.raw + nonce + ct)
        except OSError as exc:
            raise VaultWriteFailed(
                f"{self.path}: cannot write the vault file: {exc.strerror}"
            ) from None
