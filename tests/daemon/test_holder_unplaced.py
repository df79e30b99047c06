"""A caller reads the lease holder in every record (``evidence.lease.holder``, the lease
events' ``holder``): through the daemon it names neither the broker's host nor its pid -- on a
shared journal it would name another broker's host.  The daemon's log maps the holder to both."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import trio

from affidavit.api.wire import blocking_request
from tests.http.hostile import HostileServer, Reply, scripts

from .kit import WAIT, action_bytes, api_target, start_daemon, stop, write_daemon_config


async def _ask(sock: Path, method: str, target: str, body: bytes | None = None) -> str:
    answer = await trio.to_thread.run_sync(blocking_request, str(sock), method, target, body)
    return bytes(answer.body).decode()


async def test_no_answer_names_the_lease_holders_host_or_pid(tmp_path: Path, token: str) -> None:
    sock, log = tmp_path / "affidavit.sock", tmp_path / "daemon.log"
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        config = write_daemon_config(tmp_path, api_target(srv.url), socket=sock)
        daemon = await start_daemon(config, sock, log, token)
        try:
            with trio.fail_after(WAIT):
                env = json.loads(await _ask(sock, "POST", "/v1/calls", action_bytes()))
                iid = env["invocation_id"]
                view = json.loads(await _ask(sock, "GET", f"/v1/invocations/{iid}"))
        finally:
            stop(daemon)
    holder = env["evidence"]["lease"]["holder"]
    assert view["record"]["evidence"]["lease"]["holder"] == holder, view
    pid = str(daemon.proc.pid)
    for part in (socket.gethostname(), pid):
        assert part not in holder.split(":") and part not in holder, (part, holder)
    # The operator's log maps it to the host and pid.
    assert f"lease holder {holder} is host {socket.gethostname()}, pid {pid}" in log.read_text()
