"""Shared pieces of the SSH broker-level tests (``Broker.call``, the CLI, the crash test):
config targets with an ``env:`` key reference, and the canary needles of a private key."""

from __future__ import annotations

import base64
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    load_ssh_private_key,
)

KEY_ENV = "AFFIDAVIT_TEST_SSH_KEY"
"""Holds the key sshd authorises (``Sshd.client_key``)."""
OTHER_KEY_ENV = "AFFIDAVIT_TEST_SSH_OTHER_KEY"
"""Holds a valid key sshd does not authorise (``Sshd.other_key``)."""


def ssh_target(
    port: int, user: str, pin: str, *, key_env: str = KEY_ENV, **kw: Any
) -> dict[str, Any]:
    """An SSH target table for ``tests.broker.helpers.write_config``."""
    t: dict[str, Any] = {
        "kind": "ssh",
        "host": "127.0.0.1",
        "port": port,
        "user": user,
        "host_key": pin,
        "credential": f"env:{key_env}",
        "timeout": {"connect": 5, "total": 10},
    }
    t.update(kw)
    return t


def key_needles(pem: bytes) -> list[bytes]:
    """Every form of an OpenSSH private key that must never leave the broker: the whole PEM
    text, each base64 line of its body, the body joined, and the raw 32-byte ed25519 seed
    (raw, hex, base64)."""
    lines = [ln.strip() for ln in pem.strip().splitlines()]
    assert lines[0].startswith(b"-----BEGIN") and lines[-1].startswith(b"-----END")
    body = lines[1:-1]
    assert body and all(len(ln) >= 24 for ln in body)  # long enough never to match by chance
    key = load_ssh_private_key(pem, password=None)
    assert isinstance(key, Ed25519PrivateKey)
    seed = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    return [
        pem.strip(),
        *body,
        b"".join(body),
        seed,
        seed.hex().encode(),
        base64.b64encode(seed).rstrip(b"="),
    ]


def leaked(haystack: bytes, pem: bytes) -> list[bytes]:
    """The needles of ``pem`` found in ``haystack`` (empty: no leak)."""
    return [n for n in key_needles(pem) if n in haystack]
