"""A real ``affidavit serve`` process for the daemon tests, and the clients that talk to it.

    async with running_daemon(tmp_path, targets, service={...}) as daemon:
        daemon.socket, daemon.journal, daemon.log_text(), daemon.proc
        await cli(daemon, "call", "-", stdin=action_bytes)       # affidavit call --socket ...

The daemon is a child process started with ``python -m affidavit serve`` (its own environment:
the credential lives there, not in the clients').  The remote it calls is a ``HostileServer``
in the test's own process.  Every wait is bounded (``WAIT``; a child process's start-up and end
``HUNG``) and watches the daemons it names (``wait_until(..., watch=[daemon])``): one that exits
first ends the wait at once with its exit status and what it printed (``ChildExited``), never
with the ceiling.  A daemon that outlives its test is killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from affidavit.adapters.http.trust import ENV_IGNORED
from tests.broker.helpers import TOKEN_ENV, http_target, write_config
from tests.external import require_root

__all__ = [
    "HUNG",
    "NOBODY",
    "WAIT",
    "ChildExited",
    "DaemonProc",
    "Run",
    "action",
    "action_bytes",
    "api_target",
    "as_user",
    "ask",
    "cli",
    "client_env",
    "curl_api",
    "embedded",
    "in_process",
    "launch",
    "run",
    "running_daemon",
    "serving",
    "start_caller",
    "start_daemon",
    "stop",
    "wait_until",
    "write_daemon_config",
]

WAIT = 20.0
"""The bound on any wait in these tests for an event."""
HUNG = 60.0
"""The bound on a child process's start-up (its socket answers) or its end: a ceiling for a hung
one, never a timing -- nothing waits it out on success, and on a loaded machine (two cores,
several test runs at once) a Python that imports the broker can take several seconds."""
NOBODY = 65534
"""The uid (and gid) of ``nobody``: the other user a test runs a client as (root only)."""
PYTHON = sys.executable


@dataclass
class Run:
    returncode: int
    stdout: bytes
    stderr: bytes

    def json(self) -> Any:
        return json.loads(self.stdout)


@dataclass
class DaemonProc:
    config: Path
    socket: Path
    journal: Path
    log: Path
    proc: subprocess.Popen[bytes]

    def log_text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    async def wait(self, timeout: float = HUNG) -> int:
        with trio.fail_after(timeout):
            while self.proc.poll() is None:
                await trio.sleep(0.02)
        return self.proc.returncode


class ChildExited(AssertionError):
    """A wait ended because a daemon it watched had exited: its exit status and what it
    printed, in the message and as attributes."""

    def __init__(self, what: str, returncode: int, output: str) -> None:
        super().__init__(f"{what}: the daemon exited {returncode} first; it printed:\n{output}")
        self.returncode = returncode
        self.output = output


def daemon_env(token: str | None) -> dict[str, str]:
    """This process's environment without ``AFFIDAVIT_*`` nor the TLS variables the broker
    ignores (``ENV_IGNORED``: a machine that sets ``SSL_CERT_FILE`` would give every daemon a
    start-up warning that tests asserting a quiet start would fail on)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("AFFIDAVIT_") and k not in ENV_IGNORED
    }
    if token is not None:
        env[TOKEN_ENV] = token
    return env


