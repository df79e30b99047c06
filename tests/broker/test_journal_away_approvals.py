"""The operator's approval commands and routes on a shared journal whose database is away
(beyond ``[journal] reconnect``): each answers at once with a stable, one-line refusal naming
what could not be read -- JOURNAL_UNAVAILABLE, 503 through the daemon, exit 2 embedded -- and
nothing is decided; never a traceback (in the daemon's log either), never a password.  The
daemon keeps running: its approvals dispatcher sweeps while the database is away and tries
again (it used to die of it, and the daemon with it).  Once the database is back the pending
request is approved and sent once.

A decision whose own write failed (the database lost between the approval's read and the
APPROVAL_GRANTED append) is JOURNAL_UNAVAILABLE saying the decision may not be recorded and
where to look (``service.decision_failure``) -- never "unreadable", never granted.
"""

from __future__ import annotations

import json
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
from affidavit.approvals import service
from affidavit.config import load_config
from affidavit.engine import read_failure, unread
from affidavit.journal import JournalError, JournalReader, JournalUnavailable
from affidavit.statemachine import EventKind
from tests.daemon.kit import (
    WAIT,
    DaemonProc,
    client_env,
    run,
    run_all,
    start_daemon,
    stop,
    wait_until,
)
from tests.http.hostile import HostileServer, Reply, scripts
from tests.postgres import Cluster

from .approvalkit import OPS, OPS_UID
from .awaykit import clean, database_stopped, state_of
from .helpers import TOKEN_ENV, http_target
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


# -- the command line, embedded ----------------------------------------------------------------


async def test_approvals_commands_exit_2_naming_what_and_decide_nothing(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(201, body=b"{}"))) as srv:
        cfg = _config(tmp_path, srv.url, pg_url, [os.geteuid()])
        iid = await _requested(cfg)
        env = {**client_env(), TOKEN_ENV: token}
        commands = [
            (["approvals"], "the pending approvals"),
            (["approvals", "--json"], "the pending approvals"),
            (["approvals", "show", iid], f"the approval of {iid}"),
            (["approvals", "approve", iid, "--note", "ok"], f"the approval of {iid}"),
            (["approvals", "deny", iid], f"the approval of {iid}"),
        ]
        with trio.fail_after(LIMIT * 10):
            async with database_stopped(pg):
                argvs = [[*PYTHON_M, *args, "--config", str(cfg)] for args, _ in commands]
                runs = await run_all(argvs, env=env, within=LIMIT)  # none decides: independent
                for (args, what), done in zip(commands, runs, strict=True):
                    err = done.stderr.decode()
                    assert done.returncode == 2, (args, done)
                    if "--json" in args:  # the refusal itself, as the stderr line says it
                        refused = json.loads(done.stdout)["api_error"]
                        assert err == f"affidavit: JOURNAL_UNAVAILABLE: {refused['message']}\n"
                    else:
                        assert done.stdout == b"", (args, done.stdout)
                    assert err.startswith(f"affidavit: JOURNAL_UNAVAILABLE: {unread(what)} -- "), (
                        args,
                        err,
                    )
                    assert " -- cannot connect to journal postgresql://affidavit:***@" in err
                    assert err.count("\n") == 1, err
                    clean(err, pg.password)
            assert state_of(pg_url, iid) == "awaiting_approval"  # nothing was decided
            done = await run(
                [*PYTHON_M, "approvals", "approve", iid, "--config", str(cfg)], env=env
            )
            assert done.returncode == 0, done.stderr
            assert done.json()["approval"] == "granted", done.stdout
        assert srv.requests == []  # an embedded approval records; the caller or daemon sends


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
                await wait_until(lambda: state_of(pg_url, iid) == "stored_committed", "sent")
            log = daemon.log_text()
            clean(log, pg.password)
            assert log.count("approvals: the journal cannot be read now") == 1, log
            assert "approvals: the journal is readable again" in log, log
    assert len(srv.requests) == 1  # sent once, by the daemon, once approved


