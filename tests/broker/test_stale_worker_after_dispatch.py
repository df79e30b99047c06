"""A worker whose lease ran out *after* it dispatched writes nothing into the attempt that took
the invocation over, and answers with what the record proves -- never with its own response as
the invocation's result, never with another attempt's result as its own, never a traceback.

Seed, "Retry code must be simple and testable": "Stop one worker after it acquires a retry
lease, wait for the lease to expire, and start another.  When the first one resumes, the
generation check must stop it before dispatch."  Here the first worker resumes *after* its
dispatch, with a complete response in hand (or with its deadline striking): the events it goes
on to write -- milestones, the protocol summary, REMOTE_RESPONSE_COMPLETE, RESULT_COMMITTED, its
interruption -- carry no lease of their own, and the lifecycle accepts them in the newer
attempt's states.  Seed, "Idempotency is defined by the remote contract": "allow only one active
attempt" -- and "This ... keeps the log understandable".

Worker A is stopped (a paused process, a stalled host) right after its adapter returned the
complete response: the binding is wrapped so that it waits, shielded, as a stopped process does
nothing.  Its lease is the caller's short timeout with no margin; once it has run out, worker B
-- a second broker on the same journal, as a second process or host is -- calls with the same
idempotency key: recovery closes A's attempt (unknown), and B retries under a new lease
(generation 1), as ``decide()`` allows for a verified remote deduplication contract.  Then A
resumes, at each point of B's attempt in turn.

Real time: a lease's expiry is the journal's wall clock (the database's, on PostgreSQL).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h11
import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.config import load_config
from affidavit.engine import EngineSettings
from affidavit.journal import boot
from affidavit.statemachine import Event, EventKind, Record
from tests.http.hostile import HostileServer, Peer, Reply, Script

from .helpers import http_target, stalled_call, until_lease_lapsed, write_config
from .http_rows import IDEM, POST

E = EventKind
LIMIT = 30  # seconds: the bound on each scenario
A_TIMEOUT = 0.5  # A's caller's timeout: with no margin, A's lease
ACTION = {**POST, "idempotency_key": "stale-worker"}
BODY_A, BODY_B = b'{"from":"A"}', b'{"from":"B"}'
WHEN = ["b_in_flight", "b_in_flight_deadline", "b_delivering", "b_delivered", "recovered_only"]
"""Where B's side stands when A resumes: B's request held at the remote; the same, and A's
deadline strikes as it resumes (A goes on to record its interruption); B's result stored and
its delivery under way; B's call over; no retry at all -- only recovery closed A's attempt."""


class Stalled:
    """A binding whose ``perform`` stops, shielded, once the real one returned its result --
    the worker paused with the complete response in memory -- until ``resume`` is set.
    ``deadline``: on resuming, the attempt's own deadline (long past) strikes at its next
    checkpoint, as it does in a process that was stopped."""

    def __init__(self, real: Any, deadline: bool) -> None:
        self.real = real
        self.kind, self.table = real.kind, real.table
        self.deadline = deadline
        self.stopped = trio.Event()
        self.resume = trio.Event()

    def prepare(self, *args: Any) -> Any:
        return self.real.prepare(*args)

    def connect_timeout(self, target: Any) -> float:
        return float(self.real.connect_timeout(target))

    async def aclose(self) -> None:
        await self.real.aclose()

    async def perform(self, prepared: Any, ctx: Any) -> Any:
        result = await self.real.perform(prepared, ctx)
        self.stopped.set()
        with trio.CancelScope(shield=True):
            await self.resume.wait()
        if self.deadline:
            await trio.lowlevel.checkpoint()
        return result


def _remote() -> Script:
    """The first connection (A's) is answered at once; every later one (B's) once the test
    sets ``release_b``, after setting ``b_received``."""

    async def script(peer: Peer) -> None:
        if await peer.read_request() is None:
            return
        if peer.index == 0:
            await peer.respond(Reply(201, body=BODY_A))
            return
        peer.server.event("b_received").set()
        await peer.server.event("release_b").wait()
        await peer.respond(Reply(201, body=BODY_B))

    return script


@dataclass
class Outcome:
    env_a: dict[str, Any]
    env_b: dict[str, Any] | None
    events: list[Event]
    record: Record
    fetched: dict[str, Any]
    verified: bool
    keys: list[str | None]


@contextlib.asynccontextmanager
async def _brokers(
    tmp: Path, url: str, backend: str, request: pytest.FixtureRequest | None, **target: Any
) -> AsyncIterator[tuple[Broker, Broker]]:
    settings = EngineSettings(lease_margin=0.0)
    targets = {"api": http_target(url, idempotency=IDEM, **target)}
    if backend == "sqlite":
        tables: list[dict[str, Any] | None] = [None, None]
    else:
        assert request is not None
        db = request.getfixturevalue("pg_url")
        tables = [
            {"url": db, "key_file": str(tmp / "shared.key"), "signing_key": str(tmp / f"{n}.sk")}
            for n in ("a", "b")
        ]
    cfg = [
        load_config(write_config(tmp, targets, journal=t, name=f"{n}.toml"))
        for n, t in zip("ab", tables, strict=True)
    ]
    async with (
        Broker.open(config=cfg[0], settings=settings, holder="worker-A") as a,
        Broker.open(config=cfg[1], settings=settings, holder="worker-B") as b,
    ):
        yield a, b


async def _scenario(tmp: Path, backend: str, when: str, request: pytest.FixtureRequest) -> Outcome:
    async with (
        HostileServer.running(_remote()) as srv,
        _brokers(tmp, srv.url, backend, request) as (a, b),
    ):
        stalled = Stalled(a._engine.bindings["http"], deadline=when == "b_in_flight_deadline")
        a._engine.bindings["http"] = stalled
        envs: dict[str, dict[str, Any]] = {}
        done = {"a": trio.Event(), "b": trio.Event()}
        delivering, delivered = trio.Event(), trio.Event()

        async def deliver(envelope: dict[str, Any]) -> None:
            delivering.set()
            await delivered.wait()

        async def call(name: str, broker: Broker, **kw: Any) -> None:
            try:
                envs[name] = await broker.call(ACTION, **kw)
            finally:
                done[name].set()

        with trio.fail_after(LIMIT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: call("a", a, timeout=A_TIMEOUT))
                await stalled.stopped.wait()
                (action,) = a.journal.list_actions()
                iid = action.invocation_id
                (accepted,) = [e for e in a.journal.events(iid) if e.kind is E.ACTION_ACCEPTED]
                await until_lease_lapsed(accepted)  # A's lease runs out while A is stopped
                if when == "recovered_only":
                    closed = await b.fetch_result(iid)  # recovery closes A's attempt
                    assert closed is not None and closed["error"]["outcome"] == "unknown"
                    stalled.resume.set()
                else:
                    if when == "b_delivered":
                        srv.event("release_b").set()
                    kw = {"deliver": deliver} if when == "b_delivering" else {}
                    nursery.start_soon(lambda: call("b", b, **kw))
                    if when == "b_delivering":
                        srv.event("release_b").set()
                        await delivering.wait()
                    elif when == "b_delivered":
                        await done["b"].wait()
                    else:
                        await srv.event("b_received").wait()
                    stalled.resume.set()
                    await done["a"].wait()
                    srv.event("release_b").set()
                    delivered.set()
        fetched = await b.fetch_result(iid)
        assert fetched is not None
        record = b.record(iid)
        assert record is not None
        return Outcome(
            env_a=envs["a"],
            env_b=envs.get("b"),
            events=b.events(iid),
            record=record,
            fetched=fetched,
            verified=b.journal.verify().ok,
            keys=[r.header("Idempotency-Key") for r in srv.requests],
        )


def _body(env: dict[str, Any]) -> Any:
    return json.loads(env["result"]["body"])


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
@pytest.mark.parametrize("when", WHEN)
async def test_a_worker_whose_lease_ran_out_after_dispatch_writes_nothing_into_the_record(
    tmp_path: Path, token: str, backend: str, when: str, request: pytest.FixtureRequest
) -> None:
    run = await _scenario(tmp_path, backend, when, request)
    kinds = [e.kind for e in run.events]
    assert run.verified
    # A's stale writes: nothing but LEASE_LOST (and, before B's lease, nothing B's attempt can
    # be confused with).  Every event of an attempt names its generation.
    lease_at = next((e.seq for e in run.events if e.kind is E.RETRY_LEASE_ACQUIRED), None)
    lost = [e for e in run.events if e.kind is E.LEASE_LOST]
    assert [e.attrs["generation"] for e in lost] == [0], (kinds, run.env_a)
    assert [w["generation"] for w in run.record.evidence["stale_workers"]] == [0]
    env_a = run.env_a
    err = env_a["error"]
    assert err["code"] == "LEASE_LOST", env_a
    assert "result" not in env_a  # neither A's response nor B's, as A's answer
    assert env_a["evidence"]["dispatch_started"] is True
    if when == "recovered_only":
        # Recovery closed A's attempt; A's late response is not the record's (the lifecycle
        # never reopens an interrupted attempt), and A says only what the record proves.
        assert run.env_b is None and lease_at is None
        assert E.REMOTE_RESPONSE_COMPLETE not in kinds and E.RESULT_COMMITTED not in kinds
        assert run.record.state == "interrupted"
        assert (err["outcome"], err["retry"]) == ("unknown", run.record.retry.value)
        assert "closed (interrupted)" in err["message"], err["message"]
        assert "another worker" not in err["message"].lower(), err["message"]
        assert run.keys == ["stale-worker"]
        return
    assert lease_at is not None
    stale = [
        e
        for e in run.events
        if e.seq is not None
        and e.seq > lease_at
        and e.kind is not E.LEASE_LOST
        and e.attrs.get("generation") != 1
    ]
    # After B's lease, only B's attempt writes -- and the deliveries, which name no attempt.
    assert {e.kind for e in stale} <= {E.RESULT_DELIVERED}, stale
    (complete,) = [e for e in run.events if e.kind is E.REMOTE_RESPONSE_COMPLETE]
    (committed,) = [e for e in run.events if e.kind is E.RESULT_COMMITTED]
    assert complete.attrs["generation"] == committed.attrs["generation"] == 1
    # B's call got B's response, stored and delivered as the invocation's result.
    env_b = run.env_b
    assert env_b is not None and "error" not in env_b, env_b
    assert _body(env_b) == {"from": "B"}
    assert _body(run.fetched) == {"from": "B"}
    assert [(x["generation"], x["outcome"]) for x in run.record.attempts] == [
        (0, "unknown"),
        (1, "committed"),
    ]
    assert run.record.state == "delivered_committed"
    # A's answer: the record as it stood -- B in flight, or B's result stored -- and where to
    # find the result: a read, never a resend.
    expected = "unknown" if when.startswith("b_in_flight") else "committed"
    assert (err["outcome"], err["retry"]) == (expected, "fetch_result")
    assert "generation 1" in err["message"], err["message"]  # the record shows B's lease
    assert run.keys == ["stale-worker", "stale-worker"]


BIG = 200 * 1024  # several result chunks (64 KiB)


def _long_remote() -> Script:
    """A's connection: a long body at once.  B's: the same length, its first half at once, the
    rest once the test sets ``release_b`` (after setting ``b_half``)."""

    async def script(peer: Peer) -> None:
        if await peer.read_request() is None:
            return
        if peer.index == 0:
            await peer.respond(Reply(201, body=b"A" * BIG))
            return
        head = h11.Response(status_code=201, headers=[("Content-Length", str(BIG))])
        await peer.send_raw(peer.h11.send(head) or b"")
        await peer.send_raw(peer.h11.send(h11.Data(data=b"B" * (BIG // 2))) or b"")
        peer.server.event("b_half").set()
        await peer.server.event("release_b").wait()
        await peer.send_raw(peer.h11.send(h11.Data(data=b"B" * (BIG - BIG // 2))) or b"")
        await peer.send_raw(peer.h11.send(h11.EndOfMessage()) or b"")

    return script


async def test_a_stale_worker_s_result_chunk_does_not_replace_the_newer_attempt_s(
    tmp_path: Path, token: str, request: pytest.FixtureRequest
) -> None:
    """On a shared journal a result's chunks are rows as they arrive (``PostingWriter``), and
    chunk 0 starts its stream over -- dropping an earlier, uncommitted attempt's.  A worker
    stopped while posting its first chunk, resumed once B has stored chunks of its own, must not
    drop B's: B's commit checks its stored chunks are the ones it wrote, and would fail."""
    async with (
        HostileServer.running(_long_remote()) as srv,
        _brokers(tmp_path, srv.url, "postgresql", request) as (a, b),
    ):
        stopped, resume, b_stored = trio.Event(), trio.Event(), trio.Event()
        post_a, post_b = a.journal.post_result_chunk, b.journal.post_result_chunk

        async def stalled(iid: str, stream: str, index: int, data: bytes, **kw: Any) -> Any:
            if index == 0 and not stopped.is_set():
                stopped.set()  # A stops here, its first chunk in hand
                with trio.CancelScope(shield=True):
                    await resume.wait()
            return await post_a(iid, stream, index, data, **kw)

        async def watched(iid: str, stream: str, index: int, data: bytes, **kw: Any) -> Any:
            posted = await post_b(iid, stream, index, data, **kw)
            if index == 0:
                await posted.wait()
                b_stored.set()
            return posted

        a.journal.post_result_chunk = stalled  # type: ignore[method-assign]
        b.journal.post_result_chunk = watched  # type: ignore[method-assign]
        envs: dict[str, dict[str, Any]] = {}

        async def call(name: str, broker: Broker, timeout: float | None = None) -> None:
            envs[name] = await broker.call(ACTION, timeout=timeout)

        with trio.fail_after(LIMIT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(call, "a", a, A_TIMEOUT)
                await stopped.wait()
                (action,) = a.journal.list_actions()
                iid = action.invocation_id
                (accepted,) = [e for e in a.journal.events(iid) if e.kind is E.ACTION_ACCEPTED]
                await until_lease_lapsed(accepted)
                nursery.start_soon(call, "b", b)
                await b_stored.wait()
                resume.set()
                while "a" not in envs:
                    await trio.sleep(0.01)
                srv.event("release_b").set()
        env_a, env_b = envs["a"], envs["b"]
        assert env_a["error"]["code"] == "LEASE_LOST", env_a
        assert "error" not in env_b, env_b["error"]
        fetched = await b.fetch_result(iid)
        assert fetched is not None and fetched["result"]["body"] == "B" * BIG
        events = b.events(iid)
        (committed,) = [e for e in events if e.kind is E.RESULT_COMMITTED]
        assert committed.attrs["generation"] == 1
        assert E.RESULT_STORE_FAILED not in [e.kind for e in events]
        assert b.journal.verify().ok


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_an_attempt_recovery_closed_takes_nothing_more_from_its_stale_worker(
    tmp_path: Path,
    token: str,
    backend: str,
    request: pytest.FixtureRequest,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # No retry: recovery closed A's attempt (ATTEMPT_INTERRUPTED, naming A's generation, which
    # stays the current one).  A resumes with its complete response: none of it is the closed
    # record's -- not even its protocol summary, which would show an interrupted, unknown
    # attempt with the response status A received while A's answer says it is not recorded.
    run = await _scenario(tmp_path, backend, "recovered_only", request)
    (closing,) = [e for e in run.events if e.kind is E.ATTEMPT_INTERRUPTED]
    after = [e.kind for e in run.events if e.seq is not None and e.seq > closing.seq]
    assert after == [E.LEASE_LOST], after
    assert run.record.state == "interrupted"
    assert "status" not in (run.record.evidence.get("http") or {}), run.record.evidence["http"]
    assert run.env_a["error"]["code"] == "LEASE_LOST"
    # A result refused because the attempt was closed is no storage failure: no operator alarm.
    assert "operator intervention" not in caplog.text, caplog.text


def _redirecting(first: str) -> Script:
    """``POST /v1/x``: the first is ``first`` ("drop": closed unanswered; "redirect"); every
    later one a 307 to ``/landing``, which answers 201."""

    async def script(peer: Peer) -> None:
        while True:
            req = await peer.read_request()
            if req is None:
                return
            if req.target.startswith("/landing"):
                await peer.respond(Reply(201, body=b'{"hop": 2}'))
            elif first == "drop" and not peer.server.event("first").is_set():
                peer.server.event("first").set()
                await peer.close()
                return
            else:
                await peer.respond(Reply(307, headers=[("Location", "/landing")], body=b"moved"))

    return script


class _Ahead:
    """A wall clock ahead of the stalled worker's by more than its lease's margin (lease
    expiry is compared across hosts on wall clocks: docs/deployment.md, "run NTP")."""

    @staticmethod
    def time() -> float:
        return time.time() + 3600.0


def _run_out(
    broker: Broker, backend: str, request: pytest.FixtureRequest, m: pytest.MonkeyPatch
) -> None:
    """Every lease has run out: by the journal's clock on SQLite; on PostgreSQL, which judges
    leases by the database's own clock, the stored leases are moved into the past."""
    if backend == "sqlite":
        m.setattr(broker.journal, "_clock", _Ahead.time)
        return
    import psycopg

    with psycopg.connect(request.getfixturevalue("pg_url"), autocommit=True) as conn:
        conn.execute("UPDATE leases SET expires_at = expires_at - 3600")


