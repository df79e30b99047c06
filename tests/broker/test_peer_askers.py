"""A host that names every asker (``EngineSettings.peer_askers``: the daemon, its socket peer's
uid) never falls back to this process's uid: a call or a whole fetch naming none is refused
``NoAsker`` before anything is recorded.  Before, the daemon's routes passing no peer uid went
unnoticed -- the engine took the daemon's own uid, which a test's agent (and any peer of the
daemon's user) also has.  The daemon opens its broker so (tests/daemon: removing a route's
``requester=req.peer.uid`` or ``reader=`` there answers 500)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api import Broker
from affidavit.config import load_config
from affidavit.engine import EngineSettings
from affidavit.engine.asker import NoAsker
from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import http_target, write_config

ACTION = {"target": "api", "method": "GET", "path": "/thing", "session": "agentA"}
PEER = 4242


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
