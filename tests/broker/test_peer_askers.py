"""A host that names every asker (``EngineSettings.peer_askers``: the daemon, its socket peer's
uid) never falls back to this process's uid: a call, a whole fetch, an operation's poll or a
reconciliation query naming none is refused ``NoAsker`` before anything is recorded.  Before,
the daemon's routes passing no peer uid went unnoticed -- the engine took the daemon's own uid,
which a test's agent (and any peer of the daemon's user) also has.  The daemon opens its broker
so (tests/daemon/test_peer_askers.py: a route that drops its peer's uid is answered 500
INTERNAL)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api import Broker
from affidavit.cli.tour import demo_config
from affidavit.config import load_config
from affidavit.engine import EngineSettings
from affidavit.engine.asker import NoAsker
from tests.http.hostile import HostileServer, Reply, scripts

from .approvalkit import PaymentsApi, reconcile_target
from .helpers import http_target, write_config
from .test_fetch_stale import _crashed_record
from .test_operations import JOBS, SUBMIT, job_api

ACTION = {"target": "api", "method": "GET", "path": "/thing", "session": "agentA"}
PEER = 4242


def _ids(broker: Broker) -> list[str]:
    return [r.invocation_id for r in broker.journal.list_actions()]


async def _gone(envelope: dict[str, Any]) -> None:
    raise ConnectionError("the caller hung up")


async def test_a_broker_naming_every_asker_refuses_none(tmp_path: Path, token: str) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"done"))) as srv:
        cfg = load_config(write_config(tmp_path, {"api": http_target(srv.url)}))
        settings = EngineSettings(peer_askers=True)
        async with Broker.open(config=cfg, settings=settings) as broker:
            with trio.fail_after(10):
                with pytest.raises(NoAsker):
                    await broker.call(ACTION)
                assert broker.journal.list_actions() == []  # nothing recorded
                envelope = await broker.call(ACTION, deliver=_gone, requester=PEER)
                iid = envelope["invocation_id"]
                with pytest.raises(NoAsker):
                    await broker.fetch_result(iid)
                await broker.settled()
                kinds = [e.kind.value for e in broker.events(iid)]
                assert kinds[-1] == "RESULT_DELIVERY_FAILED"  # the refused fetch recorded none
                page = await broker.fetch_result(iid, from_chunk=0)  # a page reads as no one
                assert page is not None and page["result"]["body"] == "done"
                own = await broker.fetch_result(iid, reader=PEER)
                assert own is not None and "delivery" not in own
                await broker.settled()
                assert broker.events(iid)[-1].attrs["reader"] == {"uid": PEER}


async def test_a_poll_naming_no_asker_is_refused(tmp_path: Path, token: str) -> None:
    async with HostileServer.running(scripts.serve(job_api(["running"]))) as srv:
        cfg = load_config(write_config(tmp_path, {"jobs": http_target(srv.url + "/v1", **JOBS)}))
        settings = EngineSettings(peer_askers=True)
        async with Broker.open(config=cfg, settings=settings) as broker:
            with trio.fail_after(10):
                op_id = (await broker.call(SUBMIT, requester=PEER))["operation"]["id"]
                await broker.settled()
                before = _ids(broker)
                with pytest.raises(NoAsker):
                    await broker.poll_operation(op_id)
                assert _ids(broker) == before  # no poll recorded
                assert len(srv.requests) == 1  # nor sent
                polled = await broker.poll_operation(op_id, requester=PEER)
                assert polled["poll"] is not None  # named: polled
                assert len(srv.requests) == 2


async def test_a_reconciliation_query_naming_no_asker_is_refused(
    tmp_path: Path, token: str
) -> None:
    charge = {
        "target": "api",
        "method": "POST",
        "path": "/v1/charges",
        "body": json.dumps({"drop": True}),
        "idempotency_key": "k1",
    }
    async with HostileServer.running(PaymentsApi().script) as srv:
        cfg = load_config(write_config(tmp_path, reconcile_target(srv.url)))
        settings = EngineSettings(peer_askers=True)
        async with Broker.open(config=cfg, settings=settings) as broker:
            with trio.fail_after(10):
                envelope = await broker.call(charge, requester=PEER)
                assert envelope["error"]["outcome"] == "unknown"
                iid = envelope["invocation_id"]
                await broker.settled()
                before = _ids(broker)
                with pytest.raises(NoAsker):
                    await broker.reconcile(iid, query=True)
                assert _ids(broker) == before  # no query recorded
                assert not [r for r in srv.requests if r.method == "GET"]  # nor sent
                answer = await broker.reconcile(iid, query=True, requester=PEER)
                assert answer["reconciled"] is True  # named: queried


async def test_a_whole_fetch_naming_no_reader_is_refused_before_recovery_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A record whose holder's lease ran out: a whole fetch closes it (recover_stale) -- but
    # one naming no reader is refused first, so nothing is recorded, the close included.
    monkeypatch.setenv("AFFIDAVIT_DEMO_TOKEN", "unused-token")
    path = tmp_path / "affidavit.toml"
    path.write_text(demo_config(tmp_path, 9), encoding="utf-8")
    cfg = load_config(path)
    await _crashed_record(cfg.journal.path, "act_crashed", time.time() - 1.0)
    settings = EngineSettings(peer_askers=True)
    with trio.fail_after(10):
        async with Broker.open(config=cfg, settings=settings) as broker:
            before = [e.kind.value for e in broker.events("act_crashed")]
            assert before[-1] == "DISPATCH_STARTED"
            with pytest.raises(NoAsker):
                await broker.fetch_result("act_crashed")
            assert [e.kind.value for e in broker.events("act_crashed")] == before  # no close
            env = await broker.fetch_result("act_crashed", reader=PEER)  # named: closed
            assert env is not None and env["error"]["code"] == "REMOTE_OUTCOME_UNKNOWN"
            assert len(broker.events("act_crashed")) > len(before)
