"""``affidavit mcp --socket`` whose daemon cannot be asked at start says so in its log.

Its action tools come from the daemon's catalog: a proxy that could not read it (here the
socket is in a directory others can write, so the client refuses it: DAEMON_SOCKET_UNSAFE, the
refusal an unset ``$AFFIDAVIT_DAEMON_UID`` meets too) lists only the read tools.  The operator
registering the server reads its stderr, not the agent's tool answers: the reason is there.
"""

from __future__ import annotations

import socket as sockets
from pathlib import Path

from .kit import connected, env_without_secrets


async def test_a_catalog_the_proxy_cannot_read_at_start_is_logged_with_its_code(
    tmp_path: Path,
) -> None:
    where = tmp_path / "tmp"
    where.mkdir()
    where.chmod(0o1777)
    socket = where / "affidavit.sock"
    log = tmp_path / "mcp.log"
    with sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM) as squatter:
        squatter.bind(str(socket))
        squatter.listen(8)
        async with connected(["--socket", str(socket)], env_without_secrets(), log) as mcp:
            names = [t.name for t in (await mcp.session.list_tools()).tools]
    assert "http_request" not in names and "fetch_result" in names, names
    text = mcp.stderr()
    assert (
        "WARNING no action tools until the catalog can be read (asked again at each "
        f"tools/list): DAEMON_SOCKET_UNSAFE: refusing the daemon's socket {socket}: {where} is "
        "writable by others (mode 1777)"
    ) in text, text
