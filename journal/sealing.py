"""Sealing: AEAD for payloads and results, and write-only audit copies.

Two keys (DESIGN, "Journal"):

* the **broker key** — 32 random bytes in a 0600 file — seals what the broker must read back
  (stored results, payloads).  AES-256-GCM, random 96-bit nonce, associated data binding the
  ciphertext to its place so a sealed blob moved to another row does not open: an event payload
  to its event (invocation, kind, seq: sealed by the single writer, which assigns the seq --
  ``UnsealedPayload``), a result chunk to its invocation, stream and index (the chained marker
  lists each sealed chunk's SHA-256, so one moved from another attempt is refused by its hash).
* the optional **auditor public key** (X25519).  Each audit copy is sealed to it with an
  ephemeral X25519 key (ECIES: X25519 -> HKDF-SHA256 -> AES-256-GCM), so the broker can append
  what it cannot read back — Sallyport's write-only journal.

A wrong key is a ``SealUnopened`` naming the key file, never garbage plaintext.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from affidavit.privatefile import (
    FileExposed,
    FileId,
    FileMissing,
    FileRefused,
    read_small_file,
    remove_leftovers,
    write_private_file,
)

from .errors import JournalError, SealUnopened

__all__ = [
    "AuditOpener",
    "AuditSealer",
    "BrokerKey",
    "UnsealedPayload",
    "chunk_aad",
    "event_payload_aad",
    "generate_auditor_keypair",
    "load_auditor_private_key",
    "open_audit",
    "open_audit_payload",
    "payload_aad",
    "random_bytes",
    "read_pem_key",
    "read_secret_file",
    "summary_aad",
    "write_secret_file",
]

_KEY_HEADER = "affidavit-journal-key-v1 "
MAX_KEY_FILE_BYTES = 1 << 20
"""The most of a key file read (a broker key is 70 bytes, a PEM Ed25519 or X25519 key about
120): a larger file is no key, and is refused before it is read."""
_BROKER_V1 = b"\x01"
_AUDIT_V1 = b"\x02"
_BROKER_EVENT = b"\x03"
"""A broker-key blob of an event payload bound to its seq (``event_payload_aad``); ``_BROKER_V1``
payloads, bound to their invocation and kind alone, are the journals written before it."""
_NONCE = 12
_POOL_BYTES = 4096


class _RandomPool:
    """Random bytes from the OS in 4 KiB draws, handed out in slices: the nonces (and the ids)
    of one call cost one slice each instead of one ``os.urandom`` each.  Every byte handed out
    is fresh OS randomness used once -- the same random 96-bit nonces as a draw per seal, not a
    counter.  A draw per seal cost ~114 us under GIL contention (``getrandom`` releases the GIL
    and the journal writer thread takes it; 0.9 us alone, issue 15).  A forked child starts
    with an empty pool: it must never hand out the bytes its parent will."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._lock = threading.Lock()  # the trio thread and the writer thread both seal
        self._buf = b""
        self._pos = 0

    def take(self, n: int) -> bytes:
        with self._lock:
            pos = self._pos
            end = pos + n
            if end > len(self._buf):
                self._buf = os.urandom(max(_POOL_BYTES, n))
                pos, end = 0, n
            self._pos = end
            return self._buf[pos:end]


random_bytes = _RandomPool().take
"""``random_bytes(n)``: ``n`` fresh random bytes from the OS (see ``_RandomPool``)."""


def write_secret_file(path: Path, data: bytes, *, mode: int = 0o600) -> FileId:
    """A new key file, durably: never replacing one (``FileExistsError``), 0600 from the first
    byte (a public key's ``mode`` 0644 whatever the umask), its directory fsynced -- the journal
    records the key's id with ``synchronous=FULL``, so a crash must not keep the journal and
    lose its key -- and nothing left behind by a write that fails
    (``privatefile.write_private_file``: on Linux an unnamed file linked into place, so a
    crash leaves none).  A temp file an earlier creation's crash left beside it (where that
    could not be used) is removed first (``privatefile.remove_leftovers``): it may hold a
    private key.  One process creates a key file at a time (a journal's inside its first write
    transaction; an auditor pair by the operator's command), so no write of it is in flight.
    Answers the new file's ``FileId``."""
    remove_leftovers(path)
    return write_private_file(path, data, replace=False, mode=mode)


