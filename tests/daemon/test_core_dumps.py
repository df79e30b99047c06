"""No core file of an ``affidavit`` command that holds secrets (``coredump``): ``serve``, ``mcp``,
an embedded ``call``, a command loading a key -- each runs with ``RLIMIT_CORE`` 0 and, on Linux,
not dumpable, observed from outside, in ``/proc/<pid>``; one that loads none (``diagrams``, a
view, a thin client asking the daemon) is left as it started.

Run as root, a process's ``/proc/<pid>`` files are root's whether it is dumpable or not; so the
broker runs as ``nobody`` (``kit.as_user``).  Dropping privileges itself makes a process not
dumpable (``fs.suid_dumpable`` 0), and the test's shell may have no core limit at all: the
child is first given back what an ordinary start has -- an unlimited core size, dumpable again
-- so only the broker's own start can take them away.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from tests.external import require_module, require_root

from .kit import HUNG, NOBODY, WAIT, as_user, client_env, write_daemon_config

# The ordinary start the broker must harden: run after ``as_user`` dropped to nobody.
AS_STARTED = """
import ctypes, runpy, sys
ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE 1, as after an execve
sys.argv = ["affidavit", *sys.argv[1:]]
runpy.run_module("affidavit", run_name="__main__", alter_sys=True)
"""


def _unlimited(argv: list[str]) -> list[str]:
    """``argv`` with no limit on its core file size (``prlimit`` runs as root, before the drop)."""
    prlimit = shutil.which("prlimit")
    assert prlimit is not None, "util-linux prlimit"
    return [prlimit, "--core=unlimited:unlimited", *argv]


@pytest.fixture
def home() -> Iterator[Path]:
    """A directory of nobody's (``0700``) under one of root's: config, journal and socket."""
    require_root()
    top = Path(tempfile.mkdtemp(prefix="affidavit-core-"))
    top.chmod(0o755)
    home = top / "broker"
    home.mkdir(mode=0o700)
    os.chown(home, NOBODY, NOBODY)
    try:
        yield home
    finally:
        shutil.rmtree(top)


def _hardened(pid: int) -> tuple[str, int]:
    """(``Max core file size`` row of ``/proc/<pid>/limits``, owner of ``/proc/<pid>/fd``): root
    owns a process's ``/proc`` entries once it is not dumpable."""
    row = next(r for r in Path(f"/proc/{pid}/limits").read_text().splitlines() if "core" in r)
    return " ".join(row.split()[4:6]), os.stat(f"/proc/{pid}/fd").st_uid


