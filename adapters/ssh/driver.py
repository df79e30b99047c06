"""The trio driver: ssh-python (libssh) in non-blocking mode, one exec per connection.

Why libssh and not libssh2: see ``docs/ssh-driver.md`` — libssh2 cannot tell exit-status 0 from
no exit-status, so it cannot implement REMOTE_RESULT_INCOMPLETE (RFC 4254 §6.10).

How it stays non-blocking: trio resolves and connects the TCP socket itself (libssh would resolve
names inside ``ssh_connect`` and block the loop), sets TCP_NODELAY (Nagle cost ~45 ms per round
trip), then hands the fd to libssh, which owns and closes it.  Every libssh call is made with the
session in non-blocking mode; when it answers "again" we park on
``trio.lowlevel.wait_readable/wait_writable`` for the direction libssh says it is waiting on.

What each failure proves is decided by the protocol machine (``table.py``), never by the name of
the exception: before ``exec`` is handed over everything is ``SetupError``; after it, only a
remote CHANNEL_CLOSE that follows an exit report and EOF — seen while the connection was still
alive — yields a ``RemoteResult``.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import os
import re
import socket
import struct
import termios
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

import ssh.event
import ssh.exceptions
import ssh.options
import ssh.session
import trio

from affidavit.adapters.base import (
    AttemptContext,
    AttemptInterrupted,
    RemoteResult,
    ResultTooLarge,
    SetupError,
)
from affidavit.statemachine import Code, Outcome

from .keys import SshCredential, fingerprint, parse_pin
from .known_hosts import key_type

__all__ = ["CHUNK", "SshTarget", "SshTimeouts", "perform"]

# libssh return codes (libssh.h): SSH_AGAIN for connect/open/exec/read, SSH_AUTH_AGAIN for
# userauth_*; SSH_WRITE_PENDING in ssh_get_poll_flags() means libssh waits to write, not read.
_SSH_AGAIN = -2
_SSH_AUTH_AGAIN = 4
_SSH_AUTH_SUCCESS = 0
_SSH_WRITE_PENDING = 0x08

_UNNAMED_EXIT = -1
"""``get_exit_state()``'s code for an exit report without a signal name that is not a plain
exit-status it can vouch for: libssh stores 0xFFFFFFFF as the code of every exit-signal, and
ssh-python returns it as -1 — an exit-signal with an *empty* name and an exit-status of
4294967295 both come back as ``(-1, b"", core)``.  Which one was sent cannot be told, so the
driver records neither (see ``collect``)."""

CHUNK = 64 * 1024
"""Largest piece read from libssh and handed to the sink at once: output is never held whole."""

_SIGNAL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+@-]{0,63}")
"""An exit-signal name as RFC 4254 §6.10 has them: ``KILL``, ``USR1``, ``name@domain``."""

_CLEANUP_SECONDS = 1.0

_RECHECK_SECONDS = 0.25
"""Longest park on the socket without re-asking libssh: a packet libssh already took off the
socket while answering another call (data for the other stream, EOF, CHANNEL_CLOSE) does not
make the fd readable again, so a wait for readability alone could outlast the exchange."""

_WOKE_WRITABLE = -1
"""``woke`` after a park that ended on "writable" (libssh had output pending)."""
_BACKOFF_FIRST = 0.001
"""First pause after a wake-up after which nothing moved -- on a readable socket libssh took
nothing from, or on a writable one while libssh said it had output pending; it doubles on every
further such round, up to ``_RECHECK_SECONDS``: a socket libssh will not read (or a buffer it
does not flush) can never make the collect loop spin."""


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


class _Lost(Exception):
    """The SSH connection died (libssh reported a socket/session error)."""


class _Io:
    """The libssh session plus the fd trio waits on."""

    def __init__(self, session: Any, fd: int) -> None:
        self.session = session
        self.fd = fd

    async def wait(self) -> bool:
        """Park until the socket is ready in the direction libssh waits on; True if that was
        "readable"."""
        if self.session.get_poll_flags() & _SSH_WRITE_PENDING:
            await trio.lowlevel.wait_writable(self.fd)
            return False
        await trio.lowlevel.wait_readable(self.fd)
        return True

    def pump(self) -> None:
        """Make libssh read and process what the socket holds, now, without reading channel data.

        Once a channel has seen EOF and an exit report, no channel call reads packets any more:
        ``read_nonblocking`` answers EOF from its flags and ``get_exit_state`` its stored
        report, so a later CHANNEL_CLOSE would stay on the socket.  ``ssh_event_dopoll`` with
        timeout 0 runs libssh's socket callback once (read what is there, process whole
        packets) and never blocks.  The session's poll handle is lent to the event only for
        this call and given back to the session's own poll context after it."""
        event = ssh.event.Event()
        event.add_session(self.session)
        try:
            event.dopoll(0)
        finally:
            event.remove_session(self.session)

    def pending(self) -> int:
        """Bytes waiting in the kernel's receive buffer of the socket (FIONREAD)."""
        try:
            raw = fcntl.ioctl(self.fd, termios.FIONREAD, b"\0\0\0\0")
        except OSError:
            return 0
        return int(struct.unpack("i", raw)[0])

    async def call(self, fn: Callable[..., Any], *args: Any, again: int = _SSH_AGAIN) -> Any:
        while True:
            rc = fn(*args)
            code = rc[0] if isinstance(rc, tuple) else rc
            if code != again:
                return rc
            await self.wait()

    def alive(self) -> bool:
        return bool(self.session.is_connected())

    def host_key(self) -> bytes:
        """The server's host key of the current keys, base64 as libssh exports it."""
        return bytes(self.session.get_server_publickey().export_pubkey_base64())