def read_secret_file(path: Path, what: str, *, private: bool = True) -> bytes:
    """The contents of a key file (``what``: ``broker key file``, ``signing key file``, ...),
    read as a credential is (``affidavit.privatefile.read_small_file``, ``private``): one rule
    for every secret the broker reads from a file.  Refused (``JournalError``, naming ``what``
    and the path, never a byte of it) when anyone but this user -- or root -- may read it: by
    its mode bits or, with a POSIX access ACL (whose mask the group bits then are), by an entry
    naming another user, a group or the owning group -- each with the ``setfacl`` that takes it
    away; or when another user than this one or root owns it.  Root's file lent to this user by
    an ACL entry (systemd's ``LoadCredential=``) is read.  Never blocks (a FIFO is refused) and
    reads at most ``MAX_KEY_FILE_BYTES``.  ``private=False``: a public key's file, any small
    regular file, refused only as missing or unreadable, with the same words."""
    try:
        data, _ = read_small_file(
            path, MAX_KEY_FILE_BYTES, private=private, subject=f"{what} {path}"
        )
    except FileMissing:
        raise JournalError(
            f"{what} {path} does not exist", public=f"{what} does not exist"
        ) from None
    except FileExposed as exc:  # (a caller is told neither the path nor a uid: ``told``)
        raise JournalError(str(exc), public=what + exc.public.removeprefix("file")) from None
    except FileRefused as exc:
        raise JournalError(
            f"cannot read {what} {path}: {exc}", public=f"cannot read {what}: {exc.public}"
        ) from None
    return data


_LABELS = 256
"""How many labels' keyed states a ``BrokerKey`` keeps (a config reloaded with new credential
references adds labels: the cache starts over rather than grow)."""


class BrokerKey:
    """The broker's own symmetric key."""

    __slots__ = ("_aead", "_digesters", "_mac_key", "key_id", "path")

    def __init__(self, key: bytes, path: Path) -> None:
        self.path = path
        self._aead = AESGCM(key)
        # A key of its own for ``digest`` (never the AEAD key itself), derived from this one.
        self._mac_key = hmac.new(key, b"affidavit-keyed-digest-v1", hashlib.sha256).digest()
        self.key_id = hashlib.sha256(b"affidavit-key-id\0" + key).hexdigest()[:32]
        """A public fingerprint of the key, stored in the journal to detect a wrong key file."""
        self._digesters: dict[str, Callable[[bytes], str]] = {}
        """``digester`` of each label ``digest`` was asked for: the code's own labels and one per
        configured credential reference (``credential-version:<ref>``), bounded (``_LABELS``)."""

    @classmethod
    def create(
        cls, path: str | os.PathLike[str], made: list[tuple[Path, FileId]] | None = None
    ) -> BrokerKey:
        """A new key file at ``path`` (never one that is there); ``made`` gets its
        (path, ``FileId``)."""
        p = Path(path)
        key = AESGCM.generate_key(bit_length=256)
        try:
            ident = write_secret_file(
                p, (_KEY_HEADER + base64.b64encode(key).decode() + "\n").encode()
            )
        except OSError as exc:
            raise JournalError(
                f"cannot create broker key file {p}: {exc.strerror}",
                public=f"cannot create broker key file: {exc.strerror}",
            ) from None
        if made is not None:
            made.append((p, ident))
        return cls(key, p)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> BrokerKey:
        p = Path(path)
        raw = read_secret_file(p, "broker key file")
        try:
            text = raw.decode("ascii").strip()
            if not text.startswith(_KEY_HEADER):
                raise ValueError
            key = base64.b64decode(text[len(_KEY_HEADER) :], validate=True)
            if len(key) != 32:
                raise ValueError
        except ValueError:
            raise JournalError(
                f"broker key file {p} is not an affidavit journal key",
                public="broker key file is not an affidavit journal key",
            ) from None
        return cls(key, p)

    def digest(self, label: str, data: bytes) -> str:
        """HMAC-SHA256 of ``data`` under ``label``, keyed by this key (hex): it changes with
        the data, yet says nothing of it to whoever lacks the key -- not even of a short,
        guessable secret, which a plain hash would give away to a dictionary."""
        # The label's keyed state is made once and copied per call (``digester``): an ``env:``
        # credential's version is digested on every call, and OpenSSL 3's one-shot
        # ``hmac.digest`` sets the whole HMAC up each time -- ~29k instructions against ~22k
        # (callgrind; issue 15).  The same bytes: ``hmac.new(key, label + b"\0" + data)``.
        digester = self._digesters.get(label)
        if digester is None:
            if len(self._digesters) >= _LABELS:
                self._digesters.clear()
            digester = self._digesters[label] = self.digester(label)
        return digester(data)

    def digester(self, label: str) -> Callable[[bytes], str]:
        """``digest`` under ``label`` as one function of the data: the keyed state after the
        label is made once and copied per call (a view tags a page of records with it)."""
        base = hmac.new(self._mac_key, label.encode("utf-8") + b"\0", hashlib.sha256)

        def digest(data: bytes) -> str:
            mac = base.copy()
            mac.update(data)
            return mac.hexdigest()

        return digest

    def seal(self, data: bytes, aad: bytes, version: bytes = _BROKER_V1) -> bytes:
        nonce = random_bytes(_NONCE)
        return version + nonce + self._aead.encrypt(nonce, data, aad)

    def open(self, sealed: bytes, aad: bytes, version: bytes = _BROKER_V1) -> bytes:
        if sealed[:1] != version or len(sealed) < 1 + _NONCE + 16:
            raise SealUnopened(f"sealed blob is not a broker-key blob (key file {self.path})")
        try:
            return self._aead.decrypt(sealed[1 : 1 + _NONCE], sealed[1 + _NONCE :], aad)
        except InvalidTag:
            raise SealUnopened(
                f"sealed data does not open with broker key file {self.path} "
                "(wrong key, or the row was altered)"
            ) from None

    def seal_payload(self, data: bytes, invocation_id: str, kind: str, seq: int) -> bytes:
        """An event payload sealed to its event: ``event_payload_aad``, marked ``_BROKER_EVENT``."""
        return self.seal(data, event_payload_aad(invocation_id, kind, seq), _BROKER_EVENT)

    def open_payload(self, sealed: bytes, invocation_id: str, kind: str, seq: int) -> bytes:
        """Open an event's payload by the form its first byte says it was sealed in: bound to
        the event (``seal_payload``), or -- a journal written before that -- to its invocation
        and kind alone.  Never one form after the other: a payload sealed to its event and
        relabelled as the old form does not open (its associated data is not the old form's),
        and one moved to another event does not either.  ``JournalError`` otherwise."""
        if sealed[:1] == _BROKER_EVENT:
            return self.open(sealed, event_payload_aad(invocation_id, kind, seq), _BROKER_EVENT)
        return self.open(sealed, payload_aad(invocation_id, kind))


