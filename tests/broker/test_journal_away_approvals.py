"""Approvals on a shared journal whose database is away (beyond ``[journal] reconnect``).

The daemon keeps running: its approvals dispatcher sweeps while the database is away and tries
again (it used to die of it, and the daemon with it) -- one line in its log, no traceback, no
password; a sweep cut short marks nothing ``dispatching``.  Once the database is back the
pending request is approved and sent once.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.api.client import Client
from affidavit.api.wire import ApiError
from affidavit.config import load_config
from affidavit.journal import JournalError, JournalReader
from tests.daemon.kit import WAIT, DaemonProc, start_daemon, stop, wait_until
from tests.http.hostile import HostileServer, Reply, scripts
from tests.postgres import Cluster

from .approvalkit import OPS, OPS_UID
from .awaykit import database_stopped
from .helpers import http_target
from .test_journal_away_mid_call import ACTION, journal_table

PYTHON_M = [sys.executable, "-m", "affidavit"]
LIMIT = 20
"""Seconds any one command or request may take: a refused connection fails at once."""
SWEEPS = 2.5
"""Long enough for the daemon's approvals dispatcher (``SWEEP`` = 1 s) to sweep while away."""


def _config(tmp: Path, url: str, pg_url: str, operators: list[int]) -> Path:
    """Target ``api`` (a POST waits for an operator) journaling to ``pg_url``; ``operators``:
    ``[service] operator_uids`` (this test's uid both asks and decides)."""
    from tests.daemon.kit import write_daemon_config

    return write_daemon_config(
        tmp,
        {"api": http_target(url, approval={"methods": ["POST"]})},
        socket=tmp / "affidavit.sock",
        service={"operator_uids": operators, "allow_self_approval": True},
        journal=journal_table(tmp, pg_url),
    )


async def _requested(cfg: Path) -> str:
    """A call that waits for an operator (its caller gone): its invocation id."""
    async with Broker.open(config=load_config(cfg)) as broker:
        env = await broker.call(ACTION)
    assert env["error"]["code"] == "APPROVAL_PENDING", env
    return str(env["invocation_id"])


def _state(pg_url: str, iid: str) -> str:
    with JournalReader.open(pg_url) as reader:
        rec = reader.record(iid)
    assert rec is not None
    return rec.state


def _clean(text: str, pg: Cluster) -> None:
    assert "Traceback" not in text, text
    assert "Error in ASGI" not in text, text
    assert pg.password not in text, text


# -- the daemon's operator routes ----------------------------------------------------------------


@asynccontextmanager
async def _daemon(tmp: Path, cfg: Path, token: str) -> AsyncIterator[DaemonProc]:
    daemon = await start_daemon(cfg, tmp / "affidavit.sock", tmp / "daemon.log", token)
    try:
        yield daemon
    finally:
        stop(daemon)


async def _refused(ask: Any) -> ApiError:
    with trio.fail_after(LIMIT), pytest.raises(ApiError) as info:
        await ask()
    return info.value


async def test_the_daemon_lives_on_while_its_dispatcher_sweeps_an_absent_journal(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(201, body=b"{}"))) as srv:
        cfg = _config(tmp_path, srv.url, pg_url, [os.geteuid()])
        iid = await _requested(cfg)  # open when the daemon starts: its dispatcher watches it
        async with _daemon(tmp_path, cfg, token) as daemon:
            with trio.fail_after(WAIT * 2):
                async with database_stopped(pg):
                    await trio.sleep(SWEEPS)
                    assert daemon.proc.poll() is None, daemon.log_text()
                    async with Client.open(daemon.socket) as client:
                        assert (await client.health())["ok"] is True
                async with Client.open(daemon.socket) as client:
                    view = await client.approve(iid, note="ok")
                assert view["approval"] == "granted", view
                await wait_until(lambda: _state(pg_url, iid) == "stored_committed", "sent")
            log = daemon.log_text()
            _clean(log, pg)
            assert log.count("approvals: the journal cannot be read now") == 1, log
            assert "approvals: the journal is readable again" in log, log
    assert len(srv.requests) == 1  # sent once, by the daemon, once approved


async def test_a_sweep_cut_short_by_the_journal_leaves_no_approval_marked_dispatching(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``approvals_ready`` marks each approval it returns ``dispatching``; one that raised
    half-way returned none, so it must mark none (else the daemon never dispatches them)."""
    async with HostileServer.running(scripts.serve(Reply(201, body=b"{}"))) as srv:
        cfg = _config(tmp_path, srv.url, pg_url, [OPS_UID])
        first, second = await _requested(cfg), await _requested(cfg)
        async with Broker.open(config=load_config(cfg)) as broker:
            for iid in (first, second):
                await broker.approve(iid, note="ok", operator=OPS)
            broker.watch_approvals()
            journal = broker._engine.journal
            record = journal.record
            reads: list[str] = []

            def stopped_at_the_second(iid: str, *args: Any, **kwargs: Any) -> Any:
                reads.append(iid)
                if len(reads) == 2:
                    pg.stop()
                return record(iid, *args, **kwargs)

            monkeypatch.setattr(journal, "record", stopped_at_the_second)
            try:
                with trio.fail_after(LIMIT), pytest.raises(JournalError):
                    await broker.approvals_ready()
            finally:
                monkeypatch.undo()
                await trio.to_thread.run_sync(pg.start)
            assert reads == sorted([first, second]), reads
            assert broker._engine.approvals.dispatching == set()
            with trio.fail_after(LIMIT):
                assert await broker.approvals_ready() == sorted([first, second])
            for iid in (first, second):
                broker.forget_dispatch(iid)
    assert srv.requests == []
