"""``poll_operation`` on a shared journal whose database is away (beyond ``[journal]
reconnect``): the daemon's ``POST /v1/operations/{id}/poll`` answers 503 JOURNAL_UNAVAILABLE
naming the operation that could not be read (it used to be a bare 500 with a traceback in the
daemon's log), MCP an ``api_error`` with the same code and words, embedded or through the daemon
(embedded it used to be ``INTERNAL`` "the broker failed (JournalUnavailable)"), and ``affidavit
operation poll`` exits 2 with them, then the journal's own.  Nothing is queried or recorded,
never a password; the same poll succeeds once the database is back.  ``poll_failure``: a poll's
own call not recorded keeps ``CallNotRecorded``'s words, a write that failed says the poll may not
be recorded and where to look, a read is ``read_failure``'s.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.api.client import Client
from affidavit.api.wire import ApiError
from affidavit.config import load_config
from affidavit.engine import CallNotRecorded, poll_failure, read_failure, unread, unrecorded
from affidavit.journal import (
    CommitUnknown,
    JournalError,
    JournalUnavailable,
    JournalWriteError,
)
from affidavit.statemachine import invocation_of
from tests.daemon.kit import WAIT, client_env, run, write_daemon_config
from tests.external import require_module
from tests.http.hostile import HostileServer, scripts
from tests.postgres import Cluster

from .awaykit import MCP_MODES, clean, daemon_on, database_stopped, event_count
from .helpers import TOKEN_ENV, http_target
from .test_journal_away_mid_call import journal_table
from .test_operations import job_api

PYTHON_M = [sys.executable, "-m", "affidavit"]
OPERATIONS = {"operations": {"status": "json:/state", "succeeded": ["done"], "failed": ["error"]}}
SUBMIT = {"target": "api", "method": "POST", "path": "/jobs", "body": '{"report":"q3"}'}


def _events(pg_url: str, op_id: str) -> int:
    iid = invocation_of(op_id)
    assert iid is not None
    return event_count(pg_url, iid)


def _away(op_id: str) -> str:
    return unread(f"the operation {op_id}")


async def test_the_daemons_poll_route_answers_503_never_a_500(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str
) -> None:
    async with HostileServer.running(scripts.serve(job_api(["done"]))) as srv:
        with trio.fail_after(WAIT * 3):
            async with daemon_on(tmp_path, srv.url + "/v1", pg_url, token, **OPERATIONS) as (
                socket,
                daemon,
            ):
                async with Client.open(socket) as client:
                    op_id = (await client.call(SUBMIT))["operation"]["id"]
                    before = _events(pg_url, op_id)
                    async with database_stopped(pg):
                        with pytest.raises(ApiError) as info:
                            await client.poll_operation(op_id)
                        assert (await client.health())["ok"] is True
                    assert len(srv.requests) == 1  # the submission; no query was sent
                    assert _events(pg_url, op_id) == before  # nothing recorded
                    polled = await client.poll_operation(op_id)  # the same poll, once back
                assert daemon.proc.poll() is None, daemon.log_text()
                log = daemon.log_text()
    exc = info.value
    assert (exc.status, exc.code, exc.message) == (503, "JOURNAL_UNAVAILABLE", _away(op_id)), exc
    assert polled["operation"]["state"] == "succeeded", polled
    clean(log, pg.password)
    assert log.count(_away(op_id)) == 1, log  # its one line


@pytest.mark.parametrize("mode", sorted(MCP_MODES))
async def test_mcp_poll_operation_answers_journal_unavailable_and_the_server_lives_on(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str, mode: str
) -> None:
    require_module("mcp", "dev")
    from tests.mcp.kit import structured

    async with HostileServer.running(scripts.serve(job_api(["done"]))) as srv:
        with trio.fail_after(WAIT * 3):
            async with MCP_MODES[mode](
                tmp_path, srv.url + "/v1", pg_url, token, **OPERATIONS
            ) as mcp:
                submitted = structured(await mcp.call("http_request", dict(SUBMIT)))
                op_id = submitted["operation"]["id"]
                before = _events(pg_url, op_id)
                async with database_stopped(pg):
                    result = await mcp.call("poll_operation", {"operation_id": op_id})
                answer = structured(result)
                assert result.is_error is True, answer
                assert answer == {
                    "api_error": {
                        "code": "JOURNAL_UNAVAILABLE",
                        "message": _away(op_id),
                        # may have been sent, as far as the answer can tell: never a blind
                        # resend, poll again later (the journal proves it was not: below)
                        "outcome": "unknown",
                        "retry": "backoff",
                    }
                }, answer
                clean(str(result.content), pg.password)
                assert len(srv.requests) == 1  # the submission; no query was sent
                assert _events(pg_url, op_id) == before  # nothing recorded
                # The server lives on: the same connection polls once the database is back.
                polled = structured(await mcp.call("poll_operation", {"operation_id": op_id}))
                assert polled["operation"]["state"] == "succeeded", polled
    clean((tmp_path / "mcp.log").read_text(encoding="utf-8", errors="replace"), pg.password)


async def test_operation_poll_embedded_exits_2_naming_the_operation(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str
) -> None:
    async with HostileServer.running(scripts.serve(job_api(["done"]))) as srv:
        cfg = write_daemon_config(
            tmp_path,
            {"api": http_target(srv.url + "/v1", **OPERATIONS)},
            socket=tmp_path / "unused.sock",
            journal=journal_table(tmp_path, pg_url),
        )
        async with Broker.open(config=load_config(cfg)) as broker:
            with trio.fail_after(WAIT):
                op_id = (await broker.call(SUBMIT))["operation"]["id"]
        before = _events(pg_url, op_id)
        env = {**client_env(), TOKEN_ENV: token}
        argv = [*PYTHON_M, "operation", "poll", op_id, "--config", str(cfg)]
        with trio.fail_after(WAIT * 3):
            async with database_stopped(pg):
                done = await run(argv, env=env)
            err = done.stderr.decode()
            assert done.returncode == 2, done
            assert done.stdout == b"", done.stdout
            assert err.startswith(f"affidavit: JOURNAL_UNAVAILABLE: {_away(op_id)} -- "), err
            assert err.count("\n") == 1, err
            clean(err, pg.password)
            assert len(srv.requests) == 1  # the submission; no query was sent
            assert _events(pg_url, op_id) == before
            again = await run(argv, env=env)  # the same poll, once the database is back
        assert again.returncode == 0, again
        assert b'"state": "succeeded"' in again.stdout, again.stdout


def test_poll_failure_never_blurs_a_write_a_call_and_a_read() -> None:
    op_id, query = "op_1", "poll_2"
    assert poll_failure(CallNotRecorded(query), op_id) == (
        503,
        "JOURNAL_UNAVAILABLE",
        unrecorded(query),
    )
    for write in (JournalWriteError("lost"), CommitUnknown("lost while committing")):
        assert poll_failure(write, op_id) == (
            503,
            "JOURNAL_UNAVAILABLE",
            f"the journal could not record the poll of {op_id} (`affidavit operations` once it "
            "is back tells whether it was)",
        )
    for read in (JournalUnavailable("away"), JournalError("altered")):
        assert poll_failure(read, op_id) == read_failure(read, f"the operation {op_id}")
    assert poll_failure(JournalError("altered"), op_id)[:2] == (500, "JOURNAL_UNREADABLE")
