"""Signed checkpoints: the broker's Ed25519 signing key, the checkpoint it signs with every
committing transaction, public keys for auditors and the exported anchor.

Seed, "Audit integrity and outcome evidence solve different problems": a hash chain confirms that
recorded events were not altered later -- but only against someone who cannot recompute it.
Anyone who can write the journal file can edit a row and re-chain everything after it, append a
row with a fresh hash, or cut the tail.  So each transaction that appends rows also writes a
**checkpoint** -- the seq and hash of its last row, the previous checkpoint's seq and the time --
signed with a key a writer of the file does not have.  Verification needs only the public key
(``verify.py``): rows after the last valid checkpoint are unauthenticated; a re-chained edit no
longer matches the signed hash; a removed checkpoint breaks the ``prev`` links.  An **anchor**
is a checkpoint exported with its public key, to be kept elsewhere: it also catches a tail cut
back to an earlier checkpoint, which nothing inside the file can.

Nothing here knows SQLite: the message format, the key files and the anchor are the same for
every journal backend.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from affidavit.privatefile import FileId
from affidavit.statemachine.events import unfrozen_twin

from .chain import canonical_json, json_string
from .errors import JournalError
from .sealing import read_pem_key, write_secret_file

__all__ = [
    "ANCHOR_FORMAT",
    "Anchor",
    "Checkpoint",
    "SigningKey",
    "checkpoint_message",
    "key_id_of",
    "load_anchor",
    "load_public_key",
    "public_key_pem",
    "verify_signature",
]

ANCHOR_FORMAT = "affidavit-anchor-v1"
_DOMAIN = b"affidavit-checkpoint-v1\n"
_DOMAIN_TEXT = _DOMAIN.decode("ascii")


def key_id_of(public_raw: bytes) -> str:
    """A public key's fingerprint: the first 32 hex digits of SHA-256 of its 32 raw bytes."""
    return hashlib.sha256(public_raw).hexdigest()[:32]


def _raw(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def public_key_pem(public_raw: bytes) -> bytes:
    """The public key as PEM (SubjectPublicKeyInfo), for auditors and ``--public-key``."""
    return Ed25519PublicKey.from_public_bytes(public_raw).public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A signed statement "the journal's rows 1..seq hash to ``hash``"."""

    seq: int
    """The last row it covers."""
    hash: str
    """That row's chain hash."""
    prev: int
    """The seq of the checkpoint before it (0 for the first): removing one breaks the links."""
    at: float
    """When it was signed (a wall-clock label)."""
    adopted: bool
    """Written when a journal from before signing was first opened by a signing broker: rows
    1..seq were appended unsigned and rest on the hash chain alone up to ``at``."""
    key_id: str
    signature: bytes


_UnfrozenCheckpoint = unfrozen_twin(Checkpoint)
_new = object.__new__


def checkpoint_message(seq: int, hash_: str, prev: int, at: float, adopted: bool) -> bytes:
    """The exact bytes that are signed: a domain tag, then canonical JSON of the fields.

    For the types the writer signs and a reader reads back (exact ``int``, finite ``float``,
    ``str``, ``bool``) the JSON is written here directly, keys in their sorted order and each
    value as the encoder writes it -- ``int.__repr__``, ``float.__repr__``, the C string
    encoder -- instead of encoding a dict with ``sort_keys`` (issue 15: once per transaction in
    the single writer, once per checkpoint in ``verify``).  Anything else takes
    ``canonical_json`` itself, so the bytes are the encoder's in every case
    (tests/journal/test_signing_fast.py)."""
    if (
        type(seq) is int
        and type(prev) is int
        and type(at) is float
        and at - at == 0.0  # finite: canonical_json refuses NaN and Infinity
        and type(hash_) is str
        and type(adopted) is bool
    ):
        return (
            f'{_DOMAIN_TEXT}{{"adopted":{"true" if adopted else "false"},"at":{at!r},'
            f'"hash":{json_string(hash_)},"prev":{prev},"seq":{seq}}}'
        ).encode()
    body = {"adopted": adopted, "at": at, "hash": hash_, "prev": prev, "seq": seq}
    return _DOMAIN + canonical_json(body).encode("utf-8")


def verify_signature(checkpoint: Checkpoint, public_raw: bytes) -> bool:
    """Whether ``checkpoint`` is signed by the key whose raw bytes are ``public_raw``."""
    if checkpoint.key_id != key_id_of(public_raw):
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public_raw).verify(
            checkpoint.signature,
            checkpoint_message(
                checkpoint.seq, checkpoint.hash, checkpoint.prev, checkpoint.at, checkpoint.adopted
            ),
        )
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


