"""A daemon asked to stop while the console's whole verify runs stops at once, never after the
verify (~41 s at 1M events): the verify is a system task of the daemon's event loop reading in
a view thread (``Broker.view``, abandoned on cancel), cancelled when the daemon's main task
ends; its thread is a daemon thread the process does not wait for, and what it would have
shown is the console's memory only (never written to the journal).

The daemon is a real process whose ``JournalReader.verify`` is held (it waits on an event no
one sets, bounded) and says when it began; the operator logs in and presses the button over
plain HTTP, then the daemon is sent SIGTERM."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import trio

from tests.broker.helpers import http_target
from tests.daemon.kit import WAIT, DaemonProc, cli, start_daemon, stop, write_daemon_config
from tests.external import on_free_port_async

from .kit import csrf_of, post

HELD = 300.0
"""Seconds the held verify waits at most: far past any bound here."""

RUNNER = f"""
import sys, threading
from affidavit.journal import JournalReader

def held(self, *a, **k):
    open(sys.argv[-1], "w").close()
    threading.Event().wait({HELD})
    raise SystemExit("the held verify was let go")

JournalReader.verify = held
from affidavit.cli import main
sys.exit(main(sys.argv[1:-1]))
"""


async def test_a_daemon_stops_at_once_while_a_whole_verify_runs(tmp_path: Path, token: str) -> None:
    runner, begun = tmp_path / "run.py", tmp_path / "verifying"
    runner.write_text(RUNNER)
    socket = tmp_path / "affidavit.sock"
    targets = {"pay": http_target("http://127.0.0.1:9")}

    async def daemon_on(port: int) -> DaemonProc:
        service = {
            "operator_uids": [os.geteuid()],
            "allow_self_approval": True,
            "console": f"127.0.0.1:{port}",
        }
        config = write_daemon_config(tmp_path, targets, socket=socket, service=service)
        command = [sys.executable, str(runner), "serve", "--config", str(config), str(begun)]
        log = tmp_path / "daemon.log"
        return await start_daemon(config, socket, log, token, command=command)

    daemon, port = await on_free_port_async(daemon_on)
    try:
        with trio.fail_after(WAIT):
            url = (await cli(daemon, "console-url")).stdout.decode().strip()
            origin = f"http://127.0.0.1:{port}"
            login = {"token": url.split("token=", 1)[1]}
            status, headers, _ = await post(f"{origin}/login", login, {"Origin": origin})
            assert status == 200, status
            cookie = headers["set-cookie"].split(";")[0]
            form = {"csrf": await csrf_of(origin, cookie)}
            sent = {"Origin": origin, "Cookie": cookie}
            status, _, _ = await post(f"{origin}/journal/verify", form, sent)
            assert status == 303, status
            while not begun.exists():  # (the verify's thread holds it now)
                await trio.sleep(0.05)
        daemon.proc.send_signal(signal.SIGTERM)
        with trio.move_on_after(WAIT):  # a bound, far below the held verify's
            while daemon.proc.poll() is None:
                await trio.sleep(0.05)
        assert daemon.proc.poll() == 0, "the daemon's stop waited for the whole verify"
        log = daemon.log_text()
        assert "stopped" in log and "Traceback" not in log, log[-2000:]
    finally:
        stop(daemon)