def _describe(exc: BaseException) -> str:
    """A short, secret-free description of a library exception for ``detail``."""
    args = getattr(exc, "args", ())
    text = next((a for a in reversed(args) if isinstance(a, bytes | str)), "")
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return f"{type(exc).__name__}: {text}"[:200] if text else type(exc).__name__


async def _open_tcp(target: SshTarget) -> trio.socket.SocketType:
    try:
        infos = await trio.socket.getaddrinfo(
            target.host, target.port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
    except socket.gaierror as exc:
        raise SetupError(Code.DNS_FAILED, "dns", _describe(exc)) from exc
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
    raise SetupError(Code.SETUP_FAILED, "tcp_connect", _describe(last) if last else "no address")


class _Run:
    """One attempt: fires machine events, observes them, classifies the end."""

    def __init__(
        self,
        target: SshTarget,
        credential: SshCredential,
        command: str,
        stdin: bytes | None,
        ctx: AttemptContext,
    ) -> None:
        self.t = target
        self.cred = credential
        self.command = command
        self.stdin = stdin
        self.ctx = ctx
        self.io: _Io | None = None
        self.channel: Any = None
        self.host_key = ""
        self.host_key_b64 = b""
        """The verified key as libssh exports it (``key_changed`` compares it)."""
        self.exit_status: int | None = None
        self.exit_signal: str | None = None
        self.core_dumped = False
        self.stdin_unsent = 0
        """stdin bytes not written because the remote closed the channel first"""
        self.exit_report: tuple[int, bytes, bool] | None = None
        """libssh's exit state when the first exit report was recorded (``collect``)."""
        self.counts = {"stdout": 0, "stderr": 0}
        self.hashes = {"stdout": hashlib.sha256(), "stderr": hashlib.sha256()}

    # -- machine --------------------------------------------------------------------------------

    def fire(self, event: str, facts: Mapping[str, Any] | None = None) -> None:
        step = self.ctx.machine.fire(event)
        self.ctx.observe(step, dict(facts or {}))

    def setup_failed(self, code: Code, stage: str, detail: str = "") -> NoReturn:
        self.fire("setup_failed", {"stage": stage, "code": code.value})
        raise SetupError(code, stage, detail)

    def interrupted(self, event: str, code: Code, detail: str) -> NoReturn:
        facts = self.result_facts()
        self.fire(event, {"code": code.value})
        raise AttemptInterrupted(code, detail, facts)

    def too_large(self, exc: ResultTooLarge) -> NoReturn:
        """stdout and stderr together passed ``max_result``: nothing more is read or stored; the
        channel and the connection are closed on the way out (``perform``'s ``finally``)."""
        facts = {**self.result_facts(), **exc.facts}
        self.fire("result_size_limit", exc.facts)
        raise AttemptInterrupted(exc.code, exc.detail, facts)

    def result_facts(self) -> dict[str, Any]:
        facts: dict[str, Any] = {
            "exit_status": self.exit_status,
            "exit_signal": self.exit_signal,
            "core_dumped": self.core_dumped,
            "host_key": self.host_key,
        }
        if self.stdin_unsent:
            facts["stdin_unsent"] = self.stdin_unsent
        for name in ("stdout", "stderr"):
            facts[f"{name}_bytes"] = self.counts[name]
            facts[f"{name}_sha256"] = self.hashes[name].hexdigest()
        return facts

    # -- setup ----------------------------------------------------------------------------------

    async def setup(self) -> None:
        t = self.t
        try:
            with trio.fail_after(t.timeouts.connect):
                sock = await _open_tcp(t)
                peer = sock.getpeername()
                self.fire("tcp_connected", {"peer": f"{peer[0]}:{peer[1]}"})
                await self.handshake(sock)
        except trio.TooSlowError:
            stage = "tcp_connect" if self.ctx.machine.state == "start" else "ssh_handshake"
            self.setup_failed(Code.CONNECT_TIMEOUT, stage)
        except SetupError as exc:
            if self.ctx.machine.allows("setup_failed"):
                self.fire("setup_failed", {"stage": exc.stage, "code": exc.code.value})
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
                raise SetupError(Code.HOST_KEY_MISMATCH, "host_key", _describe(exc)) from exc
        fd = sock.detach()  # libssh owns the fd from here and closes it when the session is freed
        session.set_socket(fd)
        session.set_blocking(False)
        self.io = _Io(session, fd)
        try:
            await self.io.call(session.connect)
        except ssh.exceptions.BaseSSHError as exc:
            if no_pinned_key_type(_describe(exc)):
                # The server holds no key of a pinned type (``hostkey_algorithms``): as much a
                # refused host key as a presented key that matches no pin.
                raise SetupError(
                    Code.HOST_KEY_MISMATCH, "host_key", f"no key of a pinned type: {_describe(exc)}"
                ) from exc
            raise SetupError(Code.TLS_FAILED, "ssh_handshake", _describe(exc)) from exc
        self.fire("transport_ready", {"kex": _text(session.get_kex_algo())})

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
            detail = f"presented {self.host_key}" + ("" if pins else "; no host key is pinned")
            self.setup_failed(Code.HOST_KEY_MISMATCH, "host_key", detail)
        self.fire("host_key_verified", {"host_key": self.host_key})

    async def authenticate(self) -> None:
        assert self.io is not None
        session = self.io.session
        cred = self.cred
        try:
            if cred.kind == "private_key":
                rc = await self.io.call(
                    session.userauth_publickey, cred._key, again=_SSH_AUTH_AGAIN
                )
            elif cred.kind == "password":
                assert cred._password is not None
                rc = await self.io.call(
                    session.userauth_password, self.t.user, cred._password, again=_SSH_AUTH_AGAIN
                )
            else:
                self.setup_failed(Code.SETUP_FAILED, "userauth", f"unknown kind {cred.kind!r}")
        except (ssh.exceptions.AuthenticationDenied, ssh.exceptions.AuthenticationPartial):
            self.setup_failed(Code.REMOTE_AUTH_FAILED, "userauth", f"{cred.kind} refused")
        except ssh.exceptions.BaseSSHError as exc:
            code = Code.SETUP_FAILED if not self.io.alive() else Code.REMOTE_AUTH_FAILED
            self.setup_failed(code, "userauth", _describe(exc))
        if rc != _SSH_AUTH_SUCCESS:
            self.setup_failed(Code.REMOTE_AUTH_FAILED, "userauth", f"{cred.kind} refused")
        facts = {"method": "publickey" if cred.kind == "private_key" else "password"}
        if cred.public_fingerprint:
            facts["client_key"] = cred.public_fingerprint
        self.fire("authenticated", facts)

    async def open_session(self) -> None:
        assert self.io is not None
        channel = self.io.session.channel_new()
        channel.set_blocking(False)
        try:
            await self.io.call(channel.open_session)
        except ssh.exceptions.BaseSSHError as exc:
            self.setup_failed(Code.SETUP_FAILED, "session_open", _describe(exc))
        self.channel = channel
        self.fire("session_open", {})

    # -- dispatch and result --------------------------------------------------------------------

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

    def check_host_key(self) -> None:
        """After dispatch: what arrives after a change of host key is not from the pinned host,
        so the attempt ends ``host_key_changed`` -> ``interrupted``, ``unknown``."""
        changed = self.key_changed()
        if changed is not None:
            self.interrupted(
                "host_key_changed",
                Code.REMOTE_OUTCOME_UNKNOWN,
                f"the server re-keyed with another host key: presented {changed}, "
                f"verified {self.host_key}",
            )

    async def dispatch(self) -> None:
        machine = self.ctx.machine
        assert machine.crosses_dispatch("exec"), machine.state
        try:
            changed = self.key_changed()
        except ssh.exceptions.BaseSSHError as exc:
            self.setup_failed(Code.SETUP_FAILED, "host_key", _describe(exc))
        if changed is not None:
            # A key exchange during authentication or the session's opening switched keys.
            self.setup_failed(
                Code.HOST_KEY_MISMATCH,
                "host_key",
                f"the server re-keyed with another host key before the command was requested: "
                f"presented {changed}",
            )
        # The engine journals DISPATCH_STARTED durably inside the gate; if it raises, nothing
        # has been written and the exec request never leaves this process.
        await self.ctx.gate(
            {
                "host_key": self.host_key,
                "user": self.t.user,
                "command_sha256": hashlib.sha256(self.command.encode()).hexdigest(),
                "stdin_bytes": len(self.stdin or b""),
            }
        )
        self.fire("exec", {})

    async def request_exec(self) -> RemoteResult | None:
        """Hand the exec request over and wait for CHANNEL_SUCCESS / CHANNEL_FAILURE."""
        assert self.io is not None
        io, channel = self.io, self.channel
        try:
            rc = channel.request_exec(self.command)  # writes the request into libssh's transport
            self.fire("exec_sent", {})
            if rc == _SSH_AGAIN:
                await io.call(channel.request_exec, self.command)  # now only polls for the reply
        except ssh.exceptions.BaseSSHError as exc:
            # CHANNEL_FAILURE is an authoritative refusal only if it arrived on a live
            # connection: libssh raises the same SSHError for a dead socket.  It reports the
            # denied state (SSH_CHANNEL_REQ_STATE_DENIED, i.e. CHANNEL_FAILURE received) as
            # "Channel request exec failed"; a server may close the channel right after
            # refusing, so "still open" is not required (that raced in practice).
            denied = "request exec failed" in _describe(exc) and io.alive()
            if denied and self.ctx.machine.state == "exec_requesting":
                # On loopback the first non-blocking call can write the request *and* read the
                # reply: the denial proves the request was sent.
                self.fire("exec_sent", {})
            if denied:
                self.check_host_key()
                self.fire("exec_failure", {"reply": "CHANNEL_FAILURE"})
                return RemoteResult(
                    Outcome.REJECTED,
                    Code.EXEC_REJECTED,
                    facts={"host_key": self.host_key, "reply": "CHANNEL_FAILURE"},
                    summary=self.summary(),
                )
            self.library_error(exc)
        self.check_host_key()
        self.fire("exec_accepted", {})
        return None

    def summary(self) -> dict[str, Any]:
        return {
            "exit_status": self.exit_status,
            "exit_signal": self.exit_signal,
            "core_dumped": self.core_dumped,
        }

    def lost(self, detail: str) -> NoReturn:
        # An exit report without the proven end of the streams is not a result (seed: "send the
        # exit status before the output stream is cut off" must stay unknown).
        exited = self.exit_status is not None or self.exit_signal is not None
        code = Code.REMOTE_RESULT_INCOMPLETE if exited else Code.REMOTE_OUTCOME_UNKNOWN
        self.interrupted("connection_lost", code, detail)

    def library_error(self, exc: ssh.exceptions.BaseSSHError) -> NoReturn:
        """libssh raised an error after dispatch that no rule of ``request_exec`` or ``collect``
        reads.  On a dead connection it is the connection's loss; on a live one it proves
        nothing about the command either way: the attempt ends ``library_error`` ->
        ``interrupted`` (a recorded closing step, ``unknown``), never with the raw exception."""
        assert self.io is not None
        if not self.io.alive():
            self.lost(_describe(exc))
        exited = self.exit_status is not None or self.exit_signal is not None
        code = Code.REMOTE_RESULT_INCOMPLETE if exited else Code.REMOTE_OUTCOME_UNKNOWN
        self.interrupted("library_error", code, f"libssh failed: {_describe(exc)}")

    def stream_broken(self, detail: str) -> NoReturn:
        """The remote broke the channel's stream rules: what it sent is not one result."""
        exited = self.exit_status is not None or self.exit_signal is not None
        code = Code.REMOTE_RESULT_INCOMPLETE if exited else Code.REMOTE_OUTCOME_UNKNOWN
        self.interrupted("stream_broken", code, detail)

    async def collect(self) -> RemoteResult:
        assert self.io is not None
        io, channel = self.io, self.channel
        pending = memoryview(self.stdin or b"")
        stdin_open = True
        eof = {"stdout": False, "stderr": False}
        eof_fired = False
        status: int = _SSH_AGAIN
        signal: bytes = b""
        core: Any = False
        unnamed = False  # libssh holds an exit report it reports as (-1, b"", core)
        odd_signal = False  # ... or an exit-signal whose name is no signal name
        woke: int | None = None  # bytes on the socket when a park last ended on "readable"
        # (``_WOKE_WRITABLE`` when it ended on "writable")
        stalls = 0  # consecutive such wake-ups after which libssh took nothing off the socket
        while True:
            progressed = False
            # Each libssh call below may pump packets for the others: note what the channel
            # showed before them, so a change they made is seen before parking on the socket.
            seen = (channel.is_eof(), channel.is_closed())
            try:
                try:
                    if stdin_open and pending:
                        _rc, written = channel.write(bytes(pending[:CHUNK]))
                        pending = pending[written:]
                        progressed = written > 0
                    if stdin_open and not pending:
                        channel.send_eof()
                        stdin_open = False
                except ssh.exceptions.BaseSSHError:
                    if not io.alive():
                        raise
                    # On a live connection libssh refuses to write only to a channel the remote
                    # closed ("Remote channel is closed"): a command that exits without reading
                    # all its input (``true``, ``head -1``).  Its result is still on the way.
                    stdin_open = False
                    self.stdin_unsent = len(pending)
                    progressed = True
                for name in ("stdout", "stderr"):
                    # A stream at EOF is still read: libssh keeps data that arrives after the
                    # channel's EOF, and holds back the CHANNEL_CLOSE ("delayed close") until
                    # it is read -- unread, the wait lasted until the exec timeout.
                    try:
                        _rc, data = channel.read_nonblocking(CHUNK, name == "stderr")
                    except ssh.exceptions.EOF:
                        progressed = progressed or not eof[name]
                        eof[name] = True
                        continue
                    if data:
                        self.check_host_key()  # not a byte from another key reaches the sink
                    if data and eof[name]:
                        self.stream_broken(f"{name} data after the channel's EOF (RFC 4254 §5.3)")
                    if data:
                        progressed = True
                        self.counts[name] += len(data)
                        self.hashes[name].update(data)
                        self.fire(name, {"bytes": len(data)})
                        try:
                            await self.ctx.sink(name, data)
                        except ResultTooLarge as exc:
                            self.too_large(exc)
                if eof["stdout"] and eof["stderr"] and not (channel.is_closed() and io.alive()):
                    # After EOF no read call reads packets, nor does get_exit_state() once
                    # libssh holds any exit report: the CHANNEL_CLOSE has to be pumped.  Before
                    # the exit state is read: a pump that processes the exit report and the
                    # close together must not leave the close seen and the report unread (a
                    # complete result then read as closed without exit-status).
                    # Not once the close is in (seen on a live connection): a pump then reads
                    # only what follows it -- the connection's end, when the server closed TCP
                    # right after the result -- and a dead session's channel reads as closed
                    # too, so the close it had proved would prove nothing any more.  Nothing
                    # else touches the socket after a CHANNEL_CLOSE: the reads answer from the
                    # channel's EOF flag, get_exit_state() from its "closed by the remote" flag.
                    io.pump()
                exited = self.exit_status is not None or self.exit_signal is not None
                if not exited:
                    # get_exit_state() also pumps packets: after EOF the read calls stop doing
                    # so, and exit-status / CHANNEL_CLOSE would never be processed.  Packets
                    # are processed in order, so a close seen below was preceded by any exit
                    # report the remote sent -- read here, after the last pump.
                    status, signal, core = channel.get_exit_state()
            except ssh.exceptions.BaseSSHError as exc:
                if not io.alive():
                    self.lost(_describe(exc))
                raise
            if not io.alive():
                self.lost("connection closed")
            # Everything classified below came in over the current keys: from the pinned host
            # only if they were exchanged under its key.
            self.check_host_key()
            if not exited and signal and not _SIGNAL_NAME.fullmatch(_text(signal)):
                # Not a signal name (RFC 4254 §6.10: "KILL", or "name@domain"): remote text of
                # up to a packet's size that would land in exit_signal, the journal and the
                # caller's status line.  Treated like an unnamed report: no exit information.
                unnamed = odd_signal = True
            elif not exited and signal:
                self.exit_signal = _text(signal)
                self.core_dumped = bool(core)
                self.fire("exit_signal", {"exit_signal": self.exit_signal, "core": bool(core)})
                self.exit_report = _exit_state(status, signal, core)
                progressed = True
            elif not exited and status == _UNNAMED_EXIT:
                # An exit-signal whose name is empty, or exit-status 4294967295: libssh reports
                # both alike.  Neither an exit-status nor a signal is invented; the close that
                # follows is handled as one without exit information (RFC 4254 §6.10 rule).
                unnamed = True
            elif not exited and status != _SSH_AGAIN:
                # RFC 4254 sends a uint32; ssh-python hands it over as a C int.
                self.exit_status = int(status) & 0xFFFFFFFF
                self.fire("exit_status", {"exit_status": self.exit_status})
                self.exit_report = _exit_state(status, signal, core)
                progressed = True
            if eof["stdout"] and eof["stderr"] and not eof_fired:
                self.fire("eof", {f"{n}_bytes": self.counts[n] for n in eof})
                eof_fired = True
            if eof_fired and channel.is_closed():
                # Seen on a live connection (checked above): a real CHANNEL_CLOSE.  libssh
                # processes packets in order, so an exit report sent before it is already in.
                facts = self.result_facts()
                if self.exit_status is None and self.exit_signal is None:
                    detail = "channel closed without exit-status or exit-signal"
                    if odd_signal:
                        detail = "channel closed; its exit-signal's name is not a signal name"
                    elif unnamed:
                        detail = (
                            "channel closed; its only exit report was an exit-signal with an"
                            " empty name or exit-status 4294967295 (libssh reports both alike)"
                        )
                    self.interrupted("channel_closed", Code.REMOTE_RESULT_INCOMPLETE, detail)
                if unnamed or self.reports_changed(channel):
                    self.interrupted(
                        "closed_conflicting",
                        Code.REMOTE_RESULT_INCOMPLETE,
                        "channel closed after more than one exit report (RFC 4254 allows one):"
                        " which one is the command's is not known",
                    )
                # Journaled with the attempt's steps: a committed result keeps only its own facts.
                unsent = {"stdin_unsent": self.stdin_unsent} if self.stdin_unsent else {}
                self.fire("channel_closed", unsent)
                failed = self.exit_signal is not None or self.exit_status != 0
                return RemoteResult(
                    Outcome.COMMITTED,
                    Code.REMOTE_COMMAND_FAILED if failed else None,
                    facts=facts,
                    summary=self.summary(),
                )
            if progressed or (channel.is_eof(), channel.is_closed()) != seen:
                woke, stalls = None, 0
                continue
            # Nothing observable changed.  If the last park ended because the socket was
            # readable and libssh has not taken a byte off it since, waiting on the socket would
            # return at once again: back off instead of spinning.
            if woke is not None and (woke == _WOKE_WRITABLE or io.pending() >= woke):
                stalls = min(stalls + 1, 16)  # 2**15 ms > the recheck: capped, never overflows
                await trio.sleep(min(_RECHECK_SECONDS, _BACKOFF_FIRST * 2 ** (stalls - 1)))
            else:
                stalls = 0
            woke = None
            with trio.move_on_after(_RECHECK_SECONDS):
                # Writable: libssh said it had output pending.  The socket stays writable, so
                # if no call then moved anything, waiting on it again returns at once as well.
                woke = io.pending() if await io.wait() else _WOKE_WRITABLE

    def reports_changed(self, channel: Any) -> bool:
        """libssh's exit state differs from the one the recorded report was read from: a
        later exit-status or exit-signal arrived (libssh keeps the last of each).  Reports that
        arrive in one read are not told apart: libssh holds only the last one."""
        return _exit_state(*channel.get_exit_state()) != self.exit_report  # no pump: stored

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
        with contextlib.suppress(OSError), socket.socket(fileno=os.dup(io.fd)) as dup:
            dup.shutdown(socket.SHUT_RDWR)


def _exit_state(status: Any, signal: Any, core: Any) -> tuple[int, bytes, bool]:
    return int(status), bytes(signal or b""), bool(core)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


async def perform(
    target: SshTarget,
    credential: SshCredential,
    command: str,
    stdin: bytes | None,
    ctx: AttemptContext,
) -> RemoteResult:
    """Run ``command`` once on ``target``; see ``adapters/base.py`` for the contract."""
    run = _Run(target, credential, command, stdin, ctx)
    try:
        await run.setup()
        await run.dispatch()
        try:
            with trio.fail_after(target.timeouts.exec):
                rejected = await run.request_exec()
                if rejected is not None:
                    return rejected
                return await run.collect()
        except trio.TooSlowError:
            exited = run.exit_status is not None or run.exit_signal is not None
            code = Code.REMOTE_RESULT_INCOMPLETE if exited else Code.REMOTE_OUTCOME_UNKNOWN
            run.interrupted("timed_out", code, f"no complete result within {target.timeouts.exec}s")
        except ssh.exceptions.BaseSSHError as exc:
            run.library_error(exc)
    except trio.Cancelled:
        if ctx.machine.allows("cancelled"):
            run.fire("cancelled", {"code": Code.CALLER_CANCELLED.value})
        raise
    finally:
        await run.close()
