"""``affidavit reconcile`` (``--query`` and ``--attest``) and the daemon's ``POST
/v1/invocations/{id}/reconcile`` on a shared journal whose database is away: 503
JOURNAL_UNAVAILABLE through the daemon (it used to be a bare 500 with a traceback in the
daemon's log), exit 2 embedded, naming the record that could not be read; nothing recorded,
never a password.  ``act_failure``, which answers decisions and reconciliations: a query's own
call not recorded keeps its words, a write that failed says the act may not be recorded and
where to look, a read is ``read_failure``'s.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.api.client import Client
from affidavit.api.wire import ApiError
from affidavit.config import load_config
from affidavit.engine import CallNotRecorded, read_failure, unread, unrecorded
from affidavit.engine.recovery import act_failure
from affidavit.journal import CommitUnknown, JournalError, JournalUnavailable, JournalWriteError
from affidavit.reconcile import service
from tests.daemon.kit import WAIT, client_env, run, start_daemon, stop, write_daemon_config
from tests.http.hostile import HostileServer, Reply, scripts
from tests.postgres import Cluster

from .approvalkit import reconcile_target
from .awaykit import clean, database_stopped, event_count
from .helpers import TOKEN_ENV
from .test_journal_away_mid_call import ACTION, journal_table

PYTHON_M = [sys.executable, "-m", "affidavit"]
LIMIT = 20
KEY = {**ACTION, "idempotency_key": "k-1"}


async def _stored(tmp: Path, url: str, pg_url: str) -> tuple[Path, str]:
    cfg = write_daemon_config(
        tmp,
        reconcile_target(url),
        socket=tmp / "affidavit.sock",
        service={"operator_uids": [os.geteuid()]},
        journal=journal_table(tmp, pg_url),
    )
    async with Broker.open(config=load_config(cfg)) as broker:
        env = await broker.call(KEY)
    assert "result" in env, env
    return cfg, str(env["invocation_id"])


async def test_reconcile_embedded_exits_2_naming_the_record(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(201, body=b"{}"))) as srv:
        cfg, iid = await _stored(tmp_path, srv.url, pg_url)
        before = event_count(pg_url, iid)
        env = {**client_env(), TOKEN_ENV: token}
        with trio.fail_after(LIMIT * 3):
            async with database_stopped(pg):
                for how in (["--query"], ["--attest", "committed", "--note", "checked"]):
                    done = await run(
                        [*PYTHON_M, "reconcile", iid, *how, "--config", str(cfg)], env=env
                    )
                    err = done.stderr.decode()
                    assert done.returncode == 2, (how, done)
                    assert done.stdout == b"", done.stdout
                    away = unread(f"the record of {iid}")
                    assert err.startswith(f"affidavit: JOURNAL_UNAVAILABLE: {away} -- "), err
                    assert err.count("\n") == 1, err
                    clean(err, pg.password)
        assert event_count(pg_url, iid) == before
    assert len(srv.requests) == 1  # the call; no query was sent


async def test_the_daemons_reconcile_route_answers_503_never_a_500(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(201, body=b"{}"))) as srv:
        cfg, iid = await _stored(tmp_path, srv.url, pg_url)
        before = event_count(pg_url, iid)
        daemon = await start_daemon(cfg, tmp_path / "affidavit.sock", tmp_path / "d.log", token)
        try:
            with trio.fail_after(WAIT * 2):
                async with database_stopped(pg), Client.open(daemon.socket) as client:
                    refused = []
                    for kwargs in ({"query": True}, {"attest": "committed", "note": "checked"}):
                        with pytest.raises(ApiError) as info:
                            await client.reconcile(iid, **kwargs)  # type: ignore[arg-type]
                        refused.append(info.value)
                    assert (await client.health())["ok"] is True
        finally:
            stop(daemon)
        for exc in refused:
            assert (exc.status, exc.code) == (503, "JOURNAL_UNAVAILABLE"), exc
            assert exc.message == unread(f"the record of {iid}"), exc.message
            clean(exc.message, pg.password)
        clean(daemon.log_text(), pg.password)
        assert event_count(pg_url, iid) == before
    assert len(srv.requests) == 1


def test_act_failure_never_blurs_a_write_a_call_and_a_read() -> None:
    iid, query = "act_1", "act_2"
    assert service.failure(CallNotRecorded(query), iid) == (
        503,
        "JOURNAL_UNAVAILABLE",
        unrecorded(query),
    )
    for write in (JournalWriteError("lost"), CommitUnknown("lost while committing")):
        assert service.failure(write, iid) == (
            503,
            "JOURNAL_UNAVAILABLE",
            f"the journal could not record the reconciliation of {iid} (`affidavit record "
            f"{iid}` once it is back tells whether it was)",
        )
    for read in (JournalUnavailable("away"), JournalError("altered")):
        assert service.failure(read, iid) == read_failure(read, f"the record of {iid}")
    assert act_failure(JournalError("altered"), "x", "y", "z") == (
        500,
        "JOURNAL_UNREADABLE",
        "altered",
    )
