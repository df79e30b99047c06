"""A daemon asked to stop while a view read waits on the database stops within its bound
(``shutdown_grace`` and ``ANSWER_WAIT``), never for as long as the database holds that read:
the view's thread reads on a connection of its own with no statement timeout (``Broker.view``),
so a view waited for uncancellably held the connection's task -- and the whole shutdown --
until the database let the read go.  The record route (``GET /v1/invocations/{id}``) read
on the event loop's reader, whose ``statement_timeout`` (``[journal] reconnect``) bounded it,
before it moved to a view thread.  The stuck read is real: the row-level security gate of
``test_view_read_stuck``, held by this test for the whole shutdown."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.client import Client
from affidavit.config import load_config
from affidavit.daemon.server import ANSWER_WAIT, Daemon
from affidavit.journal import Journal
from tests.broker.helpers import TOKEN_ENV
from tests.http.hostile import HostileServer, Reply, scripts
from tests.postgres import Cluster

from .kit import api_target, write_daemon_config
from .test_view_read_stuck import GET, _held, _keys, _waiting, gated_journal

GRACE = 1.0
BOUND = GRACE + ANSWER_WAIT + 5.0
"""The daemon's own bound on a shutdown, and a margin (a guard, not a measure of speed)."""


async def _get_anything(socket: Path, path: str) -> None:
    """One GET whose answer, if any, does not matter: the daemon may close it unanswered."""
    stream = await trio.open_unix_socket(str(socket))
    async with stream:
        await stream.send_all(
            f"GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".encode()
        )
        try:
            while await stream.receive_some(65536):
                pass
        except trio.BrokenResourceError:
            pass


async def test_a_shutdown_does_not_wait_for_a_view_the_database_holds(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)
    async with Journal.open(pg_url, **_keys(tmp_path, "owner")):
        pass  # the schema, created by its owner
    database, journal = gated_journal(pg, pg_url, tmp_path)
    socket = tmp_path / "affidavit.sock"
    stopped = trio.Event()
    async with (
        HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv,
        trio.open_nursery() as nursery,
    ):
        service: dict[str, Any] = {"shutdown_grace": GRACE}
        config = write_daemon_config(
            tmp_path, api_target(srv.url), socket=socket, journal=journal, service=service
        )
        daemon = Daemon(load_config(config))

        async def run(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
            await daemon.run(task_status=task_status)
            stopped.set()

        await nursery.start(run)
        with trio.fail_after(60):
            async with Client.open(socket) as client:
                gated = str((await client.call(GET))["invocation_id"])
                await client.call(GET)  # (the chain's head is not the gated invocation's)
        pg.sql("INSERT INTO gated VALUES (%s)", database, (gated,))
        with _held(pg_url):
            nursery.start_soon(_get_anything, socket, f"/v1/invocations/{gated}")
            with trio.fail_after(10):
                while not await trio.to_thread.run_sync(_waiting, pg_url):
                    await trio.sleep(0.05)
            daemon.shutdown.set()
            with trio.move_on_after(BOUND):
                await stopped.wait()
            held_through = not stopped.is_set()
        # (the gate let go: a daemon still stopping now finishes, and the test with it)
    assert not held_through, "the daemon's shutdown waited for the view the database held"
