"""A lease's holder as a caller is shown it: the same tag for every answer under the same holder
of an invocation, another for another holder -- never the recorded ``hostname:pid:hex``.

Two brokers share one journal file (two holders, as two processes are).  Broker A's attempt is
held by the remote until its timeout: meanwhile broker B's same-key call answers IN_PROGRESS
naming A's lease, and A's own answer (unknown, after dispatch) names the same.  B's same-key
retry then runs under its own lease (generation 1): its answer names B, by another tag.  The
tags are the journal's (``JournalReader.holder_tag``) of the recorded holders; no envelope
carries a host name or pid.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import trio

from affidavit.api.broker import Broker
from affidavit.statemachine import EventKind
from tests.http.hostile import HostileServer, Peer, Reply

from .helpers import http_target, open_broker, write_config
from .http_rows import IDEM, LIMIT, POST

ACTION = {**POST, "idempotency_key": "holder-race"}


async def _first_held_then_created(peer: Peer) -> None:
    """The first request is held unanswered (its caller times out: unknown); later ones 201."""
    if await peer.read_request() is None:
        return
    if len(peer.server.requests) == 1:
        peer.server.event("received").set()
        await trio.sleep_forever()
    await peer.respond(Reply(201, body=b'{"payment":"pay_1"}'))


def _holders(broker: Broker, iid: str) -> list[tuple[str, int]]:
    """(recorded holder, generation) of each lease the journal records, in order."""
    kinds = {EventKind.ACTION_ACCEPTED, EventKind.RETRY_LEASE_ACQUIRED}
    return [
        (e.attrs["holder"], e.attrs.get("generation", 0))
        for e in broker.events(iid)
        if e.kind in kinds
    ]


async def test_answers_under_one_lease_share_a_tag_and_another_holders_lease_has_another(
    tmp_path: Path, token: str
) -> None:
    timeout = {"connect": 1, "total": 1.5}
    async with HostileServer.running(_first_held_then_created) as srv:
        target = http_target(srv.url, idempotency=IDEM, timeout=timeout)
        cfg = write_config(tmp_path, {"api": target})
        async with open_broker(cfg) as a, open_broker(cfg) as b:
            with trio.fail_after(LIMIT * 2):
                async with trio.open_nursery() as nursery:
                    first: list[dict] = []

                    async def held() -> None:
                        first.append(await a.call(ACTION))

                    nursery.start_soon(held)
                    await srv.event("received").wait()
                    busy = await b.call(ACTION)
                (unknown,) = first
                retried = await b.call(ACTION)
            iid = busy["invocation_id"]
            assert unknown["invocation_id"] == retried["invocation_id"] == iid
            assert busy["error"]["code"] == "IN_PROGRESS", busy
            assert unknown["error"]["outcome"] == "unknown", unknown
            assert "error" not in retried and retried["evidence"]["generation"] == 1, retried
            (holder_a, gen_a), (holder_b, gen_b) = _holders(a, iid)
            where = f"{socket.gethostname()}:{os.getpid()}:"  # hostname:pid:hex, as recorded
            assert holder_a.startswith(where) and holder_b.startswith(where)
            assert (gen_a, gen_b) == (0, 1) and holder_a != holder_b

            tag_a = a.journal.holder_tag(iid, holder_a)
            tag_b = b.journal.holder_tag(iid, holder_b)
            assert tag_a != tag_b
            assert tag_a == b.journal.holder_tag(iid, holder_a)  # the journal's, not a broker's
            leases = [e["evidence"]["lease"] for e in (busy, unknown, retried)]
            assert [(x["generation"], x["holder"]) for x in leases] == [
                (0, tag_a),  # B's answer while A's attempt runs names A's lease
                (0, tag_a),  # A's own answer: the same lease, the same tag
                (1, tag_b),  # B's retry: another holder's lease, another tag
            ]
            for envelope in (busy, unknown, retried):
                text = json.dumps(envelope)
                assert where not in text and holder_a not in text and holder_b not in text
    assert len(srv.requests) == 2
