"""A worker stopped right before its dispatch gate, whose lease ran out meanwhile, is refused at
the gate when it resumes -- and answers with what the record proves, as a worker refused after
its dispatch does (test_stale_worker_after_dispatch.py): one rule for both.

Seed, "Retry code must be simple and testable": "Stop one worker after it acquires a retry
lease, wait for the lease to expire, and start another.  When the first one resumes, the
generation check must stop it before dispatch."  Seed, "The error envelope must contain
evidence": the answer is the record's, and it never claims more than the record shows.

Worker A (generation 0) stops, shielded, right before its first dispatch gate.  Its lease runs
out.  Worker B -- a second broker on the same journal -- calls with the same idempotency key:
recovery closes A's attempt (setup_failed: nothing was sent) and B retries under generation 1.
Then A resumes: while B's request is held at the remote, once B's result is stored and
delivered, or -- with no retry at all -- once recovery alone closed A's attempt.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.config import load_config
from affidavit.engine import CallControl, EngineSettings
from affidavit.statemachine import EventKind
from tests.http.hostile import HostileServer, Peer, Reply

from .helpers import http_target, stalled_call, until_lease_lapsed, write_config
from .http_rows import IDEM, POST

E = EventKind
LIMIT = 20  # seconds: the bound on each scenario
ACTION = {**POST, "idempotency_key": "gate-stale"}


async def _held(peer: Peer) -> None:
    """Only B reaches the remote: its request is held until the test sets ``release_b``."""
    if await peer.read_request() is None:
        return
    peer.server.event("b_received").set()
    await peer.server.event("release_b").wait()
    await peer.respond(Reply(201, body=b'{"from":"B"}'))


@pytest.mark.parametrize("when", ["b_in_flight", "b_stored", "recovered_only"])
async def test_a_worker_stopped_at_its_gate_answers_with_the_record_and_nothing_more(
    tmp_path: Path, token: str, when: str
) -> None:
    async with HostileServer.running(_held) as srv:
        cfg = load_config(write_config(tmp_path, {"api": http_target(srv.url, idempotency=IDEM)}))
        settings = EngineSettings(lease_margin=0.0)
        async with (
            Broker.open(config=cfg, settings=settings, holder="worker-A") as a,
            Broker.open(config=cfg, settings=settings, holder="worker-B") as b,
        ):
            envs: dict[str, Any] = {}

            async def call(name: str, broker: Broker, **kw: Any) -> None:
                envs[name] = await broker.call(ACTION, **kw)

            async with stalled_call(a, ACTION, limit=LIMIT, timeout=0.5) as stalled:
                while not a.journal.list_actions():  # A's preflight rides along: posted
                    await trio.sleep(0.01)
                (action,) = a.journal.list_actions()
                iid = action.invocation_id
                (accepted,) = [e for e in a.journal.events(iid) if e.kind is E.ACTION_ACCEPTED]
                await until_lease_lapsed(accepted)  # A's lease runs out while A is stopped
                if when == "recovered_only":
                    closed = await b.fetch_result(iid)  # recovery closes A's attempt
                    assert closed is not None and closed["evidence"]["state"] == "setup_failed"
                elif when == "b_stored":
                    srv.event("release_b").set()
                    await call("b", b)
                else:
                    stalled.nursery.start_soon(lambda: call("b", b))
                    await srv.event("b_received").wait()
                stalled.stall.resume.set()
                while stalled.envelope is None:
                    await trio.sleep(0.01)
                srv.event("release_b").set()
            await b.settled()  # the calls' deliveries, queued (for the sync reads)
            record = b.record(iid)
            assert record is not None
            events = b.events(iid)
    env_a = stalled.envelope
    assert env_a is not None
    err = env_a["error"]
    assert err["code"] == "LEASE_LOST", env_a
    # A's answer is the record's phase and outcome, with no result as A's own: B's result, if
    # stored, is the invocation's -- fetched, a read, never sent again.
    assert "result" not in env_a, env_a
    (lost,) = [e for e in events if e.kind is E.LEASE_LOST]
    assert lost.attrs["generation"] == 0
    if when == "recovered_only":
        # Nobody took A's place: recovery closed A's attempt, and the record's hint stands.
        assert srv.requests == []
        assert record.state == "setup_failed"
        assert (err["phase"], err["outcome"]) == ("connection_setup", "not_attempted")
        assert err["retry"] == record.retry.value
        assert "another worker" not in err["message"].lower(), err["message"]
        assert "closed (setup_failed)" in err["message"], err["message"]
        return
    assert [r.header("Idempotency-Key") for r in srv.requests] == ["gate-stale"]  # B's only
    assert "error" not in envs["b"], envs["b"]
    assert record.state == "delivered_committed"
    # B in flight (not final) or B's result stored: fetch it, never reconcile a running call.
    expected = "unknown" if when == "b_in_flight" else "committed"
    assert (err["outcome"], err["retry"]) == (expected, "fetch_result"), err
    assert "generation 1" in err["message"], err["message"]  # what the record shows: B's lease


class HangUpAtRefusal:
    """A binding whose caller hangs up the moment its dispatch gate is refused (the daemon's
    ``withdraw`` on a hang-up): what the control then says, and whether it withdrew."""

    def __init__(self, real: Any, control: CallControl) -> None:
        self.real, self.control = real, control
        self.kind, self.table = real.kind, real.table
        self.seen: tuple[bool, bool] | None = None  # (dispatching, withdrawn)

    def prepare(self, *args: Any) -> Any:
        return self.real.prepare(*args)

    def connect_timeout(self, target: Any) -> float:
        return float(self.real.connect_timeout(target))

    async def aclose(self) -> None:
        await self.real.aclose()

    async def perform(self, prepared: Any, ctx: Any) -> Any:
        gate = ctx.gate

        async def refused_then_gone(facts: Any, meanwhile: Any = None) -> None:
            try:
                await gate(facts, meanwhile)
            except Exception:
                self.seen = (self.control.dispatching, self.control.withdraw())
                raise

        return await self.real.perform(prepared, dataclasses.replace(ctx, gate=refused_then_gone))


async def test_a_refused_gate_leaves_the_call_not_dispatching(tmp_path: Path, token: str) -> None:
    """The gate's DISPATCH_STARTED refused (its attempt was closed meanwhile: the lease is no
    longer A's): nothing was sent, so the control must not say ``dispatching`` -- a hang-up
    after it is a withdrawal (logged as one), not a refusal to cancel a call on the wire.  The
    answer is still the record's LEASE_LOST, not_attempted."""
    async with HostileServer.running(_held) as srv:
        cfg = load_config(write_config(tmp_path, {"api": http_target(srv.url, idempotency=IDEM)}))
        control = CallControl()
        async with (
            Broker.open(config=cfg, holder="worker-A") as a,
            Broker.open(config=cfg, holder="worker-B") as b,
        ):
            hang_up = HangUpAtRefusal(a._engine.bindings["http"], control)
            # A's deadline is far: its gate is reached.
            async with stalled_call(
                a, ACTION, limit=LIMIT, binding=hang_up, control=control
            ) as stalled:
                while not a.journal.list_actions():
                    await trio.sleep(0.01)
                # Recovery (as a daemon's start-up would) closes A's attempt under it.
                assert [r.state for r in await b._engine.recover_orphans()] == ["setup_failed"]
    assert hang_up.seen == (False, True)
    env = stalled.envelope
    assert env is not None
    assert env["error"]["code"] == "LEASE_LOST", env
    assert env["error"]["outcome"] == "not_attempted", env
    assert srv.requests == []