async def _watch(*argv: str) -> tuple[str, int] | None:
    """Start ``affidavit ARGV`` as nobody, as an ordinary start would have it, and read its
    ``_hardened`` until it is ("0 0", root) or a bound passes (a ceiling: a start takes
    seconds on a loaded machine); what was last read."""
    proc = await trio.lowlevel.open_process(
        _unlimited(as_user(NOBODY, "-c", AS_STARTED, *argv)),
        stdin=subprocess.PIPE,  # ``mcp`` serves until its client closes stdin
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    seen = None
    try:
        with trio.move_on_after(HUNG):
            while seen != ("0 0", 0) and proc.poll() is None:
                await trio.sleep(0.05)
                seen = _hardened(proc.pid)
        assert proc.poll() is None, f"exited {proc.returncode}"
    finally:
        proc.kill()
        await proc.wait()
    return seen


async def test_serve_runs_without_core_dumps_and_not_dumpable(home: Path) -> None:
    socket = home / "affidavit.sock"
    # No target: a daemon serves without one.
    config = write_daemon_config(home, {}, socket=socket)
    os.chown(config, NOBODY, NOBODY)
    assert await _watch("serve", "--config", str(config)) == ("0 0", 0)


async def test_the_mcp_server_runs_without_core_dumps_and_not_dumpable(home: Path) -> None:
    """The proxy form (``--socket``): it reads no config, and is hardened all the same -- the
    embedded form resolves credentials in this process."""
    require_module("mcp", "mcp")
    argv = ["mcp", "--socket", str(home / "affidavit.sock"), "--daemon-uid", str(NOBODY)]
    assert await _watch(*argv) == ("0 0", 0)


# As ``AS_STARTED``, with ``MODULE:NAME`` (the first argument) replaced by a pause: the command
# runs up to where it would call it, says so on stdout and waits for stdin to close.
PAUSED = """
import ctypes, importlib, os, runpy, sys
ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)
where, name = sys.argv[1].split(":")
*path, last = name.split(".")
owner = importlib.import_module(where)
for part in path:
    owner = getattr(owner, part)
def pause(*args, **kwargs):
    os.write(1, b"paused\\n")
    while os.read(0, 1):
        pass
    os._exit(0)
setattr(owner, last, pause)
sys.argv = ["affidavit", *sys.argv[2:]]
runpy.run_module("affidavit", run_name="__main__", alter_sys=True)
"""

HARDENED = ("0 0", 0)
AS_STARTED_SEEN = ("unlimited unlimited", NOBODY)


async def _paused_at(where: str, *argv: str) -> tuple[str, int]:
    """``_hardened`` of ``affidavit ARGV``, run as nobody as an ordinary start would have it,
    while it stands where it would call ``where`` (``MODULE:NAME``)."""
    proc = await trio.lowlevel.open_process(
        _unlimited(as_user(NOBODY, "-c", PAUSED, where, *argv)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=client_env(),  # no $AFFIDAVIT_SOCKET: a command runs embedded unless told
    )
    assert proc.stdout is not None and proc.stderr is not None
    said = b""
    try:
        with trio.move_on_after(3 * WAIT):
            while not said.endswith(b"paused\n"):
                more = await proc.stdout.receive_some(64)
                if not more:
                    break
                said += more
        if said.endswith(b"paused\n"):
            return _hardened(proc.pid)
    finally:
        proc.kill()
        await proc.wait()
    with trio.move_on_after(WAIT):
        said += await proc.stderr.receive_some(4096)
    raise AssertionError(f"never reached {where}: {said!r}")


@pytest.fixture
def action(home: Path) -> Path:
    path = home / "action.json"
    path.write_text('{"target": "api", "method": "GET", "path": "/"}')
    os.chown(path, NOBODY, NOBODY)
    return path


async def test_an_embedded_call_opens_its_broker_without_core_dumps(
    home: Path, action: Path
) -> None:
    """``call --config``: this process resolves the credentials and holds the broker key."""
    config = write_daemon_config(home, {}, socket=home / "affidavit.sock")
    os.chown(config, NOBODY, NOBODY)
    where = "affidavit.api.broker:Broker.open"
    assert await _paused_at(where, "call", "--config", str(config), str(action)) == HARDENED


async def test_a_command_loading_the_signing_key_runs_without_core_dumps(home: Path) -> None:
    key = str(home / "signing.key")
    where = "affidavit.journal:SigningKey.load"
    assert await _paused_at(where, "journal", "public-key", "--signing-key", key) == HARDENED


async def test_the_vault_commands_run_without_core_dumps(home: Path) -> None:
    where = "affidavit.secrets.vault:Vault.open"
    assert await _paused_at(where, "vault", "lock", "--vault", str(home / "vault")) == HARDENED


async def test_a_thin_client_call_is_left_as_it_started(home: Path, action: Path) -> None:
    """Through the daemon's socket ``call`` holds no secret: nothing is changed."""
    argv = ["call", "--socket", str(home / "affidavit.sock"), str(action)]
    where = "affidavit.cli.call:ask_daemon"
    assert await _paused_at(where, *argv) == AS_STARTED_SEEN


@pytest.mark.parametrize(
    ("where", "argv"),
    [
        ("affidavit.cli.diagrams:_run", ["diagrams", "--check"]),
        ("affidavit.journal:JournalReader.open", ["actions", "--journal", "j.db"]),
    ],
)
async def test_a_command_loading_no_secret_is_left_as_it_started(
    home: Path, where: str, argv: list[str]
) -> None:
    assert await _paused_at(where, *argv) == AS_STARTED_SEEN
