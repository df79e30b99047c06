"""A client sends nothing to a socket someone other than the daemon's user could have put there.

The daemon refuses to listen in a directory others can write (sticky or not,
test_socket_claim.py); its clients -- the command line's one-shot request, the async
``Client`` the MCP proxy uses -- keep the same rule for the socket they are pointed at: in a
sticky ``/tmp`` another user could have bound the name first and would read every call sent
to it.  Each case binds a real listening socket and checks nothing connected to it.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio

from affidavit.api.client import Client
from affidavit.api.wire import SocketUnsafe
from affidavit.mcp.backends import Daemon, Exchange
from tests.cancel import cancel_once
from tests.external import require_root

from .kit import NOBODY, WAIT, client_env, run


@contextmanager
def squatter(path: Path) -> Iterator[socket.socket]:
    """A listening socket at ``path``: whoever connects is queued, never answered."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(8)
    sock.setblocking(False)
    try:
        yield sock
    finally:
        sock.close()


async def asked(path: Path, sock: socket.socket) -> bool:
    """Whether ``Client`` connects to the squatter at ``path``: the call is given up once a
    connection waits there (it is never answered) -- not after 0.5 s, which a loaded machine
    did not always take to connect."""
    client = Client(path)
    try:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                waiting = lambda: select.select([sock], [], [], 0)[0]  # noqa: E731
                nursery.start_soon(cancel_once, scope, waiting, "a connection at the squatter")
                await client.actions()
    finally:
        await client.aclose()
    return connected(sock)


def connected(sock: socket.socket) -> bool:
    try:
        sock.accept()[0].close()
    except BlockingIOError:
        return False
    return True


async def refused_everywhere(path: Path, sock: socket.socket, why: str) -> None:
    """The async ``Client`` (the MCP proxy's) and the command line (``blocking_request``, in
    a child: a squatter that never answers would hold it) both refuse, having sent nothing."""
    client = Client(path)
    try:
        with trio.fail_after(WAIT), pytest.raises(SocketUnsafe, match=why):
            await client.actions()
    finally:
        await client.aclose()
    done = await run(
        [sys.executable, "-m", "affidavit", "actions", "--socket", str(path)], env=client_env()
    )
    assert done.returncode == 2, done
    assert b"affidavit: DAEMON_SOCKET_UNSAFE: refusing the daemon's socket" in done.stderr
    assert b"Traceback" not in done.stderr
    assert not connected(sock)  # nothing was sent, not even a connect


@pytest.mark.parametrize("mode", [0o1777, 0o777, 0o770])
async def test_a_socket_in_a_directory_others_can_write_is_not_asked(
    tmp_path: Path, mode: int
) -> None:
    where = tmp_path / "tmp"
    where.mkdir()
    where.chmod(mode)
    path = where / "affidavit.sock"
    with squatter(path) as sock:
        await refused_everywhere(path, sock, rf"{where} is writable by others \(mode {mode:04o}\)")


async def test_a_socket_of_another_user_than_its_directory_s_is_not_asked(tmp_path: Path) -> None:
    require_root()
    where = tmp_path / "run"
    where.mkdir(mode=0o755)
    path = where / "affidavit.sock"
    with squatter(path) as sock:
        os.chown(path, NOBODY, NOBODY)
        await refused_everywhere(path, sock, f"it belongs to uid {NOBODY}")


async def test_a_socket_whose_directory_another_user_could_replace_is_not_asked(
    tmp_path: Path,
) -> None:
    above = tmp_path / "shared"
    where = above / "run"
    where.mkdir(parents=True, mode=0o750)
    above.chmod(0o777)
    path = where / "affidavit.sock"
    with squatter(path) as sock:
        await refused_everywhere(path, sock, f"{above} .* lets another user replace {where}")


async def test_a_socket_in_its_user_s_own_directory_is_asked(tmp_path: Path) -> None:
    """The rule refuses what it must only: the deployment's ``0750`` directory is reached."""
    where = tmp_path / "run"
    where.mkdir(mode=0o750)
    path = where / "affidavit.sock"
    with squatter(path) as sock:
        assert await asked(path, sock)


async def test_the_mcp_proxy_answers_an_unsafe_socket_with_its_code(tmp_path: Path) -> None:
    """The MCP proxy's backend asks through ``Client``: its tool answers say why, coded."""
    where = tmp_path / "tmp"
    where.mkdir()
    where.chmod(0o1777)
    path = where / "affidavit.sock"
    with squatter(path) as sock:
        async with Daemon.open(str(path)) as backend:
            with trio.fail_after(WAIT):
                answer = await backend.call({"target": "api", "method": "GET"}, Exchange())
        assert answer["api_error"]["code"] == "DAEMON_SOCKET_UNSAFE", answer
        assert not connected(sock)


def private_directory_of(tmp_path: Path, uid: int) -> Path:
    """A directory only ``uid`` may enter (``0700``), with root's above it: an attacker's."""
    where = tmp_path / "theirs"
    where.mkdir(mode=0o700)
    os.chown(where, uid, uid)
    return where


