"""A call that ends without an envelope for a reason not the journal's (a bug) is answered 500
INTERNAL naming its invocation, so that its caller can find it -- the call may have been sent,
and ``fetch_result`` / ``affidavit result`` reads what its record proves.  The answer claims no
outcome of its own.  It used to name only the exception's type: a caller whose call may have
run had nothing to look it up by (an invocation has no idempotency key to find it by).

The daemon runs in this process (``Daemon.run``) so that rendering an envelope can fail on cue;
the caller is on its real socket."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.client import Client
from affidavit.api.wire import ApiError
from affidavit.engine.recorder import Recorder
from tests.broker.helpers import TOKEN_ENV
from tests.http.hostile import HostileServer, Reply, scripts

from .kit import WAIT, action, in_process


class Broken(RuntimeError):
    """Stands for a bug inside the broker, past the journal's writes."""


def _broken(token: str) -> Any:
    """``Recorder.render`` failing, its text quoting remote bytes (never to be shown)."""

    def render(self: Recorder, *args: Any, **kwargs: Any) -> dict[str, Any]:
        raise Broken("remote bytes " + token)

    return render


async def test_a_call_failing_inside_the_broker_names_its_invocation_and_claims_nothing(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)
    async with in_process(tmp_path, scripts.serve(Reply(200, body=b"done"))) as (srv, socket):
        with trio.fail_after(WAIT):
            async with Client.open(socket) as client:
                with monkeypatch.context() as patched:
                    patched.setattr(Recorder, "render", _broken(token))
                    with pytest.raises(ApiError) as caught:
                        await client.call({"target": "api", "method": "GET", "path": "/r"})
                [row] = (await client.actions())["actions"]
                iid = row["invocation_id"]
                fetched = await client.fetch_result(iid)
    said = str(caught.value)
    assert (caught.value.status, caught.value.code) == (500, "INTERNAL"), said
    assert iid in said and "Broken" in said, said
    assert token not in said and "remote bytes" not in said
    assert not any(w in said for w in ("committed", "not_attempted", "rejected")), said
    assert len(srv.requests) == 1
    assert fetched is not None and fetched["invocation_id"] == iid  # what the record proves


