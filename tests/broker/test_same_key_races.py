"""Same-key races end cleanly (issue 9, item 5).

Seed, "Idempotency is defined by the remote contract": "Two workers may read the same unknown
record and decide to retry the request with the same key ... the broker still needs to take a
lease on the invocation, record the retry generation, and allow only one active attempt."

Every concurrent caller of one idempotency key gets an envelope for that invocation (the winner's
result, or IN_PROGRESS / fetch_result); nothing a loser does is written into the winner's record;
exactly one dispatch.  Brokers here are separate ``Broker.open``s of one journal file -- separate
writers, as separate processes are (test_same_key_processes.py runs real ones).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.engine import EngineSettings
from affidavit.journal import Batch
from affidavit.statemachine import EventKind
from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import assert_error, assert_ok, event_kinds, http_target, open_broker, write_config
from .http_rows import IDEM, LIMIT, POST

E = EventKind
WORKERS = 4


async def _race(cfg: Path, action: dict[str, Any], n: int) -> list[dict[str, Any]]:
    envelopes: list[dict[str, Any]] = []
    async with contextlib.AsyncExitStack() as stack:
        brokers = [await stack.enter_async_context(open_broker(cfg)) for _ in range(n)]
        ready = trio.Event()

        async def one(broker: Broker) -> None:
            await ready.wait()
            envelopes.append(await broker.call(action))

        async with trio.open_nursery() as nursery:
            for broker in brokers:
                nursery.start_soon(one, broker)
            await trio.sleep(0.05)
            ready.set()
    return envelopes


async def test_concurrent_callers_of_one_key_share_one_invocation_and_one_dispatch(
    tmp_path: Path, token: str
) -> None:
    slow = Reply(201, body=b'{"payment":"pay_1"}', delay=0.3)
    async with HostileServer.running(scripts.serve(slow)) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url, idempotency=IDEM)})
        for round_ in range(5):
            action = {**POST, "idempotency_key": f"race-{round_}"}
            with trio.fail_after(LIMIT * 2):
                envelopes = await _race(cfg, action, WORKERS)
            ids = {env["invocation_id"] for env in envelopes}
            assert len(ids) == 1, envelopes
            for env in envelopes:
                err = env.get("error")
                # The winner's result, or: in progress, fetch it (never "send it again").
                assert err is None or (err["code"], err["retry"]) == (
                    "IN_PROGRESS",
                    "fetch_result",
                ), env
            async with open_broker(cfg) as broker:
                (iid,) = ids
                kinds = event_kinds(broker, iid)
                # One invocation's events, written by one worker: no stray loser events.
                assert kinds.count(E.ACTION_ACCEPTED) == 1
                assert kinds.count(E.DISPATCH_STARTED) == 1
                assert E.LEASE_LOST not in kinds
                assert kinds.count(E.PROTOCOL_OBSERVED) == 1
                assert_ok(broker, await broker.fetch_result(iid) or {})
        assert len(srv.requests) == 5  # one dispatch per key
        assert srv.connections >= 1


TAKE_LEASE = (
    "import sys, trio\n"
    "from affidavit.journal import Journal\n"
    "async def main():\n"
    "    async with Journal.open(sys.argv[1]) as j:\n"
    "        await j.acquire_lease(sys.argv[2], 'other-worker', 60.0)\n"
    "trio.run(main)\n"
)


async def test_a_retry_refused_because_another_holder_has_the_lease_is_in_progress(
    tmp_path: Path, token: str
) -> None:
    """Two workers read the same unknown record and both decide to retry: the second to ask
    for the lease finds the other's, live on an open attempt -- IN_PROGRESS / fetch_result,
    not the old record's same_idempotency_key, and nothing sent.  The other worker (a process
    of its own) takes its lease just before this call's lease transaction begins."""
    async with HostileServer.running(scripts.apply_then_close()) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url, idempotency=IDEM)})
        action = {**POST, "idempotency_key": "leased"}
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                first = await broker.call(action)
            assert first["error"]["retry"] == "same_idempotency_key"
            iid = first["invocation_id"]
            transactions = 0

            @contextlib.contextmanager
            def other_worker_first(batch: Batch) -> Iterator[None]:
                nonlocal transactions
                transactions += 1
                if transactions == 2:  # after the key's lookup: this call's lease request
                    take = [sys.executable, "-c", TAKE_LEASE, str(tmp_path / "journal.db"), iid]
                    subprocess.run(take, check=True, timeout=LIMIT)
                yield

            broker.journal.around_transaction = other_worker_first
            with trio.fail_after(LIMIT):
                second = await broker.call(action)
            broker.journal.around_transaction = None
            assert second["invocation_id"] == first["invocation_id"]
            err = second["error"]
            assert (err["code"], err["retry"], err["outcome"]) == (
                "IN_PROGRESS",
                "fetch_result",
                "unknown",
            )
            assert "result" not in second
            record = broker.record(iid)
            assert record is not None and record.state == "retry_pending"
            lease = broker.journal.lease(iid)
            assert lease is not None and lease.holder == "other-worker"
        assert len(srv.requests) == 1


