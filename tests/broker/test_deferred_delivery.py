"""An in-process ``call`` returns its envelope before its RESULT_DELIVERED commits (issue 15: the
third transaction of a call is not a barrier, and was on the caller's path for nothing), and
every read of the broker still sees that delivery: queued, each read waits for it first
(``Recorder.delivered``) -- in the calling task or another; ``fetch_result`` right after the
call records no second delivery; a delivery write that fails is logged, never raised into a
later call, and the result stays stored (fetchable)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api import Broker
from affidavit.journal import Batch, JournalReader, JournalWriteError
from affidavit.statemachine import Event, EventKind
from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import http_target, open_broker, raw_kinds, write_config
from .http_rows import IDEM, POST

E = EventKind
LIMIT = 10
GET = {"target": "api", "method": "GET", "path": "/thing"}

# Steady-state transaction counts (the gate does not reread a just-written config file).
pytestmark = pytest.mark.usefixtures("settled_config")


def _transactions(broker: Broker) -> list[bool]:
    """Whether each writer transaction from now on is a barrier (``before_commit``)."""
    seen: list[bool] = []

    def counted(batch: Batch) -> None:
        seen.append(batch.barrier)

    broker.journal.before_commit = counted
    return seen


async def _warm_then_count(broker: Broker) -> list[bool]:
    """A first call and its delivery (the path's one-time writes done), then ``_transactions``."""
    await broker.call(GET)
    await broker.settled()
    return _transactions(broker)


def _deliveries(broker: Broker, iid: str) -> list[str]:
    return [e.attrs["channel"] for e in broker.events(iid) if e.kind is E.RESULT_DELIVERED]


async def test_call_returns_before_its_delivery_commits(tmp_path: Path, token: str) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                seen = await _warm_then_count(broker)
                env = await broker.call(GET)
                # Two barrier transactions on the caller's path; the delivery is queued.
                assert seen == [True, True]
                iid = env["invocation_id"]
                assert E.RESULT_DELIVERED.value not in raw_kinds(tmp_path / "journal.db", iid)
                await broker.settled()
            assert seen == [True, True, False]
            assert _deliveries(broker, iid) == ["return"]


async def test_a_channel_delivery_is_queued_after_the_handover_too(
    tmp_path: Path, token: str
) -> None:
    """The daemon's (and MCP's) answer: ``deliver`` writes the envelope to the client, then the
    call returns -- the daemon serves the connection's next request only then (daemon/app.py
    ``call`` waits for the call; h11server.py ``serve`` reads the next head after the handler)
    -- so its RESULT_DELIVERED is queued as the in-process return's is."""
    handed: list[str] = []

    async def deliver(envelope: dict[str, Any]) -> None:
        handed.append(envelope["invocation_id"])

    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                seen = await _warm_then_count(broker)
                env = await broker.call(GET, deliver=deliver)
                assert seen == [True, True]
                iid = env["invocation_id"]
                assert handed == [iid]
                fetched = await broker.fetch_result(iid)  # a read right after: no 2nd delivery
                assert fetched is not None and fetched["result"] == env["result"]
                await broker.settled()
            assert seen == [True, True, False]
            assert _deliveries(broker, iid) == ["deliver"]


Read = Callable[[Broker, str], Awaitable[list[str]]]


async def _fetched(broker: Broker, iid: str) -> list[str]:
    env = await broker.fetch_result(iid)
    assert env is not None and "error" not in env
    return [e.kind.value for e in broker.events(iid)]


async def _viewed(broker: Broker, iid: str) -> list[str]:
    events = await broker.view(lambda j: j.events(iid), trio.CapacityLimiter(1))
    return [e.kind.value for e in events]


async def _recorded(broker: Broker, iid: str) -> list[str]:
    record = await broker._engine.recorder.record(iid)
    return [record.state]


async def _settled(broker: Broker, iid: str) -> list[str]:
    await broker.settled()
    return [e.kind.value for e in broker.events(iid)]


READS: dict[str, tuple[Read, str]] = {
    "fetch_result": (_fetched, E.RESULT_DELIVERED.value),
    "view": (_viewed, E.RESULT_DELIVERED.value),
    "recorder.record": (_recorded, "delivered_committed"),
    "settled": (_settled, E.RESULT_DELIVERED.value),
}


@pytest.mark.parametrize("other_task", [False, True], ids=["same-task", "other-task"])
@pytest.mark.parametrize("kind", sorted(READS))
async def test_every_read_right_after_a_call_sees_its_delivery(
    tmp_path: Path, token: str, kind: str, other_task: bool
) -> None:
    read, last = READS[kind]
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                got: list[list[str]] = []
                if other_task:
                    called = trio.Event()
                    box: dict[str, str] = {}

                    async def reader() -> None:
                        await called.wait()
                        got.append(await read(broker, box["iid"]))

                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(reader)
                        env = await broker.call(GET)
                        box["iid"] = env["invocation_id"]
                        called.set()
                else:
                    env = await broker.call(GET)
                    got.append(await read(broker, env["invocation_id"]))
                iid = env["invocation_id"]
                assert got[0][-1] == last
                await broker.settled()
                # One delivery, the call's own: no read delivered it a second time.
                assert _deliveries(broker, iid) == ["return"]


async def test_close_waits_for_the_queued_delivery(tmp_path: Path, token: str) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                env = await broker.call(GET)
    assert raw_kinds(tmp_path / "journal.db", env["invocation_id"])[-1] == "RESULT_DELIVERED"


class _Refused:
    """A queued write whose transaction failed (what ``Posted`` answers then)."""

    finished = True

    async def wait(self, **_: Any) -> Any:
        raise JournalWriteError("journal: disk I/O error (injected)")


def _on_delivery_post(
    monkeypatch: pytest.MonkeyPatch, broker: Broker, hook: Callable[[Event], Awaitable[Any]]
) -> Callable[[], None]:
    """Run ``hook`` at each RESULT_DELIVERED post; what it returns, when not None, is the post's
    answer (else the real post's).  Returns the undo."""
    journal = broker.journal
    real = journal.post

    async def post(event: Event, **kw: Any) -> Any:
        if event.kind is E.RESULT_DELIVERED and (answer := await hook(event)) is not None:
            return answer
        return await real(event, **kw)

    monkeypatch.setattr(journal, "post", post)
    return lambda: monkeypatch.setattr(journal, "post", real)


async def _refused(_: Event) -> _Refused:
    return _Refused()


async def test_a_failed_delivery_write_is_logged_and_the_result_stays_fetchable(
    tmp_path: Path, token: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as broker:
            undo = _on_delivery_post(monkeypatch, broker, _refused)
            with trio.fail_after(LIMIT), caplog.at_level(logging.WARNING, "affidavit.engine"):
                first = await broker.call(GET)
                assert "result" in first and "error" not in first
                second = await broker.call(GET)  # no exception from the first one's write
                assert "result" in second and "error" not in second
                await broker.settled()
                iid = first["invocation_id"]
                assert broker.events(iid)[-1].kind is E.RESULT_COMMITTED  # stored, undelivered
                undo()
                fetched = await broker.fetch_result(iid)  # the result stays fetchable
                assert fetched is not None and fetched["result"] == first["result"]
                assert _deliveries(broker, iid) == ["fetch"]
    logged = [r.getMessage() for r in caplog.records if "delivery of" in r.getMessage()]
    assert any(iid in m and "JournalWriteError" in m for m in logged), logged
    assert not any(token in r.getMessage() for r in caplog.records)


async def test_calls_and_fetches_record_the_same_events_in_the_same_order(
    tmp_path: Path, token: str
) -> None:
    """The facts a sequence of calls and fetches records, per invocation, with the delivery
    queued: each call's events end with its one RESULT_DELIVERED (``return``), a fetch of a
    delivered result records nothing, a resumed read nothing; the journal verifies."""
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url, idempotency=IDEM)})
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                a = (await broker.call(GET))["invocation_id"]
                await broker.fetch_result(a)
                b = (await broker.call({**POST, "idempotency_key": "k-1"}))["invocation_id"]
                again = await broker.call({**POST, "idempotency_key": "k-1"})
                assert again["invocation_id"] == b and "error" not in again
                await broker.fetch_result(b, from_chunk=0)
                await broker.fetch_result(b)
                c = (await broker.call(GET))["invocation_id"]
                await broker.settled()
            table = {
                iid: [(e.kind.value, e.attrs.get("channel")) for e in broker.events(iid)]
                for iid in (a, b, c)
            }
    for iid, rows in table.items():
        assert rows[0] == ("ACTION_ACCEPTED", None), iid
        assert rows[-2:] == [("RESULT_COMMITTED", None), ("RESULT_DELIVERED", "return")], iid
        assert [k for k, _ in rows].count("RESULT_DELIVERED") == 1, iid
    assert table[a] == table[c]  # the same facts, in the same order, call after call
    with JournalReader.open(tmp_path / "journal.db") as reader:
        assert reader.verify().ok


