"""Start a real OpenSSH ``sshd`` on 127.0.0.1 — shared by the test fixtures and
``tests/benchmarks/ssh_overhead.py`` — and make the ed25519 keys the SSH tests use.

Keys are made with ``cryptography`` (a dependency), not ssh-keygen: the scripted asyncssh peer's
tests need keys but no OpenSSH program, so they run on any machine.  ``sshd`` itself is found by
``tests.external.SSHD`` (PATH, then the sbin directories)."""

from __future__ import annotations

import contextlib
import getpass
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_ssh_private_key,
)

from affidavit.adapters.ssh import SshTarget, SshTimeouts
from tests.external import SSHD, ProgramFailed, listening


class SshdUnavailable(RuntimeError):
    pass


def _keypair(path: Path) -> bytes:
    """A fresh ed25519 key in OpenSSH format at ``path`` (mode 0600: sshd ignores a host key
    others can read) and its public line at ``path.pub``; returns the private key."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(Encoding.PEM, PrivateFormat.OpenSSH, NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public = key.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH)
    path.with_suffix(".pub").write_bytes(public + b" affidavit-test\n")
    return pem


@dataclass(frozen=True)
class SshKeys:
    client_key: bytes
    """the key sshd authorises"""
    client_key_path: Path
    """its file; the public line is ``client_key_path.with_suffix(".pub")``"""
    other_key: bytes
    """a valid key sshd does not authorise"""

    @property
    def client_pin(self) -> str:
        """The client's public key as a pin (``<type> <base64>``)."""
        return " ".join(self.client_key_path.with_suffix(".pub").read_text().split()[:2])

    @property
    def other_pin(self) -> str:
        """The other key's public key as a pin."""
        key = load_ssh_private_key(self.other_key, password=None)
        return key.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()


def make_keys(d: Path) -> SshKeys:
    return SshKeys(
        client_key=_keypair(d / "client"),
        client_key_path=d / "client",
        other_key=_keypair(d / "other"),
    )


@dataclass
class Sshd:
    port: int
    user: str
    host_pin: str
    keys: SshKeys
    known_hosts: Path

    @property
    def client_key(self) -> bytes:
        return self.keys.client_key

    @property
    def client_key_path(self) -> Path:
        return self.keys.client_key_path

    @property
    def other_key(self) -> bytes:
        return self.keys.other_key

    def target(self, **timeouts: float) -> SshTarget:
        return SshTarget(
            "127.0.0.1", self.port, self.user, (self.host_pin,), SshTimeouts(**timeouts)
        )


@contextlib.contextmanager
def start_sshd(d: Path, keys: SshKeys | None = None, program: str | None = None) -> Iterator[Sshd]:
    """Run ``program`` (default: the installed sshd) as the current user (CI runs as root:
    privilege separation needs /run/sshd), authorising ``keys.client_key``; always torn down."""
    program = program or SSHD.find()
    if program is None:
        raise SshdUnavailable("openssh-server is required: apt-get install -y openssh-server")
    keys = keys or make_keys(d)
    _keypair(d / "host")
    (d / "authorized_keys").write_bytes(keys.client_key_path.with_suffix(".pub").read_bytes())
    cfg = d / "sshd_config"

    def argv_at(port: int) -> list[str]:
        cfg.write_text(
            f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host'}\nPidFile none\n"
            f"AuthorizedKeysFile {d / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
            "StrictModes no\nUsePAM no\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nLogLevel ERROR\nMaxStartups 100:30:200\n"
            "MaxSessions 50\n"
        )
        return [program, "-D", "-e", "-f", str(cfg)]

    if os.geteuid() == 0:
        os.makedirs("/run/sshd", exist_ok=True)
    try:
        with listening(argv_at, d / "sshd.log") as served:
            host_pin = " ".join((d / "host.pub").read_text().split()[:2])
            kh = d / "known_hosts"
            kh.write_text(f"[127.0.0.1]:{served.port} {host_pin}\n")
            yield Sshd(
                port=served.port,
                user=getpass.getuser(),
                host_pin=host_pin,
                keys=keys,
                known_hosts=kh,
            )
    except ProgramFailed as exc:  # it exited or did not listen: the log says why
        raise SshdUnavailable(f"sshd did not start: {exc}") from None
