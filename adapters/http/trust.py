"""Whom a target's TLS connections trust: its ``ca_file`` as the file holds it now, or the system
store OpenSSL was built with -- never the broker's environment.

``ssl.create_default_context`` reads the environment: ``SSLKEYLOGFILE`` (every session's
traffic secrets appended to that file, so a capture of the network decrypts the credential) and,
through OpenSSL's default paths, ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` (any bundle replacing the
system store, unchecked, while the evidence says ``"trust": "system"``).  So the context is built
here by hand (``client_context``) and ``env_ignored`` names the variables for the start-up
warning.

A CA file is read again whenever its identity moved (device, inode, ctime, mtime, size) or its
last read was too recent for the stat to vouch for the bytes (``SETTLED_NS``: one rule with the
config snapshot, adapters/filestat.py); the context is built from the bytes read and kept
per their digest, which the connection's evidence records (``ca_sha256``) and its pool key
holds: a connection made under one content is never reused for a call under another, and a file
replaced or deleted since is what the next connection sees (docs/configuration.md, ``ca_file``).
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import ssl
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass

from affidavit.adapters.filestat import SETTLED_NS, identity

__all__ = ["ENV_IGNORED", "MAX_CA_FILE", "Trust", "TrustStore", "client_context", "env_ignored"]

ENV_IGNORED = ("SSL_CERT_FILE", "SSL_CERT_DIR", "SSLKEYLOGFILE")
"""Environment variables Python's or OpenSSL's defaults would read, and the driver does not."""

MAX_CA_FILE = 16 << 20
"""A CA bundle larger than this is refused (the system's is about 200 KiB)."""

_PEM_BLOCK = re.compile(
    rb"-----BEGIN [A-Z0-9 ]+-----\r?\n[A-Za-z0-9+/=\r\n\t ]*-----END [A-Z0-9 ]+-----"
)


def env_ignored(environ: Mapping[str, str]) -> list[str]:
    """The names of ``ENV_IGNORED`` set in ``environ`` (never their values)."""
    return [name for name in ENV_IGNORED if environ.get(name)]


def client_context(cadata: str | None) -> ssl.SSLContext:
    """Verification on, the host name checked, TLS 1.2 at least, no renegotiation (a TLS 1.2
    server renegotiating mid-response would present another certificate than the one recorded),
    no key log; trusting ``cadata`` (PEM) or else OpenSSL's compiled-in store."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = True
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_RENEGOTIATION
    ctx.keylog_filename = None  # type: ignore[assignment]  # typeshed: str only; None is "off"
    if cadata is not None:
        ctx.load_verify_locations(cadata=cadata)
        return ctx
    # ``openssl_cafile`` / ``openssl_capath``, not ``cafile`` / ``capath`` (which the
    # environment overrides), nor ``set_default_verify_paths`` (which reads it).
    paths = ssl.get_default_verify_paths()
    cafile = paths.openssl_cafile if os.path.isfile(paths.openssl_cafile) else None
    capath = paths.openssl_capath if os.path.isdir(paths.openssl_capath) else None
    if cafile is not None or capath is not None:
        ctx.load_verify_locations(cafile, capath)
    return ctx


@dataclass(frozen=True, slots=True)
class Trust:
    ca_sha256: str | None
    """``sha256:<hex>`` of the CA file's bytes the context trusts (as a target's account
    records it: ``affidavit.schema.content``); None for the system store."""
    context: ssl.SSLContext


@dataclass(frozen=True, slots=True)
class _Read:
    key: tuple[int, ...]
    settled: bool
    trust: Trust


class TrustStore:
    """The ``Trust`` of each CA file path (and of the system store), read again when it moved."""

    def __init__(self) -> None:
        self._system: Trust | None = None
        self._files: dict[str, _Read] = {}
        self._contexts: dict[str, ssl.SSLContext] = {}

    def get(self, ca_file: str | None) -> Trust:
        """Raises ``OSError`` (missing, not a regular file, too large, no certificate in it) or
        ``ssl.SSLError`` (a certificate OpenSSL cannot read)."""
        if ca_file is None:
            if self._system is None:
                self._system = Trust(None, client_context(None))
            return self._system
        seen = self._files.get(ca_file)
        st = os.stat(ca_file)
        if seen is not None and seen.settled and seen.key == identity(st):
            return seen.trust
        began = time.time_ns()
        data, st = _read(ca_file)
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        context = self._contexts.get(digest)
        if context is None:
            # Only the PEM blocks, as OpenSSL reads a CA file (text around them is skipped).
            blocks = b"\n".join(_PEM_BLOCK.findall(data)).decode("ascii")
            if not blocks:
                raise OSError(errno.EINVAL, "no certificate in the CA file")
            context = self._contexts[digest] = client_context(blocks)
        trust = Trust(digest, context)
        self._files[ca_file] = _Read(identity(st), began - st.st_ctime_ns > SETTLED_NS, trust)
        if seen is not None and seen.trust.ca_sha256 != digest:  # keep one context per path
            held = {r.trust.ca_sha256 for r in self._files.values()}
            self._contexts = {d: c for d, c in self._contexts.items() if d in held}
        return trust


def _read(path: str) -> tuple[bytes, os.stat_result]:
    """The bytes of the regular file at ``path`` and its stat, without blocking on a FIFO."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        if st.st_size > MAX_CA_FILE:
            raise OSError(errno.EFBIG, "CA file too large")
        chunks = []
        left = MAX_CA_FILE + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise OSError(27, "CA file too large")
        return b"".join(chunks), st
    finally:
        os.close(fd)