async def test_a_view_waits_for_a_held_up_delivery_no_longer_than_view_wait(
    tmp_path: Path, token: str
) -> None:
    """The writer held up on the delivery's transaction (a shared journal reconnecting, a slow
    disk): a view does not wait for it past ``view_wait``, nor past its caller's cancellation
    -- it shows what is committed, the result stored and not yet delivered -- and once the
    writer goes on, the delivery lands and the next view shows it."""
    release = threading.Event()
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as broker:
            broker.view_wait = 0.3

            def hold(batch: Batch) -> None:  # in the writer's thread
                if not batch.barrier:
                    release.wait(LIMIT)

            with trio.fail_after(LIMIT):  # a first call: its path's one-time writes done
                await broker.call(GET)
                await broker.settled()
            broker.journal.before_commit = hold  # then only the delivery is no barrier
            try:
                with trio.fail_after(LIMIT):
                    env = await broker.call(GET)
                    iid = env["invocation_id"]
                    started = trio.current_time()
                    seen = await _viewed(broker, iid)
                    assert trio.current_time() - started < 0.3 + 2.0
                    assert seen[-1] == E.RESULT_COMMITTED.value  # committed, not yet delivered
                    with trio.move_on_after(0.1) as gave_up:  # the caller's own bound
                        broker.view_wait = LIMIT
                        await _viewed(broker, iid)
                    assert gave_up.cancelled_caught
            finally:
                release.set()
            with trio.fail_after(LIMIT):
                assert (await _viewed(broker, iid))[-1] == E.RESULT_DELIVERED.value
                assert _deliveries(broker, iid) == ["return"]


async def test_a_fetch_while_the_delivery_waits_for_queue_room_records_no_second_one(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``deliver_later``'s post waits while the writer's queue is full; the caller already has
    its envelope.  A fetch of the same invocation in that wait (another connection) finds the
    delivery registered, waits for it, and records no delivery of its own."""
    room = trio.Event()
    waiting: list[str] = []  # the invocation whose delivery waits for room
    entered = trio.Event()
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as broker:

            async def full_queue(event: Event) -> None:
                waiting.append(event.invocation_id)
                entered.set()
                await room.wait()

            _on_delivery_post(monkeypatch, broker, full_queue)
            fetched: list[dict[str, Any] | None] = []
            with trio.fail_after(LIMIT):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(broker.call, GET)
                    await entered.wait()  # the caller has its envelope; the post waits
                    (iid,) = waiting

                    async def fetch() -> None:
                        fetched.append(await broker.fetch_result(iid))

                    nursery.start_soon(fetch)
                    await trio.sleep(0.2)
                    assert fetched == []  # waiting for the call's delivery
                    room.set()
                await broker.settled()
                assert fetched and fetched[0] is not None and "result" in fetched[0]
                assert _deliveries(broker, iid) == ["return"]
