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

import contextlib
import errno
import hashlib
import os
import re
import ssl
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from affidavit.adapters.filestat import SETTLED_NS, identity, read_regular, stat_key
from affidavit.adapters.filethread import off_loop

__all__ = [
    "ENV_IGNORED",
    "SYSTEM_STORE_EMPTY",
    "Trust",
    "TrustStore",
    "TrustedCertificate",
    "client_context",
    "env_ignored",
    "pem_certificates",
    "start_warnings",
    "system_anchors",
]

ENV_IGNORED = ("SSL_CERT_FILE", "SSL_CERT_DIR", "SSLKEYLOGFILE")
"""Environment variables Python's or OpenSSL's defaults would read, and the driver does not."""

_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----\r?\n[A-Za-z0-9+/=\r\n\t ]*-----END \1-----")

TRUSTED_CERTIFICATE = (
    "holds a TRUSTED CERTIFICATE block (OpenSSL's trust-settings format, `openssl x509 "
    "-trustout`), which the broker does not read: its trust settings would be dropped or the "
    "block skipped; write the plain certificates (`openssl x509 -in FILE -out FILE.pem`)"
)
NO_CERTIFICATE = "holds no PEM certificate (-----BEGIN CERTIFICATE-----)"


class TrustedCertificate(ValueError):
    """A CA file holding a ``TRUSTED CERTIFICATE`` block (``TRUSTED_CERTIFICATE``)."""


VERIFY_FLAGS = ssl.VerifyFlags.VERIFY_X509_PARTIAL_CHAIN | (
    ssl.VerifyFlags.VERIFY_X509_STRICT if sys.version_info >= (3, 13) else 0
)
"""PARTIAL_CHAIN on every version: a chain verified once it reaches any certificate the store
holds -- a ``ca_file`` holding an intermediate or the server's own certificate (a pinned leaf)
is trusted as given.  STRICT (RFC 5280 checks on every certificate of the chain) exactly where
Python's own ``create_default_context`` sets it, from 3.13 on: before, a private CA made with
``openssl req -x509`` and the stock openssl.cnf (no keyUsage, basicConstraints not critical)
verifies, as it does for any Python client on that version (docs/configuration.md)."""


def env_ignored(environ: Mapping[str, str]) -> list[str]:
    """The names of ``ENV_IGNORED`` set in ``environ`` (never their values)."""
    return [name for name in ENV_IGNORED if environ.get(name)]


def start_warnings(environ: Mapping[str, str], system_store_used: bool) -> list[str]:
    """The operator's start-up warnings about TLS trust: each ``ENV_IGNORED`` variable set (its
    name, never its value: a path of the operator's), and -- when some target relies on the
    system store (``system_store_used``) -- that store holding no CA certificate
    (``system_anchors``), whose every call is then refused naming it."""
    words = [
        f"{name} is set and ignored: HTTPS targets trust their ca_file or the system store "
        "OpenSSL was built with, never a bundle or key log the environment names"
        for name in env_ignored(environ)
    ]
    if system_store_used and not system_anchors():
        words.append(f"HTTPS targets without a ca_file will fail: {SYSTEM_STORE_EMPTY}")
    return words


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
    ctx.verify_flags |= VERIFY_FLAGS
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


def pem_certificates(data: bytes) -> str:
    """The PEM certificates of a CA file's bytes, as OpenSSL reads them (text around the blocks
    skipped); ``TrustedCertificate`` when it holds a block the context would not load as its
    file path would (the config refuses it at load: protocols/http/target.py), ``ValueError``
    (``NO_CERTIFICATE``) when it holds no certificate (refused at the handshake)."""
    blocks = []
    for m in _PEM_BLOCK.finditer(data):
        label = m.group(1)
        if label == b"TRUSTED CERTIFICATE":
            raise TrustedCertificate(TRUSTED_CERTIFICATE)
        if label in (b"CERTIFICATE", b"X509 CERTIFICATE"):  # (the old label OpenSSL reads)
            blocks.append(m.group(0))
    if not blocks:
        raise ValueError(NO_CERTIFICATE)
    return b"\n".join(blocks).decode("ascii")


SYSTEM_STORE_EMPTY = (
    "the broker's system trust store (the one OpenSSL was built with) holds no CA "
    "certificate, so it vouches for no server: give the target a ca_file, or install the "
    "system's CA certificates"
)

_HASHED_NAME = re.compile(r"[0-9a-f]{8}\.[0-9]+")