async def test_the_embedded_mcp_server_names_the_invocation_as_the_daemon_does(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedded MCP backend answers the same failure with the same words (one helper,
    ``engine.internal_failure``): it used to be 'the broker failed (Broken)', no invocation."""
    from affidavit.mcp.backends import Embedded, Exchange
    from tests.broker.helpers import http_target, open_broker, write_config

    monkeypatch.setenv(TOKEN_ENV, token)
    async with HostileServer.running(scripts.serve(Reply(200, body=b"done"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as broker:
            with monkeypatch.context() as patched, trio.fail_after(WAIT):
                patched.setattr(Recorder, "render", _broken(token))
                action = {"target": "api", "method": "GET", "path": "/r"}
                answer = await Embedded(broker).call(action, Exchange())
            [record] = broker.journal.list_actions()
    error = answer["api_error"]
    assert error["code"] == "INTERNAL", answer
    assert record.invocation_id in error["message"] and "Broken" in error["message"], answer
    assert token not in str(answer)
    assert len(srv.requests) == 1


async def _failing(*args: Any, **kwargs: Any) -> Any:
    """A step of the engine failing on cue (a bug), its text quoting remote bytes."""
    raise Broken("remote bytes")


async def test_a_failure_after_dispatch_closes_the_record_at_once_with_its_cause(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Storing the result failing after a 200 (a bug): the record is closed at once, unknown,
    with what happened -- it used to stay IN_PROGRESS until its lease ran out (the target's
    total timeout + 30 s), then be closed 'The broker stopped after dispatch' by recovery,
    although the broker never stopped.  The log line names the invocation."""
    import affidavit.engine.delivery as delivery

    monkeypatch.setenv(TOKEN_ENV, token)
    async with in_process(tmp_path, scripts.serve(Reply(200, body=b"done"))) as (srv, socket):
        with trio.fail_after(WAIT):
            async with Client.open(socket) as client:
                with monkeypatch.context() as patched:
                    patched.setattr(delivery, "_commit", _failing)
                    with pytest.raises(ApiError) as caught:
                        await client.call({"target": "api", "method": "POST", "path": "/r"})
                [row] = (await client.actions())["actions"]
                iid = row["invocation_id"]
                fetched = await client.fetch_result(iid)
                events = await client.events(iid)
    assert caught.value.code == "INTERNAL" and iid in str(caught.value)
    assert fetched is not None
    error = fetched["error"]
    assert (error["code"], error["outcome"], error["retry"]) == (
        "REMOTE_OUTCOME_UNKNOWN",
        "unknown",
        "reconcile",
    ), fetched
    assert "failure inside the broker" in error["message"] and "stopped" not in error["message"]
    assert events[-1]["kind"] == "ATTEMPT_INTERRUPTED", events
    assert len(srv.requests) == 1
    [line] = [r.getMessage() for r in caplog.records if "without an envelope" in r.getMessage()]
    assert iid in line and "Broken" in line and "remote bytes" not in line, line


async def test_a_failure_before_dispatch_closes_the_record_not_attempted(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Embedded (an agent's MCP session): the attempt failing before its dispatch gate (a
    bug) is closed at once, nothing sent, SETUP_FAILED at stage ``internal``; the answer points
    the agent at its own ``fetch_result`` tool, not at a CLI it does not have."""
    import affidavit.engine.invocation as invocation
    from affidavit.mcp.backends import Embedded, Exchange
    from tests.broker.helpers import http_target, open_broker, write_config

    monkeypatch.setenv(TOKEN_ENV, token)
    async with HostileServer.running(scripts.serve(Reply(200, body=b"done"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as broker:
            with monkeypatch.context() as patched, trio.fail_after(WAIT):
                patched.setattr(invocation, "run_tries", _failing)
                action = {"target": "api", "method": "POST", "path": "/r"}
                answer = await Embedded(broker).call(action, Exchange())
            [record] = broker.journal.list_actions()
            events = broker.journal.events(record.invocation_id)
    message = answer["api_error"]["message"]
    assert record.invocation_id in message and "fetch_result" in message, answer
    assert "affidavit result" not in message
    assert (record.final, record.outcome.value) == (True, "not_attempted"), record
    assert events[-1].kind.value == "SETUP_FAILED" and events[-1].attrs["stage"] == "internal"
    assert "failure inside the broker" in events[-1].attrs["message"]
    assert srv.requests == []


@pytest.mark.parametrize("what", ["poll", "query"])
async def test_a_poll_or_a_query_failing_inside_the_broker_names_its_invocation(
    tmp_path: Path,
    token: str,
    what: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A job's poll or a reconciliation query (a linked invocation its request's handler runs)
    failing inside the broker is answered as a call is: 500 INTERNAL naming the linked
    invocation (closed at once), one log line with the type only.  It used to reach the HTTP
    server's catch-all: a whole traceback in the daemon's log, 'the daemon failed', no id."""
    import affidavit.engine.delivery as delivery

    from .test_max_calls import OVERRIDES, remote

    monkeypatch.setenv(TOKEN_ENV, token)
    async with in_process(tmp_path, remote, overrides=OVERRIDES) as (_, socket):
        with trio.fail_after(WAIT):
            async with Client.open(socket) as client:
                op_id = (await client.call(action("/v1/jobs", "POST")))["operation"]["id"]
                dropped = action("/v1/drop", "POST", body="{}", idempotency_key="K1")
                iid = (await client.call(dropped))["invocation_id"]
                with monkeypatch.context() as patched, pytest.raises(ApiError) as caught:
                    patched.setattr(delivery, "_commit", _failing)
                    if what == "poll":
                        await client.poll_operation(op_id)
                    else:
                        await client.reconcile(iid, query=True)
                rows = (await client.actions())["actions"]
    linked = rows[-1]["invocation_id"]  # the poll's or the query's own invocation
    assert len(rows) == 3 and linked != iid, rows
    said = str(caught.value)
    assert (caught.value.status, caught.value.code) == (500, "INTERNAL"), said
    assert linked in said and "Broken" in said and "remote bytes" not in said, said
    assert not any(r.exc_info for r in caplog.records), "a traceback was logged"
    [line] = [r.getMessage() for r in caplog.records if "ended without an answer" in r.getMessage()]
    assert linked in line and "Broken" in line, line


async def test_the_embedded_mcp_server_answers_a_failed_query_as_the_daemon_does(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``reconcile_query`` embedded: INTERNAL naming the query's own invocation and the agent's
    ``fetch_result`` -- it used to be the MCP server's 'the broker failed (Broken)', no id."""
    import affidavit.engine.delivery as delivery
    from affidavit.mcp.backends import Embedded
    from tests.broker.helpers import http_target, open_broker, write_config
    from tests.http.hostile import HostileServer

    from .test_max_calls import OVERRIDES, remote

    monkeypatch.setenv(TOKEN_ENV, token)
    async with HostileServer.running(remote) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url, **OVERRIDES)})
        async with open_broker(cfg) as broker:
            with trio.fail_after(WAIT):
                dropped = action("/v1/drop", "POST", body="{}", idempotency_key="K1")
                iid = (await broker.call(dropped))["invocation_id"]
                with monkeypatch.context() as patched:
                    patched.setattr(delivery, "_commit", _failing)
                    answer = await Embedded(broker).reconcile_query(iid)
            query = broker.journal.list_actions()[-1]
    message = answer["api_error"]["message"]
    assert answer["api_error"]["code"] == "INTERNAL", answer
    assert query.invocation_id != iid and query.invocation_id in message, answer
    assert "fetch_result" in message and "Broken" in message and "remote bytes" not in message
    assert query.final, query  # closed at once


