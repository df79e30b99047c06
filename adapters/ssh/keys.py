"""Host-key pins, OpenSSH ``known_hosts`` parsing and in-memory client credentials.

Seed, "Validation and credential injection finish before dispatch": a local key import failure is
a ``credential_injection`` error with ``not_attempted``, and credential contents never appear in
an error or a record.  The private key is imported from memory with libssh's
``ssh_pki_import_privkey_base64`` — it is never written to disk — and every message we raise is a
fixed text that cannot carry key bytes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import struct
from dataclasses import dataclass, field
from typing import Any

import ssh.key

from affidavit.statemachine import Code

__all__ = [
    "CredentialInvalid",
    "SshCredential",
    "fingerprint",
    "load_known_hosts",
    "parse_pin",
    "prepare_credential",
]


class CredentialInvalid(ValueError):
    """The secret exists but cannot be used as an SSH credential.  The message is fixed text."""

    code = Code.CREDENTIAL_INVALID

    def __init__(self, message: str) -> None:
        super().__init__(message)


def _blob_type(blob: bytes) -> str:
    """The key type named inside an SSH public key blob (RFC 4253 §6.6: string type, ...)."""
    if len(blob) < 4:
        raise ValueError("public key blob too short")
    (n,) = struct.unpack(">I", blob[:4])
    if n == 0 or n > 64 or len(blob) < 4 + n:
        raise ValueError("public key blob has a malformed type field")
    return blob[4 : 4 + n].decode("ascii")


def parse_pin(pin: str) -> bytes:
    """``"ssh-ed25519 AAAA… [comment]"`` -> the raw public key blob.

    Raises ``ValueError`` naming the problem when the pin is malformed or its declared type does
    not match the type inside the blob (a pasted key of another algorithm is a config error)."""
    parts = pin.split()
    if len(parts) < 2:
        raise ValueError("host key pin must be '<type> <base64>' as in known_hosts")
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except binascii.Error as exc:
        raise ValueError("host key pin is not valid base64") from exc
    if _blob_type(blob) != parts[0]:
        raise ValueError(f"host key pin declares {parts[0]!r} but holds a {_blob_type(blob)!r} key")
    return blob


def fingerprint(blob: bytes) -> str:
    """``"<type> SHA256:<base64, unpadded>"`` exactly as ``ssh-keygen -l`` prints it."""
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    return f"{_blob_type(blob)} SHA256:{digest}"


def _wildcard(pattern: str) -> re.Pattern[str]:
    """OpenSSH's ``match_pattern``: only ``*`` and ``?`` are special (``[`` is literal, as in
    ``[host]:port``), case-insensitive."""
    body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(body, re.IGNORECASE | re.DOTALL)


def _host_matches(field_: str, names: tuple[str, ...]) -> bool:
    """OpenSSH host field semantics: comma-separated patterns, ``!`` negates, ``*``/``?``
    wildcards, ``|1|salt|hash`` is HMAC-SHA1(salt, name) (ssh-keygen -H)."""
    if field_.startswith("|1|"):
        try:
            _, _, salt_b64, hash_b64 = field_.split("|")
            salt = base64.b64decode(salt_b64, validate=True)
            want = base64.b64decode(hash_b64, validate=True)
        except (ValueError, binascii.Error):
            return False
        return any(
            hmac.compare_digest(hmac.new(salt, n.encode(), hashlib.sha1).digest(), want)
            for n in names
        )
    matched = False
    for pattern in field_.split(","):
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        if any(_wildcard(pat).fullmatch(n) for n in names):
            if negate:
                return False
            matched = True
    return matched


def load_known_hosts(path: str, host: str, port: int) -> tuple[str, ...]:
    """Pins for ``host``:``port`` from an OpenSSH ``known_hosts`` file.

    Plain and ``[host]:port`` entries and hashed ``|1|`` entries are understood.  ``@revoked`` and
    ``@cert-authority`` lines are not pins and are skipped; a key that appears under ``@revoked``
    is removed from the result, because OpenSSH refuses it whatever else the file says."""
    names = (host,) if port == 22 else (f"[{host}]:{port}",)
    pins: list[str] = []
    revoked: set[bytes] = set()
    with open(path, encoding="utf-8") as fh:
        for raw in fh:
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            marker = parts.pop(0) if parts[0].startswith("@") else None
            if len(parts) < 3 or not _host_matches(parts[0], names):
                continue
            pin = f"{parts[1]} {parts[2]}"
            try:
                blob = parse_pin(pin)
            except ValueError:
                continue
            if marker == "@revoked":
                revoked.add(blob)
            elif marker is None and pin not in pins:
                pins.append(pin)
    return tuple(p for p in pins if parse_pin(p) not in revoked)


@dataclass(frozen=True, repr=False, eq=False)
class SshCredential:
    """An imported private key or a password, held only in memory.

    ``repr``/``str`` show the kind and, for keys, the public fingerprint — never the secret."""

    kind: str
    """``"private_key"`` or ``"password"``"""
    public_fingerprint: str | None = None
    _key: Any = field(default=None, compare=False)
    _password: bytes | None = field(default=None, compare=False)

    def __repr__(self) -> str:
        fp = f", {self.public_fingerprint}" if self.public_fingerprint else ""
        return f"SshCredential({self.kind}{fp})"

    __str__ = __repr__


def prepare_credential(secret: bytes, *, kind: str = "auto") -> SshCredential:
    """Import a private key (OpenSSH or PEM text) or wrap a password, in memory.

    ``kind``: ``"auto"`` (PEM armour means a key, anything else a password), ``"private_key"`` or
    ``"password"``.  Raises ``CredentialInvalid`` with a fixed message on any problem."""
    if kind not in ("auto", "private_key", "password"):
        raise CredentialInvalid("credential kind must be auto, private_key or password")
    if not secret:
        raise CredentialInvalid("the SSH credential is empty")
    if kind == "auto":
        kind = "private_key" if secret.lstrip().startswith(b"-----BEGIN ") else "password"
    if kind == "password":
        if b"\x00" in secret:
            raise CredentialInvalid("an SSH password cannot contain NUL bytes")
        return SshCredential("password", None, None, bytes(secret))
    imported: tuple[Any, str] | None = None
    try:
        key = ssh.key.import_privkey_base64(bytes(secret), passphrase=b"")
        pub = key.export_privkey_to_pubkey()
        imported = (key, fingerprint(base64.b64decode(pub.export_pubkey_base64())))
    except Exception:
        imported = None
    if imported is None:
        # Raised outside the ``except`` so not even ``__context__`` links the library error.
        raise CredentialInvalid(
            "the SSH private key could not be imported (unrecognised format, corrupt, or "
            "passphrase-protected)"
        )
    key, fp = imported
    if not key.is_private():
        raise CredentialInvalid("the SSH credential is a public key, not a private key")
    return SshCredential("private_key", fp, key, None)