async def test_same_key_retries_in_one_broker_take_one_lease_and_send_once(
    tmp_path: Path, token: str
) -> None:
    """Concurrent same-key calls in ONE broker read the same unknown record and all decide to
    retry.  Its tasks share one holder, and "a holder may renew its own retry lease" let each
    take the lease over from the one before: two retry leases, a LEASE_LOST, the budget spent
    from 1/3 to 3/3 by one real retry -- and the hint flipped to ``reconcile``.  A live retry
    lease is busy to its own holder's other tasks too: one lease, one send, the others
    IN_PROGRESS."""

    async def remote(peer: Any) -> None:
        if await peer.read_request() is None:
            return
        if peer.index == 0:
            await peer.close()  # applied, unanswered: unknown
            return
        peer.server.event("retried").set()
        await peer.server.event("release").wait()
        await peer.respond(Reply(201, body=b'{"payment":"pay_1"}'))

    async with HostileServer.running(remote) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url, idempotency=IDEM)})
        action = {**POST, "idempotency_key": "one-broker"}
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                first = await broker.call(action)
            assert first["error"]["retry"] == "same_idempotency_key"
            iid = first["invocation_id"]
            envelopes: list[dict[str, Any]] = []

            async def one() -> None:
                envelopes.append(await broker.call(action))

            with trio.fail_after(LIMIT):
                async with trio.open_nursery() as nursery:
                    for _ in range(WORKERS):
                        nursery.start_soon(one)
                    await srv.event("retried").wait()
                    while len(envelopes) < WORKERS - 1:  # the others answer meanwhile
                        await trio.sleep(0.01)
                    srv.event("release").set()
            kinds = event_kinds(broker, iid)
            assert kinds.count(E.RETRY_LEASE_ACQUIRED) == 1, kinds
            assert E.LEASE_LOST not in kinds, kinds
            codes = sorted(e.get("error", {}).get("code", "ok") for e in envelopes)
            assert codes == ["IN_PROGRESS"] * (WORKERS - 1) + ["ok"], envelopes
            record = broker.record(iid)
            assert record is not None and record.budget.used == 2
        assert len(srv.requests) == 2


async def test_a_key_bound_by_a_caller_that_stopped_before_recording_is_taken_over(
    tmp_path: Path, token: str
) -> None:
    """A binding with no record: in progress while its binder may still be writing; after the
    lease window, one caller takes it over by winning its first event, and runs it.  The window
    is 3 s: the early call must be judged inside it, which a loaded machine did not always do
    within 1 s."""
    async with HostileServer.running(scripts.serve(Reply(201))) as srv:
        cfg = write_config(
            tmp_path,
            {"api": http_target(srv.url, idempotency=IDEM, timeout={"connect": 1, "total": 3})},
        )
        action = {**POST, "idempotency_key": "orphan"}
        settings = EngineSettings(lease_margin=0.0)
        async with Broker.open(cfg, settings=settings) as broker:
            bound = await broker.journal.bind_idempotency(
                "payments.create", "orphan", _fingerprint(broker, action), "act_ORPHAN", None
            )
            with trio.fail_after(LIMIT):
                early = await broker.call(action)
            assert early["invocation_id"] == bound.invocation_id
            assert early["error"]["code"] == "IN_PROGRESS" and srv.requests == []
            await trio.sleep(3.1)  # the binder's lease window (total 3 s + margin 0) is over
            with trio.fail_after(LIMIT):
                late = await broker.call(action)
            assert late["invocation_id"] == "act_ORPHAN"
            assert_ok(broker, late)
            assert event_kinds(broker, "act_ORPHAN").count(E.ACTION_ACCEPTED) == 1
            # Recorded as a take-over, with why the binder was gone: its window was over.
            accepted = broker.events("act_ORPHAN")[0].attrs
            took = accepted["took_over"]
            assert (took["why"], took["recorded"], took["window"]) == (
                "window_over",
                "nothing",
                3.0,
            )
            assert took["bound_at"] == bound.created_at
            assert took["judged_at"] >= bound.created_at + 3.0
        assert len(srv.requests) == 1