HOP = {"target": "api", "method": "POST", "path": "/v1/x", "idempotency_key": "hop"}


async def test_a_stale_worker_sends_no_next_hop_after_recovery_closed_its_attempt(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A's first hop was answered 307; A stops before the next hop's gate.  B, whose clock says
    # A's lease ran out, closes A's attempt (interrupted).  When A resumes, the hop's gate is
    # a dispatch boundary of a closed attempt: nothing more may be sent under it.
    import affidavit.engine.recovery as recovery

    async with (
        HostileServer.running(_redirecting("redirect")) as srv,
        _brokers(tmp_path, srv.url, "sqlite", None, follow_redirects=True) as (a, b),
    ):
        async with stalled_call(a, HOP, limit=LIMIT, hop=2) as stalled:
            (action,) = b.journal.list_actions()
            iid = action.invocation_id
            with monkeypatch.context() as m:
                m.setattr(recovery, "time", _Ahead)
                # B is on another host: A's lease, taken on A's boot, is judged by wall clock.
                m.setattr(boot, "_boot_id", lambda: "another host's boot")
                closed = await b.fetch_result(iid)  # A's lease has run out, by B's clock
            assert closed is not None and closed["evidence"]["state"] == "interrupted"
        record = b.record(iid)
        assert record is not None
        events = b.events(iid)
    assert [r.target for r in srv.requests] == ["/v1/x"], (record.state, record.evidence)
    assert record.state == "interrupted"
    (closing,) = [e for e in events if e.kind is E.ATTEMPT_INTERRUPTED]
    assert [e.kind for e in events if e.seq and e.seq > closing.seq] == [E.LEASE_LOST]
    assert stalled.envelope is not None
    err = stalled.envelope["error"]
    assert (err["code"], err["outcome"]) == ("LEASE_LOST", "unknown"), err


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_a_retry_whose_lease_ran_out_sends_no_next_hop(
    tmp_path: Path,
    token: str,
    monkeypatch: pytest.MonkeyPatch,
    backend: str,
    request: pytest.FixtureRequest,
) -> None:
    # A retry holds a lease row (holder, generation, expiry) that its dispatch gate checks in
    # the appending transaction.  A redirect's next hop is a dispatch boundary too: once the
    # lease ran out -- nobody has acted on the invocation yet -- the worker must not send it,
    # exactly as it must not send its first hop.  The LEASE_LOST the journal writes there says
    # the first hop was sent (``after_dispatch``), as the engine's own does after a dispatch.
    async with (
        HostileServer.running(_redirecting("drop")) as srv,
        _brokers(tmp_path, srv.url, backend, request, follow_redirects=True) as (a, _b),
    ):
        first = await a.call(HOP)
        assert first["error"]["outcome"] == "unknown", first
        iid = first["invocation_id"]
        # The retry, stopped once its first hop was answered 307:
        async with stalled_call(a, HOP, limit=LIMIT, hop=2) as stalled:
            _run_out(a, backend, request, monkeypatch)  # its lease ran out
        record = a.record(iid)
        assert record is not None
        events = a.events(iid)
    assert [r.target for r in srv.requests] == ["/v1/x", "/v1/x"], record.evidence.get("steps")
    (lost,) = [e for e in events if e.kind is E.LEASE_LOST]
    assert (lost.attrs["generation"], lost.attrs["holder"]) == (1, "worker-A")
    assert lost.attrs.get("after_dispatch") is True, dict(lost.attrs)
    assert stalled.envelope is not None
    assert "it had dispatched" in stalled.envelope["error"]["message"]  # the envelope knows it too
    assert record.generation == 1 and not record.final  # nobody closed it: recovery will
    err = stalled.envelope["error"]
    assert (err["code"], err["retry"]) == ("LEASE_LOST", "fetch_result"), err
    # Nobody took the invocation over nor closed it: the answer says no such thing.
    assert "no longer valid" in err["message"], err["message"]
    for claim in ("another worker", "newer", "recovery", "closed"):
        assert claim not in err["message"].lower(), err["message"]


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_a_first_attempt_whose_lease_ran_out_sends_no_next_hop(
    tmp_path: Path, token: str, backend: str, request: pytest.FixtureRequest
) -> None:
    # The first attempt holds no lease row: its gate judges ACTION_ACCEPTED's deadline in the
    # appending transaction -- and a redirect's next hop is a dispatch boundary too.  Stopped
    # before hop 2's gate until that deadline passed (nobody has acted yet), A must not send
    # it: as a retry above, LEASE_LOST says the first hop was sent.
    async with (
        HostileServer.running(_redirecting("redirect")) as srv,
        _brokers(tmp_path, srv.url, backend, request, follow_redirects=True) as (a, _b),
    ):
        async with stalled_call(a, HOP, limit=LIMIT, hop=2, timeout=A_TIMEOUT) as stalled:
            (action,) = a.journal.list_actions()
            iid = action.invocation_id
            (accepted,) = [e for e in a.journal.events(iid) if e.kind is E.ACTION_ACCEPTED]
            await until_lease_lapsed(accepted, after=0.1)  # A's lease runs out while it is stopped
        record = a.record(iid)
        assert record is not None
        events = a.events(iid)
    assert [r.target for r in srv.requests] == ["/v1/x"], record.evidence.get("steps")
    (lost,) = [e for e in events if e.kind is E.LEASE_LOST]
    assert (lost.attrs["generation"], lost.attrs["holder"]) == (0, "worker-A")
    assert lost.attrs.get("after_dispatch") is True, dict(lost.attrs)
    assert not [e for e in events if e.attrs.get("state") == "hop_dispatch"]
    assert stalled.envelope is not None
    err = stalled.envelope["error"]
    assert (err["code"], err["outcome"]) == ("LEASE_LOST", "unknown"), err
    assert "it had dispatched" in err["message"], err["message"]


async def test_a_clock_ahead_does_not_close_a_live_attempt_on_a_shared_journal(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    # As above, on PostgreSQL: B's clock says A's lease ran out an hour ago, but the journal
    # judges it by the database's clock, in the closing transaction -- A's attempt is live, so
    # B closes nothing and answers it in progress; A, resumed, sends its next hop and finishes.
    import affidavit.engine.recovery as recovery

    async with (
        HostileServer.running(_redirecting("redirect")) as srv,
        _brokers(tmp_path, srv.url, "postgresql", request, follow_redirects=True) as (a, b),
    ):
        async with stalled_call(a, HOP, limit=LIMIT, hop=2) as stalled:
            (action,) = b.journal.list_actions()
            iid = action.invocation_id
            with monkeypatch.context() as m:
                m.setattr(recovery, "time", _Ahead)
                seen = await b.fetch_result(iid)
            assert seen is not None and seen["evidence"]["state"] == "dispatched", seen
        events = b.events(iid)
    assert [r.target for r in srv.requests] == ["/v1/x", "/landing"]
    kinds = [e.kind for e in events]
    assert E.ATTEMPT_INTERRUPTED not in kinds and E.LEASE_LOST not in kinds, kinds
    assert stalled.envelope is not None
    assert "error" not in stalled.envelope, stalled.envelope
