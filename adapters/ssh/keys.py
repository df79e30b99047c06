"""Host-key pins, OpenSSH ``known_hosts`` parsing and in-memory client credentials.

Seed, "Validation and credential injection finish before dispatch": a local key import failure is
a ``credential_injection`` error with ``not_attempted``, and credential contents never appear in
an error or a record.  The private key is imported from memory with libssh's
``ssh_pki_import_privkey_base64`` — it is never written to disk — and every message we raise is a
fixed text that cannot carry key bytes.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from typing import Any

import ssh.key

from affidavit.statemachine import Code

from .known_hosts import fingerprint, load_known_hosts, parse_pin

__all__ = [
    "CredentialInvalid",
    "SshCredential",
    "fingerprint",
    "is_public_key",
    "load_known_hosts",
    "looks_like_private_key",
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


_PUBLIC_LINE = re.compile(rb"(?:ssh-|ecdsa-sha2-|sk-)[A-Za-z0-9@.\-]+[ \t]+AAAA")
_PUBLIC_ARMOUR = re.compile(rb"-{4,5} ?BEGIN [A-Z0-9 ]*PUBLIC KEY")


def is_public_key(secret: bytes) -> bool:
    """An OpenSSH public key line (a ``.pub`` file, an ``authorized_keys`` entry, a
    certificate) or a PEM/RFC 4716 public key block."""
    head = secret.lstrip()[:256]
    return bool(_PUBLIC_LINE.match(head) or _PUBLIC_ARMOUR.match(head))


def looks_like_private_key(secret: bytes) -> bool:
    """PEM armour (``-----BEGIN … PRIVATE KEY-----``), as OpenSSH and PEM private keys have."""
    head = secret.lstrip()[:64]
    return head.startswith(b"-----BEGIN ") and b"PRIVATE KEY" in head


def prepare_credential(secret: bytes, *, kind: str = "private_key") -> SshCredential:
    """Import a private key (OpenSSH or PEM text) or wrap a password, in memory.

    ``kind``: ``"private_key"`` (the default) or ``"password"`` -- said explicitly by the target
    (``auth = "password"``), never guessed from the value: a token or a public key taken for a
    password would be sent to the remote.  Raises ``CredentialInvalid`` with a fixed message on
    any problem, before anything is sent."""
    if kind not in ("private_key", "password"):
        raise CredentialInvalid("credential kind must be private_key or password")
    if not secret:
        raise CredentialInvalid("the SSH credential is empty")
    if kind == "password":
        if b"\x00" in secret:
            raise CredentialInvalid("an SSH password cannot contain NUL bytes")
        if looks_like_private_key(secret) or is_public_key(secret):
            # A key sent as a password would hand it to the remote.
            raise CredentialInvalid(
                'the target has auth = "password" but the credential is an SSH key; '
                'remove auth = "password" to authenticate with a private key'
            )
        return SshCredential("password", None, None, bytes(secret))
    if is_public_key(secret):
        raise CredentialInvalid(
            "the SSH credential is a public key (such as a .pub file), not a private key; "
            "point credential at the private key"
        )
    if not looks_like_private_key(secret):
        raise CredentialInvalid(
            "the SSH credential is not a private key (no -----BEGIN ... PRIVATE KEY----- "
            'armour); use an OpenSSH or PEM private key, or set auth = "password" on the '
            "target to send it as a password"
        )
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