def write_daemon_config(
    tmp: Path,
    targets: Mapping[str, Mapping[str, Any]],
    *,
    socket: Path,
    service: Mapping[str, Any] | None = None,
    journal: Mapping[str, Any] | None = None,
) -> Path:
    path = write_config(tmp, targets, journal=journal)
    lines = ["", "[service]", f"socket = {json.dumps(str(socket))}"]
    for key, value in (service or {}).items():
        lines.append(f"{key} = {json.dumps(value)}")
    with path.open("a", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return path


def launch(
    config: Path,
    socket: Path,
    log: Path,
    token: str | None,
    command: Sequence[str] | None = None,
    journal: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> DaemonProc:
    """Start ``affidavit serve --config CONFIG`` (or ``command``: it ``as_user``, or a script
    that runs it) with its output in ``log`` and ``env`` (else ``daemon_env(token)``) as its
    environment; wait for nothing."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            list(command or [PYTHON, "-m", "affidavit", "serve", "--config", str(config)]),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            env=dict(env) if env is not None else daemon_env(token),
        )
    return DaemonProc(config, socket, journal or config.parent / "journal.db", log, proc)


async def start_daemon(
    config: Path,
    socket: Path,
    log: Path,
    token: str | None,
    command: Sequence[str] | None = None,
    journal: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> DaemonProc:
    """``launch``, and wait (bounded, watching it) until its socket answers ``/v1/health``."""
    daemon = launch(config, socket, log, token, command, journal, env)
    try:
        await wait_until(
            lambda: _answers(daemon), "the daemon answers on its socket", HUNG, watch=[daemon]
        )
    except BaseException:
        stop(daemon)
        raise
    return daemon


async def start_sharing(
    tmp: Path,
    name: str,
    url: str,
    targets: Mapping[str, Mapping[str, Any]],
    token: str | None,
    service: Mapping[str, Any],
    **journal: Any,
) -> DaemonProc:
    """``start_daemon`` in ``tmp/name`` on the shared journal at ``url``: the sealing key
    ``tmp/shared.key`` every broker holds, a signing key of its own, ``journal`` added to its
    ``[journal]`` table."""
    d = tmp / name
    d.mkdir()
    keys = {"url": url, "key_file": str(tmp / "shared.key"), "signing_key": str(d / "signing.key")}
    journal = {**keys, **journal}
    config = write_daemon_config(d, targets, socket=d / "s.sock", service=service, journal=journal)
    return await start_daemon(config, d / "s.sock", d / "daemon.log", token)


async def _answers(daemon: DaemonProc) -> bool:
    """Any HTTP answer counts (a daemon that refuses this test's uid answers 403)."""
    if not daemon.socket.exists():
        return False
    from affidavit.api.wire import ClientError, blocking_request

    try:
        await trio.to_thread.run_sync(blocking_request, str(daemon.socket), "GET", "/v1/health")
    except ClientError:
        return False
    return True


@contextlib.asynccontextmanager
async def running_daemon(
    tmp: Path,
    targets: Mapping[str, Mapping[str, Any]],
    *,
    token: str | None,
    service: Mapping[str, Any] | None = None,
    socket_dir: Path | None = None,
) -> AsyncIterator[DaemonProc]:
    socket = (socket_dir or tmp) / "affidavit.sock"
    config = write_daemon_config(tmp, targets, socket=socket, service=service)
    daemon = await start_daemon(config, socket, tmp / "daemon.log", token)
    try:
        yield daemon
    finally:
        stop(daemon)


@contextlib.asynccontextmanager
async def serving(
    tmp: Path,
    script: Any,
    *,
    token: str,
    overrides: Mapping[str, Any] | None = None,
    **daemon_kw: Any,
) -> AsyncIterator[tuple[Any, DaemonProc]]:
    """A scripted remote (``HostileServer``) and a daemon whose target ``api`` is it (with
    ``overrides`` of its settings)."""
    from tests.http.hostile import HostileServer

    async with (
        HostileServer.running(script) as srv,
        running_daemon(
            tmp, api_target(srv.url, **(overrides or {})), token=token, **daemon_kw
        ) as daemon,
    ):
        yield srv, daemon


@contextlib.asynccontextmanager
async def in_process(
    tmp: Path,
    script: Any,
    *,
    journal: Mapping[str, Any] | None = None,
    service: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> AsyncIterator[tuple[Any, Path]]:
    """A scripted remote (``HostileServer``) and a daemon whose target ``api`` is it, run in this
    process (``Daemon.run`` as a program embedding the daemon runs it: trio's signal receiver,
    a watchdog that only logs -- not ``affidavit serve``'s signals' thread nor its exit 74) so
    that a test can fail or hold its reads on cue: yields the remote and the daemon's socket,
    where the caller is.  The credential
    is the test's own environment's (``TOKEN_ENV``).  Shut down on leaving, as ``serve`` is on
    SIGTERM.  ``overrides``: of the target's settings."""
    from affidavit.config import load_config
    from affidavit.daemon.server import Daemon
    from tests.http.hostile import HostileServer

    socket = tmp / "affidavit.sock"
    async with HostileServer.running(script) as srv, trio.open_nursery() as nursery:
        config = write_daemon_config(
            tmp,
            api_target(srv.url, **(overrides or {})),
            socket=socket,
            journal=journal,
            service=service,
        )
        daemon = Daemon(load_config(config))
        await nursery.start(daemon.run)
        yield srv, socket
        daemon.shutdown.set()


def stop(daemon: DaemonProc) -> None:
    if daemon.proc.poll() is None:
        daemon.proc.send_signal(signal.SIGTERM)
        try:
            daemon.proc.wait(timeout=HUNG)
        except subprocess.TimeoutExpired:
            daemon.proc.kill()
            daemon.proc.wait(timeout=HUNG)


async def run(
    argv: Sequence[str], *, stdin: bytes = b"", env: Mapping[str, str] | None = None
) -> Run:
    """Run a program to its end (bounded) and capture its output."""
    with trio.fail_after(HUNG):
        proc = await trio.run_process(
            list(argv), stdin=stdin, capture_stdout=True, capture_stderr=True, check=False, env=env
        )
    return Run(proc.returncode, proc.stdout, proc.stderr)


AT_ONCE = 3
"""How many independent programs ``run_all`` runs at a time: their Python start-ups overlap
on two cores, and a few more than the cores keep them busy while one waits on its output."""


async def run_all(
    argvs: Sequence[Sequence[str]],
    *,
    env: Mapping[str, str] | None = None,
    within: float = HUNG,
) -> list[Run]:
    """``run`` each of ``argvs`` -- independent programs, none reading what another writes --
    at most ``AT_ONCE`` at a time, each bounded by ``within`` from its own start: their
    results in ``argvs``' order."""
    results: list[Run | None] = [None] * len(argvs)
    limiter = trio.CapacityLimiter(AT_ONCE)

    async def one(i: int, argv: Sequence[str]) -> None:
        async with limiter:
            with trio.fail_after(within):
                results[i] = await run(argv, env=env)

    async with trio.open_nursery() as nursery:
        for i, argv in enumerate(argvs):
            nursery.start_soon(one, i, argv)
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


_DROP_PRIVILEGES = """
import importlib, os, runpy, sys
# Where Python is installed (/root/.pyenv: /root is 0700), or the checkout an editable install
# maps the broker's packages to, the other uid may not reach: each sys.path directory and each
# of those packages' directories is opened now and reached after the drop as /proc/self/fd/N,
# which the kernel resolves without searching the directories above it.  Only the package
# roots are imported first (their directories, by the editable finder's map); every module in
# them is imported after the drop, lazily.
opened = {}
roots = ("affidavit", "affidavit.journal", "affidavit.adapters", "affidavit.statemachine")
packaged = [e for name in roots for e in importlib.import_module(name).__path__]
for entry in [*sys.path, *packaged]:
    if entry not in opened and os.path.isdir(entry):
        opened[entry] = f"/proc/self/fd/{os.open(entry, os.O_RDONLY | os.O_DIRECTORY)}"
def reached(path):
    for entry in sorted(opened, key=len, reverse=True):
        if path == entry or path.startswith(entry + os.sep):
            return opened[entry] + path[len(entry):]
    return path
sys.path[:] = map(reached, sys.path)
for module in list(sys.modules.values()):  # encodings, importlib's own: imported at start-up
    if isinstance(getattr(module, "__path__", None), list):
        module.__path__[:] = map(reached, module.__path__)
sys.path_importer_cache.clear()
uid, gid, groups, mode, what, *rest = sys.argv[1:]
uid, gid, groups = int(uid), int(gid), sorted(int(g) for g in groups.split(",") if g)
os.setgroups(groups)
os.setgid(gid)
os.setuid(uid)
assert (os.getuid(), os.geteuid(), os.getgid(), os.getegid()) == (uid, uid, gid, gid)
assert sorted(os.getgroups()) == groups
sys.argv = [what, *rest]
if mode == "-m":
    runpy.run_module(what, run_name="__main__", alter_sys=True)
else:
    exec(compile(what, "<client>", "exec"), {"__name__": "__main__"})
"""


def as_user(uid: int, *argv: str, gid: int | None = None, groups: Sequence[int] = ()) -> list[str]:
    """``python ARGV`` (``-m MODULE ARGS`` or ``-c CODE ARGS``) as ``uid`` (and group ``gid``,
    by default ``uid``, with the supplementary ``groups``) -- a client of another user, or a
    daemon run as its own user, for root-run tests.

    The child drops its privileges before it imports the broker's modules (only its package
    roots).  The interpreter, site-packages and the checkout may live where another uid cannot
    read (``/root/.pyenv``, ``/root`` mode 0700), which says nothing about the broker: the child
    opens those directories first, as root, and imports from them through ``/proc/self/fd`` --
    lazily, as a process of that uid would, its installed metadata (the protocols' entry
    points) included.  Every file
    of the broker's the child opens and every connection it makes happens as ``uid``."""
    require_root()
    mode, what, *rest = argv
    assert mode in ("-m", "-c"), mode
    ids = [str(uid), str(uid if gid is None else gid), ",".join(map(str, groups))]
    return [PYTHON, "-c", _DROP_PRIVILEGES, *ids, mode, what, *rest]


def client_env(socket: Path | None = None) -> dict[str, str]:
    """A client's environment: no credential, no config, only (perhaps) the socket."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AFFIDAVIT_") and k != TOKEN_ENV}
    if socket is not None:
        env["AFFIDAVIT_SOCKET"] = str(socket)
    return env


async def cli(daemon: DaemonProc, *args: str, stdin: bytes = b"") -> Run:
    """``affidavit ARGS --socket SOCKET`` in a child process without the credential."""
    return await run(
        [PYTHON, "-m", "affidavit", *args, "--socket", str(daemon.socket)],
        stdin=stdin,
        env=client_env(),
    )


async def embedded(*args: str, stdin: bytes = b"", token: str | None = None) -> Run:
    """``affidavit ARGS`` run embedded (no socket)."""
    env = client_env()
    if token is not None:
        env[TOKEN_ENV] = token
    return await run([PYTHON, "-m", "affidavit", *args], stdin=stdin, env=env)


async def wait_until(
    predicate: Any, what: str, timeout: float = WAIT, *, watch: Sequence[DaemonProc] = ()
) -> Any:
    """Poll an async or plain predicate until it returns something truthy (bounded).  A daemon
    of ``watch`` that has exited while the predicate is still false ends the wait at once:
    ``ChildExited`` with its status and log -- it will not make the predicate true by the
    ceiling."""
    try:
        with trio.fail_after(timeout):
            while True:
                value = predicate()
                if hasattr(value, "__await__"):
                    value = await value
                if value:
                    return value
                for daemon in watch:
                    if daemon.proc.poll() is not None:
                        raise ChildExited(what, daemon.proc.returncode, daemon.log_text())
                await trio.sleep(0.05)
    except trio.TooSlowError:
        raise AssertionError(f"not within {timeout} s: {what}") from None


def action(path: str = "/v1/ok", method: str = "GET", **extra: Any) -> dict[str, Any]:
    return {"target": "api", "method": method, "path": path, **extra}


def action_bytes(path: str = "/v1/ok", method: str = "GET", **extra: Any) -> bytes:
    return json.dumps(action(path, method, **extra)).encode()


def api_target(url: str, **overrides: Any) -> dict[str, dict[str, Any]]:
    return {"api": http_target(url, **overrides)}


async def curl_api(
    curl: str, socket: Path, path: str, body: bytes | None = None
) -> tuple[int, Any]:
    """``curl --unix-socket``: (HTTP status, the JSON body).  POST when ``body`` is given."""
    argv = [curl, "-sS", "-o", "-", "-w", "\n%{http_code}", "--unix-socket", str(socket)]
    if body is not None:
        argv += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
    done = await run([*argv, f"http://affidavit{path}"], stdin=body or b"")
    payload, _, status = done.stdout.rpartition(b"\n")
    return int(status), json.loads(payload)


async def start_caller(daemon: DaemonProc, body: bytes) -> trio.Process:
    """``affidavit call - --socket ...`` as a child process the test may kill mid-call."""
    caller = await trio.lowlevel.open_process(
        [PYTHON, "-m", "affidavit", "call", "-", "--socket", str(daemon.socket)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        env=client_env(),
    )
    assert caller.stdin is not None
    await caller.stdin.send_all(body)
    await caller.stdin.aclose()
    return caller


async def ask(
    socket: Path, method: str, path: str, body: bytes = b""
) -> tuple[int, dict[str, str], bytes]:
    """One request on its own connection: status, headers (lower-cased names), body."""
    stream = await trio.open_unix_socket(str(socket))
    async with stream:
        head = f"{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"
        if body:
            head += f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
        await stream.send_all(head.encode() + b"\r\n" + body)
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    top, _, payload = data.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split(" ", 2)[1]), headers, payload
