"""Fixtures: a real OpenSSH ``sshd`` on 127.0.0.1, the scripted hostile server, a fake
``AttemptContext`` that records gate/observe/sink calls."""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from affidavit.adapters.base import AttemptContext
from affidavit.adapters.ssh import SSH_TABLE, SshTarget, SshTimeouts
from affidavit.statemachine import ProtocolMachine, Step

from .hostile import HostileServer

SSHD = "/usr/sbin/sshd"


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


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """A real OpenSSH server as the current user (CI runs as root; privilege separation needs
    /run/sshd).  Session-scoped: starting it costs ~100 ms, every test reuses it."""
    if not os.path.exists(SSHD):
        pytest.fail("openssh-server is required: apt-get install -y openssh-server")
    d = tmp_path_factory.mktemp("sshd")
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
                    pytest.fail(f"sshd did not start: {(d / 'sshd.log').read_text()}")
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


@pytest.fixture(scope="session")
def hostile() -> Iterator[HostileServer]:
    srv = HostileServer().start()
    try:
        yield srv
    finally:
        srv.stop()


def hostile_target(srv: HostileServer, user: str = "bob", **timeouts: float) -> SshTarget:
    return SshTarget("127.0.0.1", srv.port, user, (srv.pin,), SshTimeouts(**timeouts))


class GateRefused(Exception):
    """What a fake gate raises (the engine's would be lease lost / config changed)."""


@dataclass
class Recorder:
    """Everything the driver told the engine, in order."""

    gate_raises: BaseException | None = None
    gate_calls: list[dict[str, Any]] = field(default_factory=list)
    steps: list[tuple[Step, dict[str, Any]]] = field(default_factory=list)
    chunks: list[tuple[str, bytes]] = field(default_factory=list)
    ctx: AttemptContext = field(init=False)

    def __post_init__(self) -> None:
        self.ctx = AttemptContext(
            machine=ProtocolMachine(SSH_TABLE), gate=self._gate, observe=self._observe,
            sink=self._sink,
        )  # fmt: skip

    async def _gate(self, facts: Mapping[str, Any]) -> None:
        self.gate_calls.append({**facts, "_steps_before": len(self.steps)})
        if self.gate_raises is not None:
            raise self.gate_raises

    def _observe(self, step: Step, facts: Mapping[str, Any]) -> None:
        self.steps.append((step, dict(facts)))

    async def _sink(self, stream: str, data: bytes) -> None:
        self.chunks.append((stream, data))

    @property
    def events(self) -> list[str]:
        return [s.event for s, _ in self.steps]

    def stream(self, name: str) -> bytes:
        return b"".join(d for s, d in self.chunks if s == name)
