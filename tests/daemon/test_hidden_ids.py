"""An invocation a caller may not read -- on a target the daemon's configuration no longer names
(or another broker's, on a shared journal) -- is neither readable nor probeable by any route
that takes its id (tests/daemon/test_fetch_by_target.py: the record and the result).  Settling
it and following its job are such routes too: ``POST /v1/invocations/{id}/reconcile
{"query": true}`` and ``POST /v1/operations/{id}/poll`` answer it word for word as an id that
names nothing (404 NO_SUCH_INVOCATION; 422 OPERATION_ERROR at ``operation_id``) -- never its
outcome (NOT_UNKNOWN, STILL_RUNNING), its target gone (NO_QUERY) or an ended job whole -- and
nothing is written for it nor sent.  An operator still settles it: an attestation reads every
record, as the console and the embedded command line do."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.statemachine import invocation_of
from tests.broker.helpers import TOKEN_ENV, http_target, open_broker
from tests.http.hostile import HostileServer, Received, Reply, scripts

from .kit import HUNG, api_target, ask, embedded, start_daemon, stop, write_daemon_config

OPERATIONS = {"status": "json:/state", "succeeded": ["done"], "failed": ["failed"]}
BODY = b"the removed target's stored answer"


def jobs(req: Received) -> Reply:
    """``POST /jobs`` submits a job (202 naming its status resource); its status is done."""
    if req.method == "POST":
        return Reply(202, headers=[("Location", "/jobs/j1")], body=b'{"id":"j1"}')
    if req.target.startswith("/jobs/"):
        return Reply(200, body=json.dumps({"state": "done"}).encode())
    return Reply(200, body=BODY)


def unknown_like(some_id: str) -> str:
    """An id of the same form that names nothing."""
    return some_id[:-4] + ("ZZZZ" if not some_id.endswith("ZZZZ") else "YYYY")


async def made_on_removed_targets(cfg: Path) -> dict[str, str]:
    """On ``old``: a committed call, a job polled to its end and one still pending; on
    ``gone`` (whose remote closes without answering): an unknown call -- their ids by name."""
    ids: dict[str, str] = {}
    async with open_broker(cfg) as broker:
        with trio.fail_after(HUNG):
            done = await broker.call({"target": "old", "method": "GET", "path": "/thing"})
            ids["committed"] = done["invocation_id"]
            for name in ("ended", "pending"):
                env = await broker.call({"target": "old", "method": "POST", "path": "/jobs"})
                ids[name] = env["operation"]["id"]
            polled = await broker.poll_operation(ids["ended"])
            lost = await broker.call({"target": "gone", "method": "POST", "path": "/x"})
    assert polled["operation"]["state"] == "succeeded", polled
    assert lost["error"]["outcome"] == "unknown", lost
    ids["unknown"] = lost["invocation_id"]
    return ids


def on_record(some_id: str) -> str:
    """The invocation whose record holds ``some_id``'s events: a job's submission (``op_X``:
    ``act_X``), else the id itself."""
    return invocation_of(some_id) or some_id


def as_if(answer: tuple[int, Any], made_up: str, real: str) -> tuple[int, Any]:
    """``answer`` (to the ``made_up`` id) as it reads for ``real``: the id echoed swapped."""
    status, body = answer
    return status, json.loads(json.dumps(body).replace(made_up, real))


async def test_a_hidden_invocation_is_reconciled_and_polled_as_an_unknown_id(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)  # the embedded calls' credential
    async with (
        HostileServer.running(scripts.serve(jobs)) as srv,
        HostileServer.running(scripts.apply_then_close()) as dropper,
    ):
        socket = tmp_path / "affidavit.sock"
        every = {
            **api_target(srv.url),
            "old": http_target(srv.url, operations=OPERATIONS),
            "gone": http_target(dropper.url),
        }
        ids = await made_on_removed_targets(write_daemon_config(tmp_path, every, socket=socket))
        async with open_broker(write_daemon_config(tmp_path, every, socket=socket)) as broker:
            # A job's polls are on its submission's record: counted there.
            before = {n: len(broker.events(on_record(i))) for n, i in ids.items()}
        sent = len(srv.requests), len(dropper.requests)
        # Both removed.  This test's uid is an operator: the socket is a caller's even so.
        operators = {"operator_uids": [os.getuid()]}
        cfg = write_daemon_config(tmp_path, api_target(srv.url), socket=socket, service=operators)
        daemon = await start_daemon(cfg, socket, tmp_path / "daemon.log", token)
        answers: dict[str, tuple[int, Any]] = {}
        try:
            with trio.fail_after(HUNG):
                query = json.dumps({"query": True}).encode()
                for name in ("committed", "unknown", "made-up invocation"):
                    iid = ids.get(name) or unknown_like(ids["committed"])
                    path = f"/v1/invocations/{iid}/reconcile"
                    status, _h, body = await ask(socket, "POST", path, query)
                    answers[name] = (status, json.loads(body))
                for name in ("ended", "pending", "made-up operation"):
                    op = ids.get(name) or unknown_like(ids["ended"])
                    status, _h, body = await ask(socket, "POST", f"/v1/operations/{op}/poll")
                    answers[name] = (status, json.loads(body))
                # The operator settles it still: an attestation reads every record.
                path = f"/v1/invocations/{ids['unknown']}/reconcile"
                attest = {"attest": "committed", "note": "checked on the remote"}
                status, _h, body = await ask(socket, "POST", path, json.dumps(attest).encode())
                attested = (status, json.loads(body))
        finally:
            stop(daemon)
        assert (len(srv.requests), len(dropper.requests)) == sent  # nothing sent for them
    made_up = answers["made-up invocation"]
    assert made_up[0] == 404, made_up
    assert made_up[1]["api_error"]["code"] == "NO_SUCH_INVOCATION", made_up
    for name in ("committed", "unknown"):
        shown = as_if(made_up, unknown_like(ids["committed"]), ids[name])
        assert answers[name] == shown, answers
    made_up = answers["made-up operation"]
    assert (made_up[0], made_up[1]["api_error"]["field"]) == (422, "operation_id"), made_up
    for name in ("ended", "pending"):
        assert answers[name] == as_if(made_up, unknown_like(ids["ended"]), ids[name]), answers
    assert BODY.decode() not in json.dumps(answers) and "j1" not in json.dumps(answers)
    # Nothing written for them either (a stale lease is closed by no caller's probe) but the
    # operator's attestation.
    async with open_broker(cfg) as broker:
        after = {n: len(broker.events(on_record(ids[n]))) for n in before}
    assert after == {**before, "unknown": before["unknown"] + 1}
    assert attested[0] == 200, attested
    assert attested[1]["reconciled"] is True, attested
    assert "operator_attested" in json.dumps(attested[1]["envelope"]), attested
    # The operator's own command line, run embedded, names them still: the ended job whole, and
    # the record's state (settled, by the attestation above) -- an operator's channel.
    polled = await embedded("operation", "poll", ids["ended"], "--config", str(cfg), token=token)
    assert polled.returncode == 0, polled.stderr
    assert json.loads(polled.stdout)["operation"]["state"] == "succeeded"
    argv = ("reconcile", ids["unknown"], "--query", "--config", str(cfg))
    queried = await embedded(*argv, token=token)
    assert queried.returncode == 2 and b"NOT_UNKNOWN" in queried.stderr, queried.stderr


async def test_the_record_of_a_hidden_invocation_reads_its_rows_as_an_unknown_id_s(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GET /v1/invocations/{id} checks the target before reading the events for the view: a
    # hidden record's rows are read once (to fold it), as a made-up id's (none) -- not a second
    # time, each row read again a longer answer, a read again a chance of 503 where an unknown
    # id answers 404.  (The fold itself reads them: a row altered so that it no longer folds
    # still answers 500 JOURNAL_UNREADABLE -- whose target it named is unknowable then.)
    from affidavit.journal import JournalReader

    from .kit import in_process

    monkeypatch.setenv(TOKEN_ENV, token)  # the embedded calls' credential
    async with HostileServer.running(scripts.serve(jobs)) as srv:
        every = {**api_target(srv.url), "old": http_target(srv.url)}
        cfg = write_daemon_config(tmp_path, every, socket=tmp_path / "affidavit.sock")
        ids = await committed_on_old(cfg)
    read: list[str] = []
    events = JournalReader.events

    def counted(self: JournalReader, invocation_id: str) -> Any:
        read.append(invocation_id)
        return events(self, invocation_id)

    monkeypatch.setattr(JournalReader, "events", counted)
    made_up = unknown_like(ids)
    answers = {}
    async with in_process(tmp_path, scripts.serve(jobs)) as (_srv, socket):  # "old" removed
        with trio.fail_after(HUNG):
            for iid in (ids, made_up):
                status, _h, body = await ask(socket, "GET", f"/v1/invocations/{iid}")
                answers[iid] = (status, json.loads(body))
    assert answers[made_up][0] == 404, answers
    assert answers[ids] == as_if(answers[made_up], made_up, ids), answers
    assert (read.count(ids), read.count(made_up)) == (1, 1), read


async def committed_on_old(cfg: Path) -> str:
    """One committed call on ``old``: its invocation id."""
    async with open_broker(cfg) as broker:
        with trio.fail_after(HUNG):
            done = await broker.call({"target": "old", "method": "GET", "path": "/thing"})
    assert done.get("error") is None, done
    return str(done["invocation_id"])