class SigningKey:
    """The broker's Ed25519 signing key: a PEM (PKCS#8) file, mode 0600, beside the broker key.
    Only the broker reads it; verifying needs its public half alone.

    The file is read and written with ``cryptography``; the checkpoints are signed with PyNaCl
    (libsodium), issue 15: the writer signs once per transaction, and OpenSSL's Ed25519 took
    ~460k instructions (~50 µs) a signature -- ~40% of the writer thread's work per call at
    concurrency 1 -- where libsodium's takes about half, with the GIL released.  Ed25519 is
    deterministic (RFC 8032): one key signs one message one way, so the recorded checkpoints
    are the same bytes either library would write (tests/journal/test_signing_nacl.py)."""

    __slots__ = ("_priv", "_signer", "_sk", "key_id", "path", "public_raw")

    def __init__(self, private: Ed25519PrivateKey, path: Path) -> None:
        self._priv = private
        self.path = path
        self.public_raw = _raw(private.public_key())
        self.key_id = key_id_of(self.public_raw)
        # Here, not at the module's import: only a broker that signs loads libsodium (~10 ms);
        # readers -- `affidavit actions`, `journal verify`, the console -- verify with
        # cryptography alone.  The binding itself, not ``nacl.signing.SigningKey.sign``: that
        # wraps each signature in a ``SignedMessage`` and three encoder calls (issue 15: once
        # per transaction in the single writer).  ``_sk`` is libsodium's 64-byte secret key
        # (seed and public key), made from the same 32-byte seed.
        from nacl.bindings import crypto_sign, crypto_sign_seed_keypair

        raw = serialization.Encoding.Raw, serialization.PrivateFormat.Raw
        _pk, self._sk = crypto_sign_seed_keypair(
            private.private_bytes(*raw, serialization.NoEncryption())
        )
        self._signer = crypto_sign

    @classmethod
    def create(
        cls, path: str | os.PathLike[str], made: list[tuple[Path, FileId]] | None = None
    ) -> SigningKey:
        """A new key file at ``path`` (never one that is there); ``made`` gets its
        (path, ``FileId``)."""
        p = Path(path)
        priv = Ed25519PrivateKey.generate()
        pem = priv.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        try:
            ident = write_secret_file(p, pem)
        except OSError as exc:
            raise JournalError(f"cannot create signing key file {p}: {exc.strerror}") from None
        if made is not None:
            made.append((p, ident))
        return cls(priv, p)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SigningKey:
        p = Path(path)
        key: Ed25519PrivateKey = read_pem_key(p, "signing key file", Ed25519PrivateKey)
        return cls(key, p)

    def sign(self, seq: int, hash_: str, prev: int, at: float, adopted: bool = False) -> Checkpoint:
        # crypto_sign answers signature || message: the signature is its first 64 bytes.
        sig = self._signer(checkpoint_message(seq, hash_, prev, at, adopted), self._sk)[:64]
        # Built as ``stored_event`` builds an Event (``unfrozen_twin``): the frozen
        # ``__init__`` stores each of its 7 fields through ``object.__setattr__``.
        cp: Any = _new(_UnfrozenCheckpoint)
        cp.seq = seq
        cp.hash = hash_
        cp.prev = prev
        cp.at = at
        cp.adopted = adopted
        cp.key_id = self.key_id
        cp.signature = sig
        cp.__class__ = Checkpoint
        checkpoint: Checkpoint = cp
        return checkpoint


def load_public_key(path: str | os.PathLike[str]) -> bytes:
    """An Ed25519 public key file (PEM, as ``affidavit journal public-key`` writes it) as its 32
    raw bytes."""
    key: Ed25519PublicKey = read_pem_key(Path(path), "public key file", Ed25519PublicKey)
    return _raw(key)


@dataclass(frozen=True, slots=True)
class Anchor:
    """A checkpoint exported to be kept elsewhere, with the public key that signed it."""

    checkpoint: Checkpoint
    public_raw: bytes

    def to_json(self) -> dict[str, Any]:
        c = self.checkpoint
        return {
            "format": ANCHOR_FORMAT,
            "seq": c.seq,
            "hash": c.hash,
            "prev": c.prev,
            "at": c.at,
            "adopted": c.adopted,
            "key_id": c.key_id,
            "public_key": base64.b64encode(self.public_raw).decode("ascii"),
            "signature": base64.b64encode(c.signature).decode("ascii"),
        }


def load_anchor(path: str | os.PathLike[str]) -> Anchor:
    """Read an anchor file; ``JournalError`` naming the file if it is not one or its own
    signature does not hold (checking it against a trusted key is ``verify``'s job)."""
    p = Path(path)
    bad = f"anchor file {p} is not an affidavit anchor"
    try:
        data = json.loads(p.read_bytes())
    except FileNotFoundError:
        raise JournalError(f"anchor file {p} does not exist") from None
    except OSError as exc:
        raise JournalError(f"cannot read anchor file {p}: {exc.strerror}") from None
    except ValueError:
        raise JournalError(f"{bad} (not JSON)") from None
    try:
        if data["format"] != ANCHOR_FORMAT:
            raise ValueError
        seq, prev, at = data["seq"], data["prev"], data["at"]
        if type(seq) is not int or type(prev) is not int or seq < 1 or prev < 0:
            raise ValueError
        if type(at) not in (int, float) or type(data["adopted"]) is not bool:
            raise ValueError
        public_raw = base64.b64decode(data["public_key"], validate=True)
        checkpoint = Checkpoint(
            seq,
            str(data["hash"]),
            prev,
            float(at),
            data["adopted"],
            str(data["key_id"]),
            base64.b64decode(data["signature"], validate=True),
        )
    except (KeyError, TypeError, ValueError, binascii.Error):
        raise JournalError(bad) from None
    if len(public_raw) != 32 or not verify_signature(checkpoint, public_raw):
        raise JournalError(f"anchor file {p}: its signature does not hold")
    return Anchor(checkpoint, public_raw)