class UnsealedPayload:
    """An event payload's canonical JSON, sealed with the broker key by the single writer once
    the event's seq is assigned (``Txn.insert``): the seq is what tells two events of one
    invocation and kind apart, and it is known only there.  One AES-GCM seal per payload,
    moved from the submitting task to the writer thread, not added (issue 15)."""

    __slots__ = ("data", "key")

    def __init__(self, key: BrokerKey, data: bytes) -> None:
        self.key = key
        self.data = data

    def seal(self, invocation_id: str, kind: str, seq: int) -> bytes:
        return self.key.seal_payload(self.data, invocation_id, kind, seq)


def _derive(shared: bytes, eph_pub: bytes, recipient_pub: bytes) -> bytes:
    return HKDF(
        algorithm=hashes.SHA256(),
        length=32,
        salt=eph_pub + recipient_pub,
        info=b"affidavit-audit-v1",
    ).derive(shared)


def _raw_public(key: X25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


class AuditSealer:
    """Seals to the auditor's X25519 public key.  Holds no secret: the broker cannot open what
    it seals."""

    __slots__ = ("_pub", "_raw", "path")

    def __init__(self, public_key: X25519PublicKey, path: Path) -> None:
        self._pub = public_key
        self._raw = _raw_public(public_key)
        self.path = path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> AuditSealer:
        p = Path(path)
        key: X25519PublicKey = read_pem_key(p, "auditor public key file", X25519PublicKey)
        return cls(key, p)

    def seal(self, data: bytes, aad: bytes) -> bytes:
        eph = X25519PrivateKey.generate()
        eph_pub = _raw_public(eph.public_key())
        key = _derive(eph.exchange(self._pub), eph_pub, self._raw)
        nonce = random_bytes(_NONCE)
        return _AUDIT_V1 + eph_pub + nonce + AESGCM(key).encrypt(nonce, data, aad)


def load_auditor_private_key(path: str | os.PathLike[str]) -> X25519PrivateKey:
    key: X25519PrivateKey = read_pem_key(Path(path), "auditor private key file", X25519PrivateKey)
    return key


def read_pem_key(path: Path, what: str, kind: type) -> Any:
    """A PEM key file holding a key of ``kind`` (an instance of it, typed by the caller): a
    private key is read as a secret file, a public one as any small regular file (both
    ``read_secret_file``: at most ``MAX_KEY_FILE_BYTES``).
    ``JournalError`` naming ``what`` and the file otherwise."""
    private = kind in (X25519PrivateKey, Ed25519PrivateKey)
    raw = read_secret_file(path, what, private=private)  # never blocks, nor reads unbounded
    try:
        if private:
            key: object = serialization.load_pem_private_key(raw, password=None)
        else:
            key = serialization.load_pem_public_key(raw)
    except (ValueError, TypeError):
        sort = "private" if private else "public"
        raise JournalError(
            f"{what} {path} is not a PEM {sort} key", public=f"{what} is not a PEM {sort} key"
        ) from None
    if not isinstance(key, kind):
        label = kind.__name__.replace("PrivateKey", "").replace("PublicKey", "")
        raise JournalError(
            f"{what} {path} is not an {label} key", public=f"{what} is not an {label} key"
        )
    return key


class AuditOpener:
    """The auditor's side: opens audit copies with the auditor's X25519 private key (kept off
    the broker host; the broker never holds one)."""

    __slots__ = ("_priv", "_raw", "path")

    def __init__(self, private_key: X25519PrivateKey, path: Path) -> None:
        self._priv = private_key
        self._raw = _raw_public(private_key.public_key())
        self.path = path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> AuditOpener:
        return cls(load_auditor_private_key(path), Path(path))

    def open(self, sealed: bytes, aad: bytes) -> bytes:
        if sealed[:1] != _AUDIT_V1 or len(sealed) < 1 + 32 + _NONCE + 16:
            raise SealUnopened(f"sealed blob is not an audit copy (auditor key file {self.path})")
        eph_pub = sealed[1:33]
        nonce = sealed[33 : 33 + _NONCE]
        try:
            shared = self._priv.exchange(X25519PublicKey.from_public_bytes(eph_pub))
            return AESGCM(_derive(shared, eph_pub, self._raw)).decrypt(
                nonce, sealed[33 + _NONCE :], aad
            )
        except (InvalidTag, ValueError):
            raise SealUnopened(
                f"audit copy does not open with auditor key file {self.path} "
                "(wrong key, or the row was altered)"
            ) from None


def open_audit(sealed: bytes, private_key_file: str | os.PathLike[str], aad: bytes) -> bytes:
    """Open an audit copy with the auditor's private key (the auditor's side, not the broker's)."""
    return AuditOpener.load(private_key_file).open(sealed, aad)


def generate_auditor_keypair(
    private_path: str | os.PathLike[str], public_path: str | os.PathLike[str]
) -> None:
    """Write a new auditor key pair: the private key 0600 (keep it off the broker host), the
    public key 0644 whatever the umask (``Journal.open(auditor_public_key=...)`` refuses a trust
    anchor others may write).  Neither file is overwritten (``FileExistsError``): a public key
    that cannot be created takes the new private key away again, so no half pair is left.
    ``ValueError`` when both paths name the same file (the public key would overwrite the
    private one, lost)."""
    private, public = Path(private_path), Path(public_path)
    if private.resolve() == public.resolve():
        raise ValueError(f"{private} and {public} name the same file: the public key would "
                         "overwrite the private one")  # fmt: skip
    priv = X25519PrivateKey.generate()
    write_secret_file(
        private,
        priv.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    pem = priv.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    try:
        write_secret_file(public, pem, mode=0o644)
    except BaseException:
        private.unlink()  # the file made above: no private key without its public half
        raise


# -- associated data: where a sealed blob belongs -----------------------------------------------


def _aad(*parts: str | int) -> bytes:
    return "\0".join(str(p) for p in parts).encode("utf-8")


def payload_aad(invocation_id: str, kind: str) -> bytes:
    """Associated data of an event payload's audit copy, and of a broker copy written before
    ``event_payload_aad`` (a ``_BROKER_V1`` blob).  The audit copy is sealed in the submitting
    task (an X25519 exchange each: not in the single writer) and handed to the auditor only
    from a row proven against a signed checkpoint (``JournalReader.audit_copy``)."""
    return _aad("payload", invocation_id, kind)


def event_payload_aad(invocation_id: str, kind: str, seq: int) -> bytes:
    """Associated data of an event payload's broker copy: bound to the event, its seq included,
    so it does not open in another event of the same invocation and kind."""
    return _aad("payload-event", invocation_id, kind, seq)


def chunk_aad(invocation_id: str, stream: str, index: int) -> bytes:
    """Associated data of one stored result chunk."""
    return _aad("result", invocation_id, stream, index)


def summary_aad(invocation_id: str) -> bytes:
    """Associated data of a stored result's summary (status, headers, exit status)."""
    return _aad("summary", invocation_id)


def open_audit_payload(
    sealed: bytes, private_key_file: str | os.PathLike[str], invocation_id: str, kind: str
) -> Mapping[str, Any]:
    """The auditor's side: open an event's audit copy with the auditor's private key."""
    data = open_audit(sealed, private_key_file, payload_aad(invocation_id, kind))
    value: Mapping[str, Any] = json.loads(data)
    return value
