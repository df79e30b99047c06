"""A fetch delivers a stored result only to who asked for it (seed: "Mark RESULT_DELIVERED only
after the protocol has confirmed complete transfer" -- to the caller).  A call the daemon runs
records its requester (the socket peer's uid) on ACTION_ACCEPTED; a whole ``fetch_result`` by
another uid -- or, the call having named a session, by the same uid reading for another
session -- is only a read: the result stays undelivered, nothing recorded.  The requester's own
fetch delivers it, recorded with who read it.  A record without a requester (a call made
in-process, an older journal) is delivered by any fetch, as before.  Before, any caller's fetch
recorded RESULT_DELIVERED {channel: fetch}: the journal claimed the requester got a result
another agent had read.  Through the daemon's socket: tests/daemon/test_fetch_by_another.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from affidavit.api import Broker
from affidavit.engine import Asker
from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import http_target, open_broker, write_config

REQUESTER = 4242
ACTION = {"target": "api", "method": "GET", "path": "/thing", "session": "agentA"}


async def _gone(envelope: dict[str, Any]) -> None:
    raise ConnectionError("the caller hung up")


async def _undelivered(broker: Broker, requester: int | None) -> str:
    """A call whose answer could not be written: stored, RESULT_DELIVERY_FAILED."""
    with trio.fail_after(10):
        envelope = await broker.call(ACTION, deliver=_gone, requester=requester)
    iid: str = envelope["invocation_id"]
    assert _delivery(broker, iid) == [("RESULT_DELIVERY_FAILED", None)]
    return iid


def _delivery(broker: Broker, iid: str) -> list[tuple[str, Any]]:
    return [
        (e.kind.value, e.attrs.get("reader"))
        for e in broker.events(iid)
        if e.kind.value.startswith("RESULT_DELIVER")
    ]


async def test_only_the_requester_s_fetch_delivers_its_result(tmp_path: Path, token: str) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"done"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as broker:
            iid = await _undelivered(broker, REQUESTER)
            accepted = next(e for e in broker.events(iid) if e.kind.value == "ACTION_ACCEPTED")
            assert accepted.attrs["requester"] == {"uid": REQUESTER}
            for other in (Asker(REQUESTER + 1), Asker(REQUESTER + 1, "agentA")):
                read = await broker.fetch_result(iid, asker=other)  # another uid: a read
                assert read is not None and read["result"]["body"] == "done"
            read = await broker.fetch_result(iid, asker=Asker(REQUESTER, "agentB"))
            assert read is not None and read["result"]["body"] == "done"  # another session
            await broker.settled()
            assert _delivery(broker, iid) == [("RESULT_DELIVERY_FAILED", None)]
            assert broker.record(iid).state == "delivery_failed_committed"  # type: ignore[union-attr]

            own = await broker.fetch_result(iid, asker=Asker(REQUESTER, "agentA"))
            assert own is not None and own["result"]["body"] == "done"
            await broker.settled()
            assert _delivery(broker, iid) == [
                ("RESULT_DELIVERY_FAILED", None),
                ("RESULT_DELIVERED", {"uid": REQUESTER, "session": "agentA"}),
            ]


async def test_a_record_without_a_requester_is_delivered_by_any_fetch(
    tmp_path: Path, token: str
) -> None:
    """A call made in-process (embedded: this process is its one caller), or recorded before
    requesters were: as before."""
    async with HostileServer.running(scripts.serve(Reply(200, body=b"done"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as broker:
            iid = await _undelivered(broker, None)
            accepted = next(e for e in broker.events(iid) if e.kind.value == "ACTION_ACCEPTED")
            assert "requester" not in accepted.attrs
            await broker.fetch_result(iid, asker=Asker(REQUESTER + 1, "agentB"))
            await broker.settled()
            assert [k for k, _ in _delivery(broker, iid)][-1] == "RESULT_DELIVERED"
