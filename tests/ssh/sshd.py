"""Start a real OpenSSH ``sshd`` on 127.0.0.1 with generated ed25519 host and client keys —
shared by the test fixtures and ``tests/benchmarks/ssh_overhead.py``."""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from affidavit.adapters.ssh import SshTarget, SshTimeouts

SSHD = "/usr/sbin/sshd"


class SshdUnavailable(RuntimeError):
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "affidavit-test", "-f", str(path)],
        check=True,
    )


@dataclass
class Sshd:
    port: int
    user: str
    host_pin: str
    client_key: bytes
    client_key_path: Path
    other_key: bytes
    """a valid key the server does not authorise"""
    known_hosts: Path

    def target(self, **timeouts: float) -> SshTarget:
        return SshTarget(
            "127.0.0.1", self.port, self.user, (self.host_pin,), SshTimeouts(**timeouts)
        )


@contextlib.contextmanager
def start_sshd(d: Path) -> Iterator[Sshd]:
    """Run sshd as the current user (CI runs as root: privilege separation needs /run/sshd),
    always torn down."""
    if not os.path.exists(SSHD):
        raise SshdUnavailable("openssh-server is required: apt-get install -y openssh-server")
    for name in ("host", "client", "other"):
        _keygen(d / name)
    shutil.copy(d / "client.pub", d / "authorized_keys")
    port = _free_port()
    cfg = d / "sshd_config"
    cfg.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host'}\nPidFile none\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
        "StrictModes no\nUsePAM no\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nLogLevel ERROR\nMaxStartups 100:30:200\n"
        "MaxSessions 50\n"
    )
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", exist_ok=True)
    log = open(d / "sshd.log", "wb")  # noqa: SIM115 - closed in teardown
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(cfg)], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SshdUnavailable(
                        f"sshd did not start: {(d / 'sshd.log').read_text()}"
                    ) from None
                time.sleep(0.05)
        host_pin = " ".join((d / "host.pub").read_text().split()[:2])
        kh = d / "known_hosts"
        kh.write_text(f"[127.0.0.1]:{port} {host_pin}\n")
        yield Sshd(
            port=port,
            user=getpass.getuser(),
            host_pin=host_pin,
            client_key=(d / "client").read_bytes(),
            client_key_path=d / "client",
            other_key=(d / "other").read_bytes(),
            known_hosts=kh,
        )
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