async def test_the_daemons_operator_routes_answer_503_and_decide_nothing(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(201, body=b"{}"))) as srv:
        cfg = _config(tmp_path, srv.url, pg_url, [os.geteuid()])
        async with _daemon(tmp_path, cfg, token) as daemon:
            async with Client.open(daemon.socket) as client:
                env = await client.call(ACTION)  # its caller gone: the daemon's to dispatch
            assert env["error"]["code"] == "APPROVAL_PENDING", env
            iid = env["invocation_id"]
            with trio.fail_after(WAIT * 2):
                async with database_stopped(pg), Client.open(daemon.socket) as client:
                    refused = {
                        "the pending approvals": await _refused(client.approvals),
                        f"the approval of {iid}": await _refused(lambda: client.approval(iid)),
                        "approve": await _refused(lambda: client.approve(iid, note="ok")),
                        "deny": await _refused(lambda: client.deny(iid)),
                    }
                for name, exc in refused.items():
                    what = name if name.startswith("the ") else f"the approval of {iid}"
                    assert exc.status == 503, (name, exc)
                    assert exc.code == "JOURNAL_UNAVAILABLE", (name, exc)
                    assert exc.message == unread(what), (name, exc.message)
                    clean(exc.message, pg.password)
                assert state_of(pg_url, iid) == "awaiting_approval"  # nothing was decided
                async with Client.open(daemon.socket) as client:
                    view = await client.deny(iid, note="no")
                assert view["approval"] == "denied", view
            clean(daemon.log_text(), pg.password)
    assert srv.requests == []


# -- a decision whose write failed ---------------------------------------------------------------


async def test_a_decision_whose_write_failed_is_unavailable_never_granted(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with HostileServer.running(scripts.serve(Reply(201, body=b"{}"))) as srv:
        cfg = _config(tmp_path, srv.url, pg_url, [OPS_UID])
        iid = await _requested(cfg)
        async with Broker.open(config=load_config(cfg)) as broker:
            recorder = broker._engine.recorder
            append = recorder.append

            async def stopped_first(*args: Any, **kwargs: Any) -> Any:
                await trio.to_thread.run_sync(pg.stop)  # read the approval, lost before writing
                return await append(*args, **kwargs)

            monkeypatch.setattr(recorder, "append", stopped_first)
            try:
                with trio.fail_after(LIMIT), pytest.raises(JournalError) as info:
                    await broker.approve(iid, note="ok", operator=OPS)
            finally:
                monkeypatch.undo()
                await trio.to_thread.run_sync(pg.start)
        status, code, message = service.decision_failure(info.value, iid)
        assert (status, code) == (503, "JOURNAL_UNAVAILABLE"), (info.value, message)
        assert message == (
            f"the journal could not record the decision on {iid} (`affidavit approvals show "
            f"{iid}` once it is back tells whether it was)"
        )
        clean(message, pg.password)
        with JournalReader.open(pg_url) as reader:
            kinds = [e.kind for e in reader.events(iid)]
        assert EventKind.APPROVAL_GRANTED not in kinds, kinds
    assert srv.requests == []


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
            # The second's read tried again within the reconnect window (``Recorder.read``),
            # then the sweep raised: the first read once, nothing read past the second.
            assert reads[:2] == sorted([first, second]) and set(reads[2:]) <= {reads[1]}, reads
            assert broker._engine.approvals.dispatching == set()
            with trio.fail_after(LIMIT):
                assert await broker.approvals_ready() == sorted([first, second])
            for iid in (first, second):
                broker.forget_dispatch(iid)
    assert srv.requests == []


async def test_an_approvals_sealed_request_unread_for_the_journal_away_is_not_shown_sealed(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The list read, then the database gone before the request's sealed payload: the view
    is unavailable -- never shown with the request "(sealed: not readable here)"."""
    async with HostileServer.running(scripts.serve(Reply(201, body=b"{}"))) as srv:
        cfg = _config(tmp_path, srv.url, pg_url, [OPS_UID])
        await _requested(cfg)
    config = load_config(cfg)
    with JournalReader.open(pg_url, key_file=config.journal.key_file) as reader:
        assert service.pending(reader)[0]["request"]["method"] == "POST"
        payload = reader.payload

        def stopped_first(seq: int) -> Any:
            pg.stop()
            return payload(seq)

        monkeypatch.setattr(reader, "payload", stopped_first)
        try:
            with pytest.raises(JournalUnavailable) as info:
                service.pending(reader)
        finally:
            monkeypatch.undo()
            await trio.to_thread.run_sync(pg.start)
    status, code, message = read_failure(info.value, "the pending approvals")
    assert (status, code) == (503, "JOURNAL_UNAVAILABLE"), info.value
    assert message == unread("the pending approvals")
