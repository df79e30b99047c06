"""docs/deployment.md's recommended layout, for real: the daemon runs as its own user, the agent
as another one in the clients' group, each a process of its uid (``kit.as_user``; root only).

The table of files and modes there, scaled down under one root-owned directory: the config
``root:<daemon's group> 0640`` in a ``0750`` directory, the state directory the daemon's own
(``0700``), the socket directory ``<daemon>:<clients> 0750``; the daemon's primary group is the
clients' group (the systemd unit's ``Group=``) and its own group a supplementary one.  The agent
calls through the socket once told the daemon's user (``$AFFIDAVIT_DAEMON_UID``), reads none of
the broker's files, and a step left out is refused with a line that says which.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker.helpers import TOKEN_ENV
from tests.external import require_root
from tests.http.hostile import HostileServer, Reply, scripts

from .kit import (
    NOBODY,
    api_target,
    as_user,
    client_env,
    run,
    running_daemon,
    start_daemon,
    stop,
    write_daemon_config,
)

DAEMON = NOBODY
"""The daemon's user (``affidavit`` in the doc); its own group is ``nogroup``, also NOBODY."""
CLIENTS = 65530
"""``affidavit-clients``: the socket's group, the agents' supplementary group."""
AGENT = 65533
"""An agent's account, a member of CLIENTS."""
STRANGER = 65532
"""A local user the doc's ``usermod -aG affidavit-clients`` left out."""


CLIENT_SCRIPT = """
import trio, affidavit

async def main():
    async with affidavit.Client.open() as client:   # the MCP proxy's client
        try:
            await client.actions()
        except Exception as exc:
            print(type(exc).__name__, exc)

trio.run(main)
"""