async def test_a_socket_in_another_user_s_private_directory_is_not_asked(tmp_path: Path) -> None:
    """Its owner could have put any socket there (the directory is writable by them only):
    a client trusts root, itself and the daemon's user it was told -- not whoever owns the
    directory it was pointed into -- and says how to trust the daemon's user."""
    require_root()
    where = private_directory_of(tmp_path, NOBODY)
    path = where / "affidavit.sock"
    with squatter(path) as sock:
        os.chown(path, NOBODY, NOBODY)
        await refused_everywhere(path, sock, f"it belongs to uid {NOBODY}, not to you")
        os.chown(path, 0, 0)  # root's socket in their directory: they could still replace it
        # Every way there is to name the daemon's user, on the one line of the refusal.
        hint = (
            rf"if uid {NOBODY} runs the affidavit daemon, pass --daemon-uid {NOBODY} \(or "
            rf"Client\(daemon_uid={NOBODY}\)\), or set AFFIDAVIT_DAEMON_UID={NOBODY}$"
        )
        await refused_everywhere(path, sock, f"^[^\n]*{where} belongs to uid {NOBODY}, .*{hint}")


@pytest.mark.parametrize("named", [str(NOBODY), "nobody"])
async def test_a_socket_of_the_daemon_s_user_the_client_was_told_is_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, named: str
) -> None:
    require_root()
    where = private_directory_of(tmp_path, NOBODY)
    path = where / "affidavit.sock"
    monkeypatch.setenv("AFFIDAVIT_DAEMON_UID", named)
    with squatter(path) as sock:
        os.chown(path, NOBODY, NOBODY)
        assert await asked(path, sock)


@pytest.mark.parametrize("named", ["no-such-user-here", "4294967295", "99999999999999999999"])
async def test_a_daemon_uid_that_names_nobody_is_refused_with_its_code(
    tmp_path: Path, named: str
) -> None:
    where = tmp_path / "run"
    where.mkdir(mode=0o750)
    path = where / "affidavit.sock"
    env = {**client_env(), "AFFIDAVIT_DAEMON_UID": named}
    with squatter(path) as sock:
        done = await run(
            [sys.executable, "-m", "affidavit", "actions", "--socket", str(path)], env=env
        )
        assert not connected(sock)
    assert done.returncode == 2, done
    line = done.stderr.decode()
    assert f"affidavit: DAEMON_SOCKET_UNSAFE: $AFFIDAVIT_DAEMON_UID={named} names no user" in line
    assert "Traceback" not in line


# A listener of another user at a path every check passes: what a swap between the client's
# look at the path and its connect leaves (a link in a directory of the attacker's pointed
# elsewhere meanwhile, a missing directory made).  Bound by root, so the file and every
# directory above are root's; ``listen`` is called as ``uid``, whose process the kernel names.
_LISTENER = """
import os, socket, sys
path, uid = sys.argv[1], int(sys.argv[2])
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.bind(path)
os.setgroups([])
os.setgid(uid)
os.setuid(uid)
sock.listen(8)
sock.settimeout(20)
print("ready", flush=True)
got = 0
while True:  # every connection, until none comes for a while: what each one sent
    try:
        conn, _ = sock.accept()
    except TimeoutError:
        break
    conn.settimeout(5)
    with conn:
        while data := conn.recv(65536):
            got += len(data)
    sock.settimeout(3)
print("received", got, flush=True)
"""


async def line_of(stream: trio.abc.ReceiveStream) -> bytes:
    """The next line the listener prints (bounded)."""
    out = b""
    with trio.fail_after(WAIT * 2):
        while not out.endswith(b"\n"):
            chunk = await stream.receive_some(1)
            assert chunk, out
            out += chunk
    return out


async def test_a_socket_another_user_listens_on_is_not_sent_a_byte(tmp_path: Path) -> None:
    """The path passes every check, the kernel says who listens (SO_PEERCRED): a listener of
    an untrusted uid gets the connect and nothing else, from the async ``Client`` and from
    the command line alike."""
    require_root()
    where = tmp_path / "run"
    where.mkdir(mode=0o755)
    path = where / "affidavit.sock"
    listener = await trio.lowlevel.open_process(
        [sys.executable, "-c", _LISTENER, str(path), str(NOBODY)], stdout=subprocess.PIPE
    )
    try:
        assert listener.stdout is not None
        assert await line_of(listener.stdout) == b"ready\n"
        assert (path.stat().st_uid, where.stat().st_uid) == (0, 0)
        why = f"the process listening on it belongs to uid {NOBODY}, not to you"
        client = Client(path)
        try:
            with trio.fail_after(WAIT), pytest.raises(SocketUnsafe, match=why):
                await client.actions()
        finally:
            await client.aclose()
        done = await run(
            [sys.executable, "-m", "affidavit", "actions", "--socket", str(path)],
            env=client_env(),
        )
        assert done.returncode == 2, done
        assert f"affidavit: DAEMON_SOCKET_UNSAFE: refusing the daemon's socket {path}: {why}" in (
            done.stderr.decode()
        )
        assert await line_of(listener.stdout) == b"received 0\n"  # connected, sent nothing
    finally:
        listener.kill()
        await listener.wait()
