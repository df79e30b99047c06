"""A fetch delivers a stored result only to the uid that asked for it (seed: "Mark
RESULT_DELIVERED only after the protocol has confirmed complete transfer" -- to the caller).  A
call the daemon runs records its requester (the socket peer's uid) on ACTION_ACCEPTED; a whole
``fetch_result`` by another uid is only a read: the result stays undelivered, nothing recorded,
and its answer is true for that reader -- the result as stored, ``delivery.recorded: false``,
never RESULT_DELIVERY_FAILED's ``retry: fetch_result`` (fetching again would loop).  The
requester's own fetch delivers it, recorded with the reader's uid; a session names no one.  A
call made in-process asks as this process's uid (recorded as the daemon records its peer's); a
record naming no requester (an older journal's) is delivered to no reader.  Before, any
caller's fetch recorded RESULT_DELIVERED {channel: fetch}: the journal claimed the requester
got a result another agent had read.  Through the daemon's
socket: tests/daemon/test_fetch_by_another.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api import Broker
from affidavit.engine import invocation
from affidavit.views import record_to_json
from tests.http.hostile import HostileServer, Peer, Reply, scripts

from .approvalkit import OPS, approval_config
from .helpers import http_target, open_broker, write_config

REQUESTER = 4242
OTHER = 7777
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


async def _fetch(broker: Broker, iid: str, reader: int | None = None) -> dict[str, Any] | None:
    with trio.fail_after(10):
        return await broker.fetch_result(iid, reader=reader)


async def _settled(broker: Broker) -> None:
    with trio.fail_after(10):
        await broker.settled()


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
            for _ in range(2):  # another uid: a read, and no error sending it to fetch again
                read = await _fetch(broker, iid, reader=REQUESTER + 1)
                assert read is not None and read["result"]["body"] == "done"
                assert "error" not in read and read["delivery"]["recorded"] is False
                assert read["evidence"]["outcome"] == "committed"
            await _settled(broker)
            assert _delivery(broker, iid) == [("RESULT_DELIVERY_FAILED", None)]
            assert broker.record(iid).state == "delivery_failed_committed"  # type: ignore[union-attr]

            own = await _fetch(broker, iid, reader=REQUESTER)
            assert own is not None and own["result"]["body"] == "done" and "delivery" not in own
            await _settled(broker)
            assert _delivery(broker, iid) == [
                ("RESULT_DELIVERY_FAILED", None),
                ("RESULT_DELIVERED", {"uid": REQUESTER}),
            ]


async def test_an_in_process_call_is_delivered_only_to_this_process_s_uid(
    tmp_path: Path, token: str
) -> None:
    """A call made in-process (``affidavit call``, an embedded MCP server, a library) asks as
    this process's uid: its ACTION_ACCEPTED names it, another uid's fetch (a daemon peer on a
    shared journal) is a read, and this process's own fetch (no ``reader``: its uid) delivers
    it.  Before, an in-process call named no requester and uid 7777's fetch recorded
    RESULT_DELIVERED {uid: 7777}."""
    async with HostileServer.running(scripts.serve(Reply(200, body=b"done"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as broker:
            iid = await _undelivered(broker, None)
            accepted = next(e for e in broker.events(iid) if e.kind.value == "ACTION_ACCEPTED")
            assert accepted.attrs["requester"] == {"uid": os.getuid()}
            read = await _fetch(broker, iid, reader=OTHER)
            assert read is not None and read["delivery"]["recorded"] is False
            await _settled(broker)
            assert _delivery(broker, iid) == [("RESULT_DELIVERY_FAILED", None)]
            own = await _fetch(broker, iid)
            assert own is not None and own["result"]["body"] == "done" and "delivery" not in own
            await _settled(broker)
            assert _delivery(broker, iid) == [
                ("RESULT_DELIVERY_FAILED", None),
                ("RESULT_DELIVERED", {"uid": os.getuid()}),
            ]


async def test_a_record_naming_no_requester_is_delivered_to_no_reader(
    tmp_path: Path, token: str
) -> None:
    """A record written before requesters were (an older journal's: made here by starting an
    invocation below ``Engine.call``, which names this process's uid) does not say who asked:
    no fetch can be its requester's, so every fetch -- this process's own included -- is a
    read, and its ``delivery`` says why.  Before, any uid's fetch recorded its delivery."""
    async with HostileServer.running(scripts.serve(Reply(200, body=b"done"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as broker:
            iid = await _unnamed(broker)
            seq = broker.record(iid).last_seq  # type: ignore[union-attr]
            for reader in (OTHER, None, os.getuid()):
                read = await _fetch(broker, iid, reader=reader)
                assert read is not None and read["result"]["body"] == "done"
                # No requester: an answer of it failed, never "the requester's answer".
                assert read["delivery"] == {
                    "recorded": False,
                    "why": "the record names no requester (written before requesters were "
                    "recorded): no read can be shown to be its asker's, so this one is a read, "
                    "recording nothing; the journal does not say the asker received this "
                    f"result; an answer of it failed (RESULT_DELIVERY_FAILED, seq {seq})",
                    "answer_failed_at_seq": seq,
                }
            await _settled(broker)
            assert _delivery(broker, iid) == [("RESULT_DELIVERY_FAILED", None)]


async def _unnamed(broker: Broker, action: dict[str, Any] = ACTION) -> str:
    """An undelivered record naming no requester, as an older journal holds one: started below
    ``Engine.call`` (which names this process's uid), its answer lost."""
    engine = broker._engine
    with trio.fail_after(10):
        envelope = await invocation.start(engine, action, None, _gone)
    engine.recorder.done()
    iid: str = envelope["invocation_id"]
    accepted = next(e for e in broker.events(iid) if e.kind.value == "ACTION_ACCEPTED")
    assert "requester" not in accepted.attrs
    assert _delivery(broker, iid) == [("RESULT_DELIVERY_FAILED", None)]
    return iid


@pytest.mark.parametrize(
    ("status", "state", "code", "retry"),
    [
        (200, "delivery_failed_committed", None, "never"),
        (400, "delivery_failed_rejected", "REMOTE_REJECTED", "after_correction"),
    ],
    ids=["committed", "rejected"],
)
async def test_a_record_naming_no_requester_is_not_sent_to_fetch_for_ever(
    tmp_path: Path, token: str, status: int, state: str, code: str | None, retry: str
) -> None:
    """Its record (``get_record``, ``list_actions``: ``record_to_json``) and a fetch's
    envelope carry its stored result's code and hint -- as another uid's read shows it -- not
    RESULT_DELIVERY_FAILED's ``retry: fetch_result``: no read can be recorded as its delivery,
    so an agent following that hint would fetch, read ``recorded: false`` and be sent to fetch
    again, for ever.  The state still says its delivery failed."""
    async with HostileServer.running(scripts.serve(Reply(status, body=b"x"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as broker:
            iid = await _unnamed(broker)
            record = broker.record(iid)
            assert record is not None and record.requester is None
            view = record_to_json(record)
            assert (view["state"], view["code"], view["retry"]) == (state, code, retry)
            # A regression guard (held before the record's hint was fixed, 4be53cc): a fetch's
            # envelope says what is true for its reader -- the stored result's, no error for a
            # committed one.
            read = await _fetch(broker, iid)
            assert read is not None and read["result"]["body"] == "x"
            if code is None:
                assert "error" not in read
            else:
                assert (read["error"]["code"], read["error"]["retry"]) == (code, retry)


async def test_another_uid_reads_a_rejection_as_the_remote_classified_it(
    tmp_path: Path, token: str
) -> None:
    """A stored rejection read by another uid: the rejection's own code and hint, as the
    record's RESULT_DELIVERY_FAILED rows left aside say it -- not ``retry: fetch_result``."""
    async with HostileServer.running(scripts.serve(Reply(400, body=b"bad"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as broker:
            iid = await _undelivered(broker, REQUESTER)
            assert broker.record(iid).state == "delivery_failed_rejected"  # type: ignore[union-attr]
            read = await _fetch(broker, iid, reader=REQUESTER + 1)
            assert read is not None and read["result"]["body"] == "bad"
            assert read["error"]["outcome"] == "rejected"
            assert read["error"]["code"] != "RESULT_DELIVERY_FAILED"
            assert read["error"]["retry"] != "fetch_result"
            assert read["delivery"]["recorded"] is False
            await _settled(broker)
            assert _delivery(broker, iid) == [("RESULT_DELIVERY_FAILED", None)]


async def test_another_uid_is_shown_the_record_the_journal_holds(
    tmp_path: Path, token: str
) -> None:
    """The read's evidence is the real record -- its state and ``record_seq``, the
    RESULT_DELIVERY_FAILED row's seq included -- never a view folded without that row (which
    would say stored_committed at the seq before it: a state and seq the journal does not hold);
    ``delivery`` names the seq at which the requester's answer failed."""
    async with HostileServer.running(scripts.serve(Reply(200, body=b"done"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as broker:
            iid = await _undelivered(broker, REQUESTER)
            record = broker.record(iid)
            assert record is not None and record.state == "delivery_failed_committed"
            failed = [e for e in broker.events(iid) if e.kind.value == "RESULT_DELIVERY_FAILED"]
            read = await _fetch(broker, iid, reader=REQUESTER + 1)
            assert read is not None and "error" not in read
            assert read["evidence"]["state"] == record.state
            assert read["evidence"]["record_seq"] == record.last_seq == failed[-1].seq
            assert read["delivery"] == {
                "recorded": False,
                "why": "read whole by another uid than the call's requester: a read, recording "
                "nothing; the journal does not say the requester received this result; the "
                f"requester's answer failed (RESULT_DELIVERY_FAILED, seq {failed[-1].seq})",
                "requester_answer_failed_at_seq": failed[-1].seq,
            }


async def test_a_same_key_retry_s_answer_is_its_asker_s_to_fetch(
    tmp_path: Path, token: str
) -> None:
    """The requester is the latest asker's: a same-key retry by another uid records that uid on
    its RETRY_LEASE_ACQUIRED, and its lost answer is that uid's to fetch (recorded with its
    uid); the first asker's fetch is a read.  Before, the requester stayed the first
    ACTION_ACCEPTED's: the retrying uid was told ``recorded: false`` for ever and the first
    asker's fetch recorded the delivery of an attempt it never made."""
    served = []

    async def cut_then_serve(peer: Peer) -> None:
        served.append(peer)
        if len(served) == 1:  # the first attempt: applied, no answer -- outcome unknown
            await scripts.apply_then_close()(peer)
        else:
            await scripts.serve(Reply(200, body=b"done"))(peer)

    keyed = {"header": "Idempotency-Key", "scope": "s", "retention": "24h"}
    action = {**ACTION, "idempotency_key": "k1"}
    async with HostileServer.running(cut_then_serve) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url, idempotency=keyed)})
        async with open_broker(cfg) as broker:
            with trio.fail_after(10):
                first = await broker.call(action, requester=REQUESTER)
                assert first["error"]["outcome"] == "unknown"
                await broker.call(action, deliver=_gone, requester=REQUESTER + 1)
            iid = first["invocation_id"]
            lease = next(e for e in broker.events(iid) if e.kind.value == "RETRY_LEASE_ACQUIRED")
            assert lease.attrs["requester"] == {"uid": REQUESTER + 1}
            assert _delivery(broker, iid) == [("RESULT_DELIVERY_FAILED", None)]

            read = await _fetch(broker, iid, reader=REQUESTER)
            assert read is not None and read["delivery"]["recorded"] is False
            await _settled(broker)
            assert _delivery(broker, iid) == [("RESULT_DELIVERY_FAILED", None)]
            own = await _fetch(broker, iid, reader=REQUESTER + 1)
            assert own is not None and own["result"]["body"] == "done" and "delivery" not in own
            await _settled(broker)
            assert _delivery(broker, iid) == [
                ("RESULT_DELIVERY_FAILED", None),
                ("RESULT_DELIVERED", {"uid": REQUESTER + 1}),
            ]


async def test_an_in_process_same_key_retry_is_this_process_s_to_fetch(
    tmp_path: Path, token: str
) -> None:
    """uid 4242 asks through the daemon (outcome unknown); this process retries the same key
    in-process and its answer is lost: the retry's RETRY_LEASE_ACQUIRED names this process's
    uid, 4242's fetch is a read and this process's delivers it.  Before, the retry's lease
    named no one, the requester stayed 4242's, and 4242's fetch recorded the delivery of an
    attempt it never made."""
    served = []

    async def cut_then_serve(peer: Peer) -> None:
        served.append(peer)
        if len(served) == 1:  # the first attempt: applied, no answer -- outcome unknown
            await scripts.apply_then_close()(peer)
        else:
            await scripts.serve(Reply(200, body=b"done"))(peer)

    keyed = {"header": "Idempotency-Key", "scope": "s", "retention": "24h"}
    action = {**ACTION, "idempotency_key": "k1"}
    async with HostileServer.running(cut_then_serve) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url, idempotency=keyed)})
        async with open_broker(cfg) as broker:
            with trio.fail_after(10):
                first = await broker.call(action, requester=REQUESTER)
                assert first["error"]["outcome"] == "unknown"
                await broker.call(action, deliver=_gone)  # in-process: this process's uid
            iid = first["invocation_id"]
            lease = next(e for e in broker.events(iid) if e.kind.value == "RETRY_LEASE_ACQUIRED")
            assert lease.attrs["requester"] == {"uid": os.getuid()}

            read = await _fetch(broker, iid, reader=REQUESTER)
            assert read is not None and read["delivery"]["recorded"] is False
            await _settled(broker)
            assert _delivery(broker, iid) == [("RESULT_DELIVERY_FAILED", None)]
            own = await _fetch(broker, iid)
            assert own is not None and own["result"]["body"] == "done" and "delivery" not in own
            await _settled(broker)
            assert _delivery(broker, iid) == [
                ("RESULT_DELIVERY_FAILED", None),
                ("RESULT_DELIVERED", {"uid": os.getuid()}),
            ]


async def test_a_joined_waiter_s_dispatch_is_its_to_fetch(tmp_path: Path, token: str) -> None:
    """uid A asks for an action awaiting approval (answered pending); uid B joins it by its
    idempotency key once approved, takes the dispatch lease -- which names B (``claim``'s
    ``requester``) -- and B's answer is lost: B's fetch delivers it (recorded with B's uid), A's
    is a read.  Dropping the requester from the joined wait or its claim leaves A the asker."""
    asker, joiner = REQUESTER + 1, REQUESTER + 2  # neither is the operator (OPS, uid 4242)
    keyed = {"header": "Idempotency-Key", "scope": "s", "retention": "24h"}
    action = {**ACTION, "idempotency_key": "k2"}
    async with HostileServer.running(scripts.serve(Reply(200, body=b"done"))) as srv:
        cfg = approval_config(tmp_path, srv.url, approval={"wait": "0s"}, idempotency=keyed)
        async with open_broker(cfg) as broker:
            with trio.fail_after(10):
                first = await broker.call(action, requester=asker)
                assert first["error"]["code"] == "APPROVAL_PENDING"
                iid = first["invocation_id"]
                await broker.approve(iid, operator=OPS)
                joined = await broker.call(action, deliver=_gone, requester=joiner)
            assert joined["invocation_id"] == iid
            lease = next(e for e in broker.events(iid) if e.kind.value == "DISPATCH_LEASE_ACQUIRED")
            assert lease.attrs["requester"] == {"uid": joiner}
            assert _delivery(broker, iid) == [("RESULT_DELIVERY_FAILED", None)]

            read = await _fetch(broker, iid, reader=asker)
            assert read is not None and read["delivery"]["recorded"] is False
            await _settled(broker)
            assert _delivery(broker, iid) == [("RESULT_DELIVERY_FAILED", None)]
            own = await _fetch(broker, iid, reader=joiner)
            assert own is not None and own["result"]["body"] == "done" and "delivery" not in own
            await _settled(broker)
            assert _delivery(broker, iid) == [
                ("RESULT_DELIVERY_FAILED", None),
                ("RESULT_DELIVERED", {"uid": joiner}),
            ]


@pytest.mark.parametrize("requester", [REQUESTER, None], ids=["daemon-peer", "in-process"])
async def test_a_call_refused_in_validation_names_its_asker(
    tmp_path: Path, token: str, requester: int | None
) -> None:
    """Every ACTION_ACCEPTED a call writes names its asker -- also one refused at once
    (``refuse_new``): an action invalid, and a key bound to another request (a mismatch).
    Only older records name none.  Before, a refused call's ACTION_ACCEPTED named no one."""
    keyed = {"header": "Idempotency-Key", "scope": "s", "retention": "24h"}
    async with HostileServer.running(scripts.serve(Reply(200, body=b"done"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url, idempotency=keyed)})
        async with open_broker(cfg) as broker:
            with trio.fail_after(10):
                bad = await broker.call({**ACTION, "method": 7}, requester=requester)
                await broker.call({**ACTION, "idempotency_key": "k1"}, requester=requester)
                other = {**ACTION, "path": "/other", "idempotency_key": "k1"}
                mismatch = await broker.call(other, requester=requester)
            assert bad["error"]["code"] == "INVALID_FIELD"
            assert mismatch["error"]["code"] == "IDEMPOTENCY_MISMATCH"
            uid = os.getuid() if requester is None else requester
            for refused in (bad, mismatch):
                record = broker.record(refused["invocation_id"])
                assert record is not None and record.requester == uid


async def test_an_asker_naming_no_uid_waits_for_its_grant_as_the_uid_it_asked_as(
    tmp_path: Path, token: str
) -> None:
    """Below ``Engine.call`` (an older caller naming no requester) the approval request names
    this process's uid (``asker``), and the dispatch lease its grant takes names the same uid.
    Before, the wait got the raw None: APPROVAL_REQUESTED said this uid asked, the lease named
    no one."""
    async with HostileServer.running(scripts.serve(Reply(200, body=b"done"))) as srv:
        cfg = approval_config(tmp_path, srv.url, approval={"wait": "10s"})
        async with open_broker(cfg) as broker:
            engine = broker._engine

            async def approve() -> None:
                while True:
                    waiting = broker.journal.list_actions()
                    if waiting and waiting[0].state == "awaiting_approval":
                        await broker.approve(waiting[0].invocation_id, operator=OPS)
                        return
                    await trio.sleep(0.01)

            with trio.fail_after(10):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(approve)
                    envelope = await invocation.start(engine, ACTION, None, None)
            engine.recorder.done()
            iid = envelope["invocation_id"]
            assert envelope["result"]["body"] == "done"
            kinds = {e.kind.value: e.attrs for e in broker.events(iid)}
            assert "requester" not in kinds["ACTION_ACCEPTED"]
            assert kinds["APPROVAL_REQUESTED"]["requester"] == {"uid": os.getuid()}
            assert kinds["DISPATCH_LEASE_ACQUIRED"]["requester"] == {"uid": os.getuid()}