async def test_a_refused_action_failing_inside_the_broker_names_the_invocation_it_recorded(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A validation refusal is recorded (ACTION_ACCEPTED, PREFLIGHT_FAILED) before the call's
    control knows its invocation: rendering it failing, the answer names the invocation the
    call wrote for (``Engine._answered``) -- it used to say 'before the call was accepted'."""
    from affidavit.mcp.backends import Embedded, Exchange
    from tests.broker.helpers import http_target, open_broker, write_config

    monkeypatch.setenv(TOKEN_ENV, token)
    cfg = write_config(tmp_path, {"api": http_target("http://127.0.0.1:9")})
    async with open_broker(cfg) as broker:
        with monkeypatch.context() as patched, trio.fail_after(WAIT):
            patched.setattr(Recorder, "render", _broken(token))
            answer = await Embedded(broker).call({"target": "nope"}, Exchange())
        [record] = broker.journal.list_actions()
    message = answer["api_error"]["message"]
    assert record.invocation_id in message and "accepted" not in message, answer
    assert record.state == "validation_failed", record


@pytest.mark.parametrize("hung", ["close", "settle"])
async def test_a_close_the_journal_does_not_answer_does_not_hold_the_call(
    tmp_path: Path,
    token: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    hung: str,
) -> None:
    """The close of a call failing inside the broker (``internal_close``) is shielded from its
    caller, and was unbounded: a journal write hanging there held the call's answer (and a
    stopping daemon's wait for its calls) for as long as it hung.  It is waited for
    ``INTERNAL_CLOSE_WAIT`` at most: the caller is answered 500 INTERNAL while the write still
    hangs, the close given up is logged, and the record, its close never written (the disk
    fails it in the end), is closed by the next start's recovery with what the journal proves:
    dispatched, so unknown -- the broker stopped.  The hang is the real writer's: its
    transaction held open in the writer thread -- on the close itself (``close``: the call's
    queued events landed first), or on the call's queued events, which the close waits for
    first (``settle``: ``Recorder.settle(cancellable=True)``).  Only the answer is claimed:
    the daemon's stop, closing its journal, still waits for the write in flight (released
    here once the call is answered)."""
    import sqlite3
    import threading

    import affidavit.engine.delivery as delivery
    import affidavit.engine.recovery as recovery
    from affidavit.engine.engine import Engine
    from affidavit.journal import Batch

    monkeypatch.setenv(TOKEN_ENV, token)
    monkeypatch.setattr(recovery, "INTERNAL_CLOSE_WAIT", 1.0)
    entered, release, returned = threading.Event(), threading.Event(), threading.Event()

    def hang(batch: Batch) -> None:
        entered.set()
        # Bounded: a test that fails still ends (the hang then fails the batch, as a disk would).
        release.wait(WAIT * 3)
        returned.set()
        raise sqlite3.OperationalError("disk I/O error")

    async def failing(engine: Engine, *args: Any) -> Any:
        if hung == "close":
            await engine.recorder.settle()  # the attempt's queued events land; then it hangs
            engine.journal.before_commit = hang
        else:
            engine.journal.before_commit = hang  # the attempt's queued events hang
            observed = args[-1]
            assert observed  # (the premise: the call has events queued, unsettled)
            await engine.recorder.write_many(observed)
        raise Broken("remote bytes")

    async with in_process(tmp_path, scripts.serve(Reply(200, body=b"done"))) as (srv, socket):
        try:
            with trio.fail_after(WAIT):
                async with Client.open(socket) as client:
                    with monkeypatch.context() as patched:
                        patched.setattr(delivery, "_commit", failing)
                        with pytest.raises(ApiError) as caught:
                            await client.call({"target": "api", "method": "POST", "path": "/r"})
            # Answered while the write hung: the close was given up, not taken.
            assert entered.is_set() and not returned.is_set()
        finally:
            release.set()  # the journal answers at last: the batch failed, nothing of it written
    assert (caught.value.status, caught.value.code) == (500, "INTERNAL"), caught.value
    iid = str(caught.value).split("(Broken; ", 1)[1].split(":", 1)[0]
    assert iid.startswith("act_"), caught.value
    # The close given up is said, naming the invocation: its record stays open until recovery.
    gave_up = [r for r in caplog.records if r.levelname == "WARNING" and iid in r.getMessage()]
    assert gave_up and "not answered" in gave_up[0].getMessage(), caplog.records
    async with in_process(tmp_path, scripts.serve(Reply(200, body=b"done"))) as (_, socket):
        with trio.fail_after(WAIT):
            async with Client.open(socket) as client:
                fetched = await client.fetch_result(iid)
                events = await client.events(iid)
    assert fetched is not None
    error = fetched["error"]
    assert (error["code"], error["outcome"], error["retry"]) == (
        "REMOTE_OUTCOME_UNKNOWN",
        "unknown",
        "reconcile",
    ), fetched
    assert error["message"].startswith("The broker stopped after dispatch"), error
    assert events[-1]["kind"] == "ATTEMPT_INTERRUPTED", events
    assert len(srv.requests) == 1