def system_anchors(built: ssl.SSLContext | None = None) -> bool:
    """Whether OpenSSL's compiled-in store holds any CA certificate: its ``openssl_cafile``
    loads at least one (counted in ``built``, a ``client_context(None)``, when given: the
    bundle is not loaded twice), or its ``openssl_capath`` holds a hashed name (``c_rehash``)
    -- looked up lazily by OpenSSL, so counted by name, not loaded."""
    paths = ssl.get_default_verify_paths()
    if built is None and os.path.isfile(paths.openssl_cafile):
        built = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        with contextlib.suppress(OSError, ssl.SSLError):  # unreadable: no anchors from it
            built.load_verify_locations(paths.openssl_cafile)
    if built is not None and built.cert_store_stats()["x509_ca"]:
        return True
    try:
        names = os.listdir(paths.openssl_capath)
    except OSError:
        return False
    return any(_HASHED_NAME.fullmatch(name) for name in names)


@dataclass(frozen=True, slots=True)
class Trust:
    ca_sha256: str | None
    """``sha256:<hex>`` of the CA file's bytes the context trusts (as a target's account
    records it: ``affidavit.schema.content``); None for the system store."""
    context: ssl.SSLContext
    empty: bool = False
    """The system store holding no CA certificate (``system_anchors``): the handshake is
    refused as the broker's fault (``SYSTEM_STORE_EMPTY``), not blamed on the peer."""


@dataclass(frozen=True, slots=True)
class _Read:
    key: tuple[int, ...]
    settled: bool
    trust: Trust


class TrustStore:
    """The ``Trust`` of each CA file path (and of the system store), read again when it moved.
    ``resolve`` on the event loop: the stat and the read (and the system bundle's first load)
    in one worker thread; ``get`` itself may run in several threads at once (the lock guards the
    dictionaries only, never a stat or a read: a file on a hung network mount blocks its own
    call, abandoned at its deadline, and never the loop)."""

    def __init__(self) -> None:
        self._system: Trust | None = None
        self._files: dict[str, _Read] = {}
        self._contexts: dict[str, ssl.SSLContext] = {}
        self._lock = threading.Lock()

    async def resolve(self, ca_file: str | None) -> Trust:
        """``get`` in a file thread (``adapters.filethread``: its own limiter, one per path at a
        time, given up on cancellation): even the stat that says whether the file moved
        (``held``) stays off the loop -- a stat on a hung network mount blocks like a read
        (what a hop costs beside a stat on the loop: tests/benchmarks/ca_file_lookup.py).
        The system store, once loaded, costs no hop."""
        if ca_file is None and self._system is not None:
            return self._system
        paths = () if ca_file is None else (ca_file,)
        return await off_loop(("trust", id(self), ca_file), paths, lambda: self.get(ca_file))

    def held(self, ca_file: str | None) -> Trust | None:
        """The ``Trust`` the last read made when the file's stat vouches for it, else None (a
        stat failing says None too: ``get`` reports it).  Blocking: a worker thread's."""
        if ca_file is None:
            return self._system
        seen = self._files.get(ca_file)
        if seen is None or not seen.settled:
            return None
        return seen.trust if seen.key == stat_key(ca_file) else None

    def get(self, ca_file: str | None) -> Trust:
        """Raises ``OSError`` (missing, not a regular file, too large, no certificate in it, a
        TRUSTED CERTIFICATE block: ``pem_certificates``) or ``ssl.SSLError`` (a certificate
        OpenSSL cannot read)."""
        held = self.held(ca_file)
        if held is not None:
            return held
        if ca_file is None:
            system = client_context(None)
            built = Trust(None, system, not system_anchors(system))
            with self._lock:
                if self._system is None:
                    self._system = built
                return self._system
        began = time.time_ns()
        data, st = read_regular(ca_file)
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        context = self._contexts.get(digest)
        if context is None:
            try:
                blocks = pem_certificates(data)
            except ValueError as e:
                raise OSError(errno.EINVAL, str(e)) from None
            context = client_context(blocks)
        with self._lock:
            context = self._contexts.setdefault(digest, context)
            trust = Trust(digest, context)
            seen = self._files.get(ca_file)
            self._files[ca_file] = _Read(identity(st), began - st.st_ctime_ns > SETTLED_NS, trust)
            if seen is not None and seen.trust.ca_sha256 != digest:  # one context per path
                kept = {r.trust.ca_sha256 for r in self._files.values()}
                self._contexts = {d: c for d, c in self._contexts.items() if d in kept}
        return trust
