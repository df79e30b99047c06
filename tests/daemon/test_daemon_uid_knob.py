"""The daemon's user a client trusts, told explicitly: ``Client(daemon_uid=)``, ``--daemon-uid``
on the command line, and the MCP relay's ``--daemon-uid`` -- beside ``$AFFIDAVIT_DAEMON_UID``,
which an explicit value overrides (never adds to).  A daemon of another uid (a stand-in run as
``nobody``: it answers every request with one coded refusal, so that an answer proves the
client asked) is refused without the knob, sent nothing, and asked with it; a value that is no
uid and names no user is a usage error with its code, before the socket is looked at."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from affidavit.api.client import Client
from affidavit.api.wire import ApiError, DaemonUidInvalid, SocketUnsafe
from affidavit.mcp.backends import Daemon, Exchange
from tests.external import require_root

from .kit import NOBODY, WAIT, client_env, run
from .test_socket_trust import connected, line_of, private_directory_of, squatter

HELLO = "a daemon of uid"
"""The stand-in's answer (503 SHUTTING_DOWN), which only a client that asked it reads."""

# Bound by root (the test's directories are root's, mode 0700), then listening as ``uid``: in
# the user's own directory, the socket theirs (``owner``: the path check decides), or in root's,
# the socket root's (``listener``: only SO_PEERCRED tells who listens).
_STAND_IN = """
import os, socket, sys
path, uid, owner = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "owner"
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.bind(path)
if owner:
    os.chown(path, uid, uid)
os.setgroups([])
os.setgid(uid)
os.setuid(uid)
sock.listen(8)
sock.settimeout(20)
said = '{"api_error": {"code": "SHUTTING_DOWN", "message": "%s %d"}}'
body = (said % (sys.argv[4], uid)).encode()
print("ready", flush=True)
while True:
    try:
        conn, _ = sock.accept()
    except TimeoutError:
        break
    conn.settimeout(5)
    with conn:  # a client that refused it after its connect sent nothing and hung up
        got = b""
        while b"\\r\\n\\r\\n" not in got and (data := conn.recv(65536)):
            got += data
        if got:
            conn.sendall(
                b"HTTP/1.1 503 Service Unavailable\\r\\ncontent-type: application/json\\r\\n"
                b"content-length: %d\\r\\nconnection: close\\r\\n\\r\\n%s" % (len(body), body)
            )
"""


@asynccontextmanager
async def stand_in(tmp_path: Path, how: str) -> AsyncIterator[Path]:
    """A daemon's stand-in listening as ``NOBODY``; its socket's path."""
    require_root()
    if how == "owner":
        where = private_directory_of(tmp_path, NOBODY)
    else:
        where = tmp_path / "run"
        where.mkdir(mode=0o755)
    path = where / "affidavit.sock"
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-c", _STAND_IN, str(path), str(NOBODY), how, HELLO],
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        assert await line_of(proc.stdout) == b"ready\n"
        yield path
    finally:
        proc.kill()
        await proc.wait()


async def _client_answer(path: Path, **kwargs: object) -> None:
    """What ``Client.actions`` raises: the stand-in's refusal once it was asked."""
    async with Client.open(path, **kwargs) as client:  # type: ignore[arg-type]
        with trio.fail_after(WAIT):
            await client.actions()


async def _cli(path: Path, *extra: str, env: dict[str, str] | None = None) -> str:
    done = await run(
        [sys.executable, "-m", "affidavit", "actions", "--socket", str(path), *extra],
        env=env or client_env(),
    )
    assert done.returncode == 2, done
    assert b"Traceback" not in done.stderr
    return done.stderr.decode()


@pytest.mark.parametrize("how", ["owner", "listener"])
async def test_a_daemon_of_another_uid_is_asked_only_once_told_explicitly(
    tmp_path: Path, how: str
) -> None:
    async with stand_in(tmp_path, how) as path:
        refused = f"belongs to uid {NOBODY}, not to you"
        with pytest.raises(SocketUnsafe, match=refused):
            await _client_answer(path)
        assert "DAEMON_SOCKET_UNSAFE" in await _cli(path)
        # Told by argument, as a number or a user's name: asked, and its answer read.
        for told in (NOBODY, "nobody", str(NOBODY)):
            with pytest.raises(ApiError, match=f"{HELLO} {NOBODY}"):
                await _client_answer(path, daemon_uid=told)
        assert f"{HELLO} {NOBODY}" in await _cli(path, "--daemon-uid", str(NOBODY))
        assert f"{HELLO} {NOBODY}" in await _cli(path, "--daemon-uid", "nobody")
        # The argument beats the environment: a bad value there is not read; a good one for
        # another uid is not added to the one the argument names.
        bad_env = {**client_env(), "AFFIDAVIT_DAEMON_UID": "no-such-user-here"}
        assert f"{HELLO} {NOBODY}" in await _cli(path, "--daemon-uid", "nobody", env=bad_env)
        other_env = {**client_env(), "AFFIDAVIT_DAEMON_UID": str(NOBODY)}
        assert "DAEMON_SOCKET_UNSAFE" in await _cli(path, "--daemon-uid", "1", env=other_env)