@pytest.fixture
def layout() -> Iterator[Path]:
    """``/etc/affidavit``, ``/var/lib/affidavit`` and ``/run/affidavit`` under one directory of
    root's (``0755``, in the sticky ``/tmp``: every directory above is root's)."""
    root = Path(tempfile.mkdtemp(prefix="affidavit-layout-"))
    root.chmod(0o755)
    for name, mode, owner in (
        ("etc", 0o750, (0, NOBODY)),
        ("lib", 0o700, (DAEMON, NOBODY)),
        ("run", 0o750, (DAEMON, CLIENTS)),
    ):
        (root / name).mkdir()
        (root / name).chmod(mode)  # not mkdir's mode: the umask would narrow it
        os.chown(root / name, *owner)
    try:
        yield root
    finally:
        for path in sorted(root.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()
        root.rmdir()


async def test_the_documented_layout_serves_an_agent_of_another_user_and_nothing_else(
    layout: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_root()
    etc, lib, run_dir = layout / "etc", layout / "lib", layout / "run"
    socket = run_dir / "affidavit.sock"
    ok = Reply(200, body=b'{"balance": 7}')
    async with HostileServer.running(scripts.serve(ok)) as srv:
        config = write_daemon_config(
            etc,
            {
                "billing": {
                    "kind": "http",
                    "url": srv.url,
                    "methods": ["GET"],
                    "credential": f"env:{TOKEN_ENV}",
                }
            },
            socket=socket,
            service={"allow_gids": [CLIENTS]},
            journal={"path": str(lib / "journal.db")},
        )
        os.chown(config, 0, NOBODY)
        config.chmod(0o640)
        serve = ["-m", "affidavit", "serve", "--config", str(config)]
        command = as_user(DAEMON, *serve, gid=CLIENTS, groups=[NOBODY])
        # This process (root) waits for the daemon's socket: it is told whose it is, as an
        # agent is.
        monkeypatch.setenv("AFFIDAVIT_DAEMON_UID", str(DAEMON))
        daemon = await start_daemon(
            config, socket, layout / "daemon.log", token, command, lib / "journal.db"
        )
        try:
            agent_env = {**client_env(socket), "HOME": "/nonexistent"}
            told = {**agent_env, "AFFIDAVIT_DAEMON_UID": str(DAEMON)}
            action = b'{"target": "billing", "method": "GET", "path": "/v1/balance"}'
            call = ["-m", "affidavit", "call", "-"]

            # The table's modes: the socket is the one file the clients' group reaches.
            st = socket.lstat()
            assert stat.S_ISSOCK(st.st_mode), st
            assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (DAEMON, CLIENTS, 0o660)
            made = [p for p in lib.iterdir()]
            assert {p.name for p in made} >= {
                "journal.db",
                "journal.db.key",
                "journal.db.signing.key",
                "journal.db.lock",
            }, made
            for path in [*made, Path(f"{socket}.lock")]:
                st = path.lstat()
                assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (DAEMON, 0o600), path

            # Nothing of the broker's is the agent's to read.
            for secret in (config, *made):
                probe = await run(
                    as_user(AGENT, "-c", f"open({str(secret)!r}, 'rb').read()", groups=[CLIENTS]),
                    env=told,
                )
                assert probe.returncode == 1 and b"PermissionError" in probe.stderr, secret

            by_agent = await run(as_user(AGENT, *call, groups=[CLIENTS]), stdin=action, env=told)
            assert by_agent.returncode == 0, by_agent.stderr
            assert json.loads(by_agent.json()["result"]["body"]) == {"balance": 7}

            # The agent's MCP server as docs/mcp.md registers it: `affidavit mcp --socket`
            # in the agent's account, AFFIDAVIT_DAEMON_UID in its environment.
            from tests.mcp.kit import connected, structured

            drop = as_user(AGENT, "-m", "affidavit", groups=[CLIENTS])[1:-2]
            mcp_log = layout / "mcp.log"
            async with connected(["--socket", str(socket)], told, mcp_log, drop) as mcp:
                answer = structured(
                    await mcp.call(
                        "http_request", {"target": "billing", "method": "GET", "path": "/v1/mcp"}
                    )
                )
            assert json.loads(answer["result"]["body"]) == {"balance": 7}, answer
            assert "WARNING" not in mcp_log.read_text(), mcp_log.read_text()

            # AFFIDAVIT_DAEMON_UID left out: refused before a connect, with the line to set.
            untold = await run(as_user(AGENT, *call, groups=[CLIENTS]), stdin=action, env=agent_env)
            assert untold.returncode == 2, untold
            assert untold.stderr.decode() == (
                f"affidavit: DAEMON_SOCKET_UNSAFE: refusing the daemon's socket {socket}: it "
                f"belongs to uid {DAEMON}, not to you (uid {AGENT}) or root: whoever it is could "
                f"read every call sent there; if uid {DAEMON} runs the affidavit daemon, pass "
                f"--daemon-uid {DAEMON} (or Client(daemon_uid={DAEMON})), or set "
                f"AFFIDAVIT_DAEMON_UID={DAEMON}\n"
            )

            # A user left out of the clients' group cannot open the socket, and is told why.
            stranger = await run(as_user(STRANGER, *call), stdin=action, env=told)
            assert stranger.returncode == 2, stranger
            line = stranger.stderr.decode()
            assert line.startswith(
                f"affidavit: DAEMON_UNAVAILABLE: cannot reach the affidavit daemon at {socket} "
                "(Permission denied: "
            ), line
            assert "the socket's group" in line and "Traceback" not in line, line
            by_client = await run(as_user(STRANGER, "-c", CLIENT_SCRIPT), env=told)
            assert by_client.stdout.decode().startswith(
                f"DaemonUnavailable cannot reach the affidavit daemon at {socket} (Permission "
                f"denied: this user may not open the socket or enter its directory -- is it in "
                f"the socket's group?)"
            ), by_client
        finally:
            stop(daemon)
        assert daemon.proc.returncode == 0, daemon.log_text()
    assert [r.header("authorization") for r in srv.requests] == [f"Bearer {token}"] * 2
    assert token not in daemon.log_text()
    assert "none of the allowed gids" not in daemon.log_text()


async def test_a_socket_no_allowed_group_can_open_is_warned_of_at_start(
    tmp_path: Path, token: str
) -> None:
    """The daemon started under its own primary group (not the clients'): its socket is
    ``0660`` of a group none of ``allow_gids`` is, so their members get EACCES before the
    daemon sees them.  The start-up log says so, and how to fix it."""
    require_root()
    async with running_daemon(
        tmp_path, api_target("http://127.0.0.1:9"), token=token, service={"allow_gids": [CLIENTS]}
    ) as daemon:
        log = daemon.log_text()
    assert (
        f"WARNING the socket {daemon.socket} has group 0, none of the allowed gids [{CLIENTS}]: "
        "their members cannot open it (mode 0660); start the daemon with that group as its "
        "primary group (systemd: Group=)"
    ) in log, log
