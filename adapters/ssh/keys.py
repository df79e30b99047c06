"""Host-key pins, OpenSSH ``known_hosts`` parsing and in-memory client credentials.

Seed, "Validation and credential injection finish before dispatch": a local key import failure is
a ``credential_injection`` error with ``not_attempted``, and credential contents never appear in
an error or a record.  The private key is imported from memory with libssh's
``ssh_pki_import_privkey_base64`` — it is never written to disk — and every message we raise is a
fixed text that cannot carry key bytes.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import ssh.key

from affidavit.statemachine import Code

from .known_hosts import fingerprint, load_known_hosts, parse_pin

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