async def test_the_mcp_relay_asks_the_daemon_it_was_told_of(tmp_path: Path) -> None:
    async with stand_in(tmp_path, "owner") as path:
        async with Daemon.open(str(path)) as backend:
            with trio.fail_after(WAIT):
                refused = await backend.call({"target": "api", "method": "GET"}, Exchange())
        assert refused["api_error"]["code"] == "DAEMON_SOCKET_UNSAFE", refused
        async with Daemon.open(str(path), daemon_uid=NOBODY) as backend:
            with trio.fail_after(WAIT):
                asked = await backend.call({"target": "api", "method": "GET"}, Exchange())
        assert asked["api_error"]["code"] == "SHUTTING_DOWN", asked
        assert asked["api_error"]["message"] == f"{HELLO} {NOBODY}", asked


BAD = ["no-such-user-here", "-1", "4294967295", "99999999999999999999", " ", "1.5", "0x10"]


@pytest.mark.parametrize("value", [*BAD, -1, 2**32 - 1, True, 1.5, object()])
def test_a_daemon_uid_argument_that_names_nobody_is_refused_with_its_code(value: object) -> None:
    with pytest.raises(DaemonUidInvalid, match=r"^daemon_uid: ") as refused:
        Client("/nonexistent/affidavit.sock", daemon_uid=value)  # type: ignore[arg-type]
    assert refused.value.code == "DAEMON_UID_INVALID" and refused.value.field == "daemon_uid"
    assert isinstance(refused.value, ValueError)


def test_a_daemon_uid_that_would_not_show_as_itself_is_quoted_escaped() -> None:
    # The one rule (affidavit.text): U+034F passes isprintable and draws nothing.
    with pytest.raises(DaemonUidInvalid) as refused:
        Client("/nonexistent/affidavit.sock", daemon_uid="root\u034f")
    assert "daemon_uid: 'root\\u034f'... is no uid" in str(refused.value), refused.value


@pytest.mark.parametrize("command", ["actions", "mcp", "call"])
@pytest.mark.parametrize("value", ["no-such-user-here", "-1", "4294967295"])
async def test_a_daemon_uid_option_that_names_nobody_is_refused_before_the_socket(
    tmp_path: Path, command: str, value: str
) -> None:
    where = tmp_path / "run"
    where.mkdir(mode=0o750)
    path = where / "affidavit.sock"
    with squatter(path) as sock:
        argv = [command, "--socket", str(path), "--daemon-uid", value]
        done = await run([sys.executable, "-m", "affidavit", *argv], env=client_env())
        assert not connected(sock)
    line = done.stderr.decode()
    assert done.returncode == 2, done
    assert line.startswith(f"affidavit: DAEMON_UID_INVALID: --daemon-uid: {value} is no uid"), line
    assert "Traceback" not in line


async def test_a_daemon_uid_option_without_a_socket_is_refused(tmp_path: Path) -> None:
    done = await run(
        [sys.executable, "-m", "affidavit", "actions", "--daemon-uid", "0"], env=client_env()
    )
    assert done.returncode == 2 and b"--daemon-uid names whose socket" in done.stderr, done


async def test_affidavit_mcp_passes_its_daemon_uid_option_to_the_relay(tmp_path: Path) -> None:
    """``affidavit mcp --socket PATH --daemon-uid nobody``: the relay process asks the
    daemon of that uid (its answer comes back as the tool's ``api_error``)."""
    from tests.external import require_module

    require_module("mcp", "dev")
    from tests.mcp.kit import connected as mcp_connected
    from tests.mcp.kit import structured

    async with stand_in(tmp_path, "owner") as path:
        for extra, code in (([], "DAEMON_SOCKET_UNSAFE"), (["--daemon-uid", "nobody"], None)):
            args = ["--socket", str(path), *extra]
            async with mcp_connected(args, client_env(), tmp_path / "mcp.log") as mcp:
                answer = structured(await mcp.call("list_actions", {}))
            problem = answer["api_error"]
            if code is not None:
                assert problem["code"] == code, answer
            else:
                # (a read refused before anything ran: not_attempted, ask again later)
                assert problem == {
                    "code": "SHUTTING_DOWN",
                    "message": f"{HELLO} {NOBODY}",
                    "outcome": "not_attempted",
                    "retry": "backoff",
                }
