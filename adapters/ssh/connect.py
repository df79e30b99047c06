"""Connection setup: DNS, TCP, the SSH transport, the host key, user auth, the session channel.

Everything before dispatch; every failure here fires ``setup_failed`` on the protocol machine
and raises ``SetupError`` -- no command has been requested.  trio resolves and connects the TCP
socket itself (libssh would resolve names inside ``ssh_connect`` and block the loop), sets
TCP_NODELAY (Nagle cost ~45 ms per round trip), then hands the fd to libssh, which owns and
closes it.  ``Connection`` also holds what later phases need of the connection: the verified
host key (``key_changed``) and the bounded, shielded ``close``.
"""

from __future__ import annotations

import base64
import contextlib
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

import ssh.exceptions
import ssh.options
import ssh.session
import trio

from affidavit.adapters.base import AttemptContext, SetupError
from affidavit.statemachine import Code

from .keys import SshCredential, fingerprint, parse_pin
from .known_hosts import key_type
from .libssh import SSH_AUTH_AGAIN, SSH_AUTH_SUCCESS, Io, describe, text

__all__ = [
    "Connection",
    "SshTarget",
    "SshTimeouts",
    "fire",
    "hostkey_algorithms",
    "no_pinned_key_type",
    "open_tcp",
]

_CLEANUP_SECONDS = 1.0


@dataclass(frozen=True)
class SshTimeouts:
    connect: float = 10.0
    """name resolution + TCP connect + SSH transport handshake"""
    auth: float = 10.0
    """user authentication + session channel open"""
    exec: float = 3600.0
    """from the exec request to the channel close"""


@dataclass(frozen=True)
class SshTarget:
    host: str
    port: int
    user: str
    host_keys: tuple[str, ...]
    """pinned host keys, ``"ssh-ed25519 AAAA…"`` (known_hosts key fields)"""
    timeouts: SshTimeouts = field(default_factory=SshTimeouts)


_HOSTKEY_ALGORITHMS = {
    "ssh-ed25519": ("ssh-ed25519",),
    # RSA keys sign with SHA-2 (RFC 8332); SHA-1 "ssh-rsa" signatures stay off, as libssh has them.
    "ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256"),
    "ecdsa-sha2-nistp256": ("ecdsa-sha2-nistp256",),
    "ecdsa-sha2-nistp384": ("ecdsa-sha2-nistp384",),
    "ecdsa-sha2-nistp521": ("ecdsa-sha2-nistp521",),
    "sk-ssh-ed25519@openssh.com": ("sk-ssh-ed25519@openssh.com",),
    "sk-ecdsa-sha2-nistp256@openssh.com": ("sk-ecdsa-sha2-nistp256@openssh.com",),
}
"""Host key algorithms the transport may negotiate for a pinned key of each type."""


def hostkey_algorithms(pins: tuple[str, ...]) -> str | None:
    """The ``HostKeyAlgorithms`` list for the key types ``pins`` hold, or None when no pin is
    usable (the presented key is then refused by ``verify_host_key``).

    Without it libssh asks for its default order (ed25519 first): a server that also holds an
    ed25519 key presents that one, and a target that pinned the server's ECDSA or RSA key -- the
    only entry a known_hosts file may have -- was refused as HOST_KEY_MISMATCH.  Offering only
    the pinned types also means the server cannot present a key of any other type."""
    algos: list[str] = []
    for pin in pins:
        try:
            kind = key_type(parse_pin(pin))
        except ValueError:
            continue
        algos += [a for a in _HOSTKEY_ALGORITHMS.get(kind, ()) if a not in algos]
    return ",".join(algos) or None


def no_pinned_key_type(error: str) -> bool:
    """libssh's key exchange error says no host key algorithm was in common.  Only libssh's
    own words count, not the name lists the server sent (``... server [<its list>]``): a list
    holding "server host key algo" must not turn another failure into this one."""
    return "no match for method server host key algo" in error.split("[", 1)[0]


