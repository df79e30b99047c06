"""Fixtures: the test keys, a real OpenSSH ``sshd`` on 127.0.0.1 (skipped as "openssh-server not
installed" without it, a failure under ``AFFIDAVIT_REQUIRE_PROGRAMS=1``: tests/external.py), the
scripted hostile server (asyncssh, runs everywhere), a fake ``AttemptContext`` that records
gate/observe/sink calls."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio

from affidavit.adapters.base import AttemptContext
from affidavit.adapters.ssh import SSH_TABLE, SshTarget, SshTimeouts
from affidavit.statemachine import ProtocolMachine, Step
from tests.external import SSH_KEYGEN, SSHD

from .brokerkit import KEY_ENV
from .hostile import HostileServer
from .sshd import Sshd, SshdUnavailable, SshKeys, make_keys, start_sshd

__all__ = ["LOOP_HELD", "GateRefused", "Recorder", "SshKeys", "Sshd", "hostile_target"]


@pytest.fixture(scope="session")
def ssh_keys(tmp_path_factory: pytest.TempPathFactory) -> SshKeys:
    """The client key sshd authorises and one it does not (no OpenSSH program needed)."""
    return make_keys(tmp_path_factory.mktemp("ssh-keys"))


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory, ssh_keys: SshKeys) -> Iterator[Sshd]:
    """A real OpenSSH server (session-scoped: every test reuses it).  Installed but failing to
    start is a failure, never a skip."""
    program = SSHD.require()
    try:
        with start_sshd(tmp_path_factory.mktemp("sshd"), ssh_keys, program) as server:
            yield server
    except SshdUnavailable as exc:
        pytest.fail(str(exc))


@pytest.fixture(params=["sshd", "scripted"])
def either_server(request: pytest.FixtureRequest) -> Sshd | HostileServer:
    """The real sshd (skipped without it), then the scripted server: for a test that proves one
    rule against both.  Resolved here, in a synchronous fixture, because a skip raised inside an
    async test body loses its reason under pytest-trio."""
    server: Sshd | HostileServer = request.getfixturevalue(
        "sshd" if request.param == "sshd" else "hostile"
    )
    return server


@pytest.fixture(scope="session")
def ssh_keygen() -> str:
    """OpenSSH's ssh-keygen, for the tests that check our parsing against its output."""
    return SSH_KEYGEN.require()


@pytest.fixture(scope="session")
def hostile() -> Iterator[HostileServer]:
    srv = HostileServer().start()
    try:
        yield srv
    finally:
        srv.stop()


LOOP_HELD = 1.0
"""A gap between two 10 ms ticks of a task on the trio loop that says the loop was held:
a write spinning on the trio thread holds it for the server's whole stall (at least 1.5 s in
these tests); a loaded CI machine with a worker per CPU delays a tick by a few hundred ms."""


def hostile_target(srv: HostileServer, user: str = "bob", **timeouts: float) -> SshTarget:
    return SshTarget("127.0.0.1", srv.port, user, (srv.pin,), SshTimeouts(**timeouts))


class GateRefused(Exception):
    """What a fake gate raises (the engine's would be lease lost / config changed)."""


@dataclass
class Recorder:
    """Everything the driver told the engine, in order."""

    gate_raises: BaseException | None = None
    sink_delay: float = 0.0
    """Seconds each chunk takes to store (the engine's sink journals it)."""
    on_chunk: Callable[[str, bytes], None] | None = None
    """Called with each chunk as the sink takes it, before ``sink_delay``."""
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
        if self.on_chunk is not None:
            self.on_chunk(stream, data)
        if self.sink_delay:
            await trio.sleep(self.sink_delay)

    @property
    def events(self) -> list[str]:
        return [s.event for s, _ in self.steps]

    def stream(self, name: str) -> bytes:
        return b"".join(d for s, d in self.chunks if s == name)


@pytest.fixture
def key_env(ssh_keys: SshKeys, monkeypatch: pytest.MonkeyPatch) -> None:
    """The client's key in the variable brokerkit's targets name for their credential
    (``KEY_ENV``), for the test's length: ``pytestmark = pytest.mark.usefixtures("key_env")``."""
    monkeypatch.setenv(KEY_ENV, ssh_keys.client_key.decode())