async def test_a_caller_with_a_short_timeout_does_not_shorten_the_binder_s_window(
    tmp_path: Path, token: str
) -> None:
    """The window in which a binding with no record is its binder's is the binder's lease --
    at most the target's total timeout plus the margin -- not the second caller's: one with a
    0.5 s timeout took over, 0.6 s after the binding, an invocation whose binder was still
    inside its own 3 s lease (the binder, resuming, was told LEASE_LOST)."""
    async with HostileServer.running(scripts.serve(Reply(201))) as srv:
        cfg = write_config(
            tmp_path,
            {"api": http_target(srv.url, idempotency=IDEM, timeout={"connect": 1, "total": 3})},
        )
        action = {**POST, "idempotency_key": "orphan"}
        settings = EngineSettings(lease_margin=0.0)
        async with Broker.open(cfg, settings=settings) as broker:
            bound = await broker.journal.bind_idempotency(
                "payments.create", "orphan", _fingerprint(broker, action), "act_ORPHAN", None
            )
            await trio.sleep(0.6)  # past the short caller's own lease, inside the binder's
            with trio.fail_after(LIMIT):
                short = await broker.call(action, timeout=0.5)
            assert short["invocation_id"] == bound.invocation_id
            assert short["error"]["code"] == "IN_PROGRESS", short
            assert broker.record("act_ORPHAN") is None
        assert srv.requests == []


def _fingerprint(broker: Broker, action: dict[str, Any]) -> str:
    from affidavit.protocols.actions import fingerprint, parse_action

    target = broker.config.targets["api"]
    return fingerprint(
        parse_action(action, broker.config), target, broker._engine.snapshot.hash(target)
    )


async def test_a_fetch_after_a_delivery_failure_records_the_delivery(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(201, body=b"paid"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as broker:

            async def broken_pipe(envelope: dict[str, Any]) -> None:
                raise BrokenPipeError

            with trio.fail_after(LIMIT):
                env = await broker.call(POST, deliver=broken_pipe)
            iid = env["invocation_id"]
            assert_error(
                broker,
                env,
                phase="result_delivery",
                outcome="committed",
                retry="fetch_result",
                code="RESULT_DELIVERY_FAILED",
            )
            fetched = await broker.fetch_result(iid)
            assert fetched is not None and "error" not in fetched
            assert fetched["result"]["body"] == "paid"
            assert event_kinds(broker, iid)[-1] is E.RESULT_DELIVERED
            rec = broker.record(iid)
            assert rec is not None and rec.state == "delivered_committed"
            # A failing reader records nothing; the hint stays fetch_result.
            env2 = await broker.call(POST, deliver=broken_pipe)
            delivered: list[dict[str, Any]] = []

            async def reader(envelope: dict[str, Any]) -> None:
                delivered.append(envelope)

            await broker.fetch_result(env2["invocation_id"], deliver=reader)
            assert (
                delivered and event_kinds(broker, env2["invocation_id"])[-1] is E.RESULT_DELIVERED
            )
        assert len(srv.requests) == 2


@pytest.mark.parametrize("first", ["call", "fetch"])
async def test_a_channel_that_fails_after_a_concurrent_read_delivered_the_result_is_no_traceback(
    tmp_path: Path, token: str, first: str
) -> None:
    # A stored result is being handed to a caller's channel (the daemon's socket, MCP's line)
    # -- by the call that stored it, or by a fetch while that call's own channel hangs.
    # Meanwhile another caller who knows the invocation id fetches it: RESULT_DELIVERED
    # (fetch).  Then the first channel fails: the lifecycle refuses RESULT_DELIVERY_FAILED
    # after a delivery, and the record -- the result delivered -- is the answer, never
    # ImpossibleEvent out of the engine.
    async with (
        HostileServer.running(scripts.serve(Reply(201, body=b"paid"))) as srv,
        open_broker(write_config(tmp_path, {"api": http_target(srv.url)})) as broker,
    ):
        handed, fetched, stored, release = trio.Event(), trio.Event(), trio.Event(), trio.Event()
        out: dict[str, Any] = {}

        async def failing(envelope: dict[str, Any]) -> None:
            out["iid"] = envelope["invocation_id"]
            handed.set()
            await fetched.wait()
            raise BrokenPipeError("client gone")

        async def hanging(envelope: dict[str, Any]) -> None:
            out["iid"] = envelope["invocation_id"]
            stored.set()
            await release.wait()

        async def first_reader() -> None:
            if first == "call":
                out["env"] = await broker.call(POST, deliver=failing)
            else:
                out["env"] = await broker.fetch_result(out["iid"], deliver=failing)

        with trio.fail_after(LIMIT):
            async with trio.open_nursery() as nursery:
                if first == "fetch":  # the call's channel hangs: stored, not delivered
                    nursery.start_soon(lambda: broker.call(POST, deliver=hanging))
                    await stored.wait()
                nursery.start_soon(first_reader)
                await handed.wait()
                again = await broker.fetch_result(out["iid"])  # the concurrent read
                assert again is not None and again["result"]["body"] == "paid"
                fetched.set()
                while "env" not in out:
                    await trio.sleep(0.01)
                release.set()
        iid = out["iid"]
        env = out["env"]
        rec = broker.record(iid)
        assert rec is not None and rec.state == "delivered_committed"
        assert env is not None and env["invocation_id"] == iid
        assert "error" not in env and env["result"]["body"] == "paid", env
        assert E.RESULT_DELIVERY_FAILED not in event_kinds(broker, iid)
    assert len(srv.requests) == 1
