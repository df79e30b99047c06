"""Host-key pins: parsing ``"<type> <base64>"`` pins and OpenSSH ``known_hosts`` files.

The broker compares the presented host key itself before authenticating (libssh's
``is_server_known()`` accepted a mismatched entry in our measurements), so this is the one
place that decides which keys a target pins — used by the config loader and the driver alike.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import struct

__all__ = ["fingerprint", "key_type", "known_host_keys", "load_known_hosts", "parse_pin"]


def key_type(blob: bytes) -> str:
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
    if key_type(blob) != parts[0]:
        raise ValueError(f"host key pin declares {parts[0]!r} but holds a {key_type(blob)!r} key")
    return blob


def fingerprint(blob: bytes) -> str:
    """``"<type> SHA256:<base64, unpadded>"`` exactly as ``ssh-keygen -l`` prints it."""
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    return f"{key_type(blob)} SHA256:{digest}"


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


def known_host_keys(text: str, host: str, port: int) -> tuple[str, ...]:
    """Pins for ``host``:``port`` in OpenSSH ``known_hosts`` text, sorted.

    Plain and ``[host]:port`` entries and hashed ``|1|`` entries are understood.
    ``@cert-authority`` lines are not pins and are skipped.  A key listed under ``@revoked`` is
    removed from the result whatever host pattern revoked it: OpenSSH refuses a revoked key, and
    a pin set must never contain one.  Malformed lines are skipped (they pin nothing)."""
    # ssh lowercases the host name before the lookup, and ``ssh-keygen -H`` hashes it so.
    host = host.lower()
    names = (host,) if port == 22 else (f"[{host.strip('[]')}]:{port}",)
    pins: set[str] = set()
    revoked: set[bytes] = set()
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        marker = parts.pop(0) if parts[0].startswith("@") else None
        if len(parts) < 3:
            continue
        pin = f"{parts[1]} {parts[2]}"
        try:
            blob = parse_pin(pin)
        except ValueError:
            continue
        if marker == "@revoked":
            revoked.add(blob)
        elif marker is None and _host_matches(parts[0], names):
            pins.add(pin)
    return tuple(sorted(p for p in pins if parse_pin(p) not in revoked))


def load_known_hosts(path: str, host: str, port: int) -> tuple[str, ...]:
    """``known_host_keys`` of a file."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        return known_host_keys(fh.read(), host, port)
