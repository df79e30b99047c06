"""The daemon's background work on a shared journal whose database goes away for a few seconds
(beyond ``[journal] reconnect``).  Besides the request handlers the daemon runs two loops --
its approvals dispatcher (tests/broker/test_journal_away_approvals.py: a sweep that cannot read
is logged once and tried again) and the calls it runs in its own nursery (``calls.py``), among
them the approved invocations the dispatcher sends; start-up recovery runs once, before either,
and records left open are otherwise closed by whoever reads them (no sweep).

Here the database stops while the dispatcher's own call of an approved request is at the
remote: the call cannot record its result.  The daemon lives on and logs one warning naming
the invocation and where to look once the journal is back (it used to log an ERROR "a call
ended without an envelope: JournalUnavailable", naming nothing), never a traceback or the
password; its dispatcher sweeps the absent journal with one warning, never sends that request
again, and dispatches the next approval once the database is back.
"""

from __future__ import annotations

import os
from pathlib import Path

import trio

from affidavit.api.client import Client
from affidavit.engine import unrecorded
from tests.daemon.kit import WAIT, start_daemon, stop, wait_until, write_daemon_config
from tests.http.hostile import HostileServer
from tests.postgres import Cluster

from .awaykit import state_of
from .helpers import http_target
from .test_journal_away_mid_call import ACTION, database_away, journal_table, remote

SWEEPS = 2.5
"""Long enough for the dispatcher (``SWEEP`` = 1 s) to sweep twice while the database is away."""


async def test_a_dispatch_cut_by_the_journal_is_one_warning_and_the_daemon_goes_on(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str
) -> None:
    async with HostileServer.running(remote("result_store")) as srv:
        socket = tmp_path / "affidavit.sock"
        cfg = write_daemon_config(
            tmp_path,
            {"api": http_target(srv.url, approval={"methods": ["POST"]})},
            socket=socket,
            service={"operator_uids": [os.geteuid()], "allow_self_approval": True},
            journal=journal_table(tmp_path, pg_url),
        )
        daemon = await start_daemon(cfg, socket, tmp_path / "daemon.log", token)
        try:
            with trio.fail_after(WAIT * 3):
                async with Client.open(socket) as client:
                    env = await client.call(ACTION)  # its caller gone: the daemon's to send
                    assert env["error"]["code"] == "APPROVAL_PENDING", env
                    first = env["invocation_id"]
                    assert (await client.approve(first, note="ok"))["approval"] == "granted"
                # The dispatcher's call holds the remote; the database stops, the remote answers:
                # the result cannot be stored, nor the record read.
                async with database_away(pg, srv):
                    await wait_until(
                        lambda: f"approvals: dispatching {first}: " in daemon.log_text(),
                        "the dispatch ends",
                    )
                    await trio.sleep(SWEEPS)
                    assert daemon.proc.poll() is None, daemon.log_text()
                    async with Client.open(socket) as client:
                        assert (await client.health())["ok"] is True
                await wait_until(
                    lambda: "approvals: the journal is readable again" in daemon.log_text(),
                    "a sweep reads again",
                )
                assert state_of(pg_url, first) == "dispatched"  # recovery's, once its lease ends
                # The dispatcher goes on: the next approval is sent once the database is back.
                async with Client.open(socket) as client:
                    env = await client.call(ACTION)
                    second = env["invocation_id"]
                    assert (await client.approve(second, note="ok"))["approval"] == "granted"
                await wait_until(lambda: state_of(pg_url, second) == "stored_committed", "sent")
            log = daemon.log_text()
            assert daemon.proc.poll() is None, log
        finally:
            stop(daemon)
    assert "Traceback" not in log, log
    assert pg.password not in log, log
    assert "a call ended without an envelope" not in log, log
    warned = f"WARNING approvals: dispatching {first}: {unrecorded(first)}: "
    assert log.count(warned) == 1, log
    assert log.count("approvals: the journal cannot be read now") == 1, log
    assert len(srv.requests) == 2  # each approved request sent once; the first never again