async def open_tcp(target: SshTarget) -> trio.socket.SocketType:
    try:
        infos = await trio.socket.getaddrinfo(
            target.host, target.port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
    except socket.gaierror as exc:
        raise SetupError(Code.DNS_FAILED, "dns", describe(exc)) from exc
    last: OSError | None = None
    for family, type_, proto, _canon, addr in infos:
        sock = trio.socket.socket(family, type_, proto)
        try:
            await sock.connect(addr)
        except OSError as exc:
            sock.close()
            last = exc
            continue
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    if isinstance(last, ConnectionRefusedError):
        raise SetupError(Code.CONNECTION_REFUSED, "tcp_connect") from last
    raise SetupError(Code.SETUP_FAILED, "tcp_connect", describe(last) if last else "no address")


def fire(ctx: AttemptContext, event: str, facts: Mapping[str, Any] | None = None) -> None:
    """Fire ``event`` on the attempt's protocol machine and observe the step with ``facts``."""
    step = ctx.machine.fire(event)
    ctx.observe(step, dict(facts or {}))


class Connection:
    """One attempt's SSH connection: set up under the machine, then lent to dispatch/collect."""

    def __init__(self, target: SshTarget, credential: SshCredential, ctx: AttemptContext) -> None:
        self.t = target
        self.cred = credential
        self.ctx = ctx
        self.io: Io | None = None
        """Set as soon as libssh owns the socket: ``close`` then ends the connection."""
        self.channel: Any = None
        self.host_key = ""
        """The verified key's fingerprint (``SHA256:…``)."""
        self.host_key_b64 = b""
        """The verified key as libssh exports it (``key_changed`` compares it)."""

    def setup_failed(
        self, code: Code, stage: str, detail: str = "", facts: Mapping[str, Any] | None = None
    ) -> NoReturn:
        """``facts``: public facts of the failure for the journal (a presented host key's
        fingerprint), beside the stage and the code."""
        fire(self.ctx, "setup_failed", {**(facts or {}), "stage": stage, "code": code.value})
        raise SetupError(code, stage, detail)

    async def setup(self) -> None:
        t = self.t
        try:
            with trio.fail_after(t.timeouts.connect):
                sock = await open_tcp(t)
                try:
                    peer = sock.getpeername()
                    fire(self.ctx, "tcp_connected", {"peer": f"{peer[0]}:{peer[1]}"})
                    await self.handshake(sock)
                except BaseException:
                    # Not yet handed to libssh (``detach`` leaves -1): a failure before it --
                    # a pinned type this libssh lacks, an observer's error -- left the
                    # connection open until the socket object was collected.
                    if sock.fileno() != -1:
                        sock.close()
                    raise
        except trio.TooSlowError:
            stage = "tcp_connect" if self.ctx.machine.state == "start" else "ssh_handshake"
            self.setup_failed(Code.CONNECT_TIMEOUT, stage)
        except SetupError as exc:
            if self.ctx.machine.allows("setup_failed"):
                fire(self.ctx, "setup_failed", {"stage": exc.stage, "code": exc.code.value})
            raise
        self.verify_host_key()
        try:
            with trio.fail_after(t.timeouts.auth):
                await self.authenticate()
                await self.open_session()
        except trio.TooSlowError:
            stage = "userauth" if self.ctx.machine.state == "host_key_verified" else "session_open"
            self.setup_failed(Code.CONNECT_TIMEOUT, stage)

    async def handshake(self, sock: trio.socket.SocketType) -> None:
        session = ssh.session.Session()
        session.options_set(ssh.options.HOST, self.t.host)
        session.options_set(ssh.options.USER, self.t.user)
        session.options_set_port(self.t.port)
        # Never read ~/.ssh/config: the target's config is the broker's, not the host account's.
        session.options_set_int_val(ssh.options.PROCESS_CONFIG, 0)
        algorithms = hostkey_algorithms(self.t.host_keys)
        if algorithms is not None:
            try:
                session.options_set(ssh.options.HOSTKEYS, algorithms)
            except ssh.exceptions.BaseSSHError as exc:  # a pinned type this libssh lacks
                raise SetupError(Code.HOST_KEY_MISMATCH, "host_key", describe(exc)) from exc
        fd = sock.detach()  # libssh owns the fd from here and closes it when the session is freed
        session.set_socket(fd)
        session.set_blocking(False)
        self.io = Io(session, fd)
        try:
            await self.io.call(session.connect)
        except ssh.exceptions.BaseSSHError as exc:
            if no_pinned_key_type(describe(exc)):
                # The server holds no key of a pinned type (``hostkey_algorithms``): as much a
                # refused host key as a presented key that matches no pin.
                raise SetupError(
                    Code.HOST_KEY_MISMATCH, "host_key", f"no key of a pinned type: {describe(exc)}"
                ) from exc
            raise SetupError(Code.TLS_FAILED, "ssh_handshake", describe(exc)) from exc
        fire(self.ctx, "transport_ready", {"kex": text(session.get_kex_algo())})

    def verify_host_key(self) -> None:
        # libssh's is_server_known() accepted a mismatched known_hosts entry (measured, see
        # docs/ssh-driver.md), so the broker compares the presented key blob itself, before any
        # credential is used (seed: "a rejected ... SSH host key ... occurs before ... could run").
        assert self.io is not None
        self.host_key_b64 = self.io.host_key()
        blob = base64.b64decode(self.host_key_b64)
        self.host_key = fingerprint(blob)
        pins: list[bytes] = []
        for pin in self.t.host_keys:
            try:
                pins.append(parse_pin(pin))
            except ValueError as exc:
                self.setup_failed(Code.HOST_KEY_MISMATCH, "host_key", f"unusable pin: {exc}")
        if blob not in pins:
            # The presented key's fingerprint is public (any client of the server sees it) and
            # is what an operator compares with the pin: journaled, not only in ``detail``.
            detail = f"presented {self.host_key}" + ("" if pins else "; no host key is pinned")
            presented = {"presented": self.host_key}
            self.setup_failed(Code.HOST_KEY_MISMATCH, "host_key", detail, presented)
        fire(self.ctx, "host_key_verified", {"host_key": self.host_key})

    async def authenticate(self) -> None:
        assert self.io is not None
        session = self.io.session
        cred = self.cred
        try:
            if cred.kind == "private_key":
                rc = await self.io.call(session.userauth_publickey, cred._key, again=SSH_AUTH_AGAIN)
            elif cred.kind == "password":
                assert cred._password is not None
                rc = await self.io.call(
                    session.userauth_password, self.t.user, cred._password, again=SSH_AUTH_AGAIN
                )
            else:
                self.setup_failed(Code.SETUP_FAILED, "userauth", f"unknown kind {cred.kind!r}")
        except (ssh.exceptions.AuthenticationDenied, ssh.exceptions.AuthenticationPartial):
            self.setup_failed(Code.REMOTE_AUTH_FAILED, "userauth", f"{cred.kind} refused")
        except ssh.exceptions.BaseSSHError as exc:
            code = Code.SETUP_FAILED if not self.io.alive() else Code.REMOTE_AUTH_FAILED
            self.setup_failed(code, "userauth", describe(exc))
        if rc != SSH_AUTH_SUCCESS:
            self.setup_failed(Code.REMOTE_AUTH_FAILED, "userauth", f"{cred.kind} refused")
        facts = {"method": "publickey" if cred.kind == "private_key" else "password"}
        if cred.public_fingerprint:
            facts["client_key"] = cred.public_fingerprint
        fire(self.ctx, "authenticated", facts)

    async def open_session(self) -> None:
        assert self.io is not None
        channel = self.io.session.channel_new()
        channel.set_blocking(False)
        try:
            await self.io.call(channel.open_session)
        except ssh.exceptions.BaseSSHError as exc:
            self.setup_failed(Code.SETUP_FAILED, "session_open", describe(exc))
        self.channel = channel
        fire(self.ctx, "session_open", {})

    def key_changed(self) -> str | None:
        """The fingerprint of the key the server signed its last key exchange with, if that is
        not the key verified at setup; None while it is.

        libssh 0.11 verifies a re-exchange's signature (RFC 4253 §9) against whatever key the
        server presents in it and never compares that key with the first one: a server could
        switch to a key no pin names in the middle of a session (measured, ``rekey other`` in
        ``tests/ssh/hostile.py``).  ``ssh_get_server_publickey`` answers the key of the current
        keys (``current_crypto``): after a re-exchange, the new one."""
        assert self.io is not None
        presented = self.io.host_key()
        if presented == self.host_key_b64:
            return None
        return fingerprint(base64.b64decode(presented))

    async def close(self) -> None:
        """Best effort, bounded, shielded: close our side of the channel, then end the TCP
        connection.

        The connection is shut down *now* instead of when libssh frees the session: a traceback
        kept by the caller would otherwise hold it open.  We shut down a duplicate of the fd
        rather than closing it — libssh still owns the fd and closes it when freed, and
        ``ssh_silent_disconnect`` would free channels our ``Channel`` objects still point to."""
        io, channel = self.io, self.channel
        if io is None:
            return
        if channel is not None and io.alive():
            with trio.move_on_after(_CLEANUP_SECONDS) as scope:
                scope.shield = True
                with contextlib.suppress(ssh.exceptions.BaseSSHError):
                    await io.call(channel.close)
        io.end()
