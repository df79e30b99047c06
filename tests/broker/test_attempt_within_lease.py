"""An attempt ends within its lease -- the first attempt's (ACTION_ACCEPTED's
``lease_expires_at``, generation 0) as a retry's.  Once a lease runs out every other worker may
take its holder for gone: recovery closes the attempt, a same-key retry or a reconciliation
query goes on from there.  So a worker that stalled (a pause, a slow credential step or journal)
until its lease ran out must not dispatch when it resumes, and an attempt dispatched late under
a valid lease must not still be in flight when that lease runs out (``run_tries``: its deadline
is within ``lease_ends - lease_margin``).  Without that: two requests of one invocation in
flight together, and a reconciliation recording ``reconciled_rejected`` over a charge the
remote then applied.  Both backends."""

from __future__ import annotations

import contextlib
import json
import time
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.config import load_config
from affidavit.engine import EngineSettings
from affidavit.statemachine import EventKind
from tests.http.hostile import HostileServer, Peer, Reply

from .approvalkit import reconcile_target
from .helpers import http_target, until_lease_lapsed, write_config
from .http_rows import IDEM, POST

E = EventKind
LIMIT = 20
A_TIMEOUT = 1.5  # A's caller's timeout: with no margin, A's lease
ACTION = {**POST, "idempotency_key": "first-attempt-lease"}
BACKENDS = pytest.mark.parametrize("backend", ["sqlite", "postgresql"])


@contextlib.asynccontextmanager
async def _pair(
    tmp: Path,
    targets: dict[str, Any],
    backend: str,
    request: pytest.FixtureRequest,
    margin: float = 0.0,
) -> AsyncIterator[tuple[Broker, Broker]]:
    """Workers A and B on one journal: a SQLite file, or a shared PostgreSQL database."""
    settings = EngineSettings(lease_margin=margin)
    if backend == "sqlite":
        tables: list[dict[str, Any] | None] = [None, None]
    else:
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


async def _remote(peer: Peer) -> None:
    """A's request (the first) is held until ``release_a``; B's is answered at once."""
    if await peer.read_request() is None:
        return
    if peer.index == 0:
        peer.server.event("a_received").set()
        await peer.server.event("release_a").wait()
        await peer.respond(Reply(201, body=b'{"from":"A"}'))
        return
    peer.server.event("b_received").set()
    await peer.respond(Reply(201, body=b'{"from":"B"}'))


@BACKENDS
async def test_a_first_attempt_whose_lease_ran_out_is_stopped_at_its_gate(
    tmp_path: Path, token: str, backend: str, request: pytest.FixtureRequest
) -> None:
    async with HostileServer.running(_remote) as srv:
        targets = {"api": http_target(srv.url, idempotency=IDEM)}
        async with _pair(tmp_path, targets, backend, request) as (a, b):
            recorder = a._engine.recorder
            real_write_many = recorder.write_many
            stopped, resume = trio.Event(), trio.Event()

            async def stalled_write_many(items: Any, **kw: Any) -> None:
                await real_write_many(items, **kw)
                kinds = [ev.kind for ev, _ in items]
                if E.CREDENTIAL_AUTHORIZED in kinds and not stopped.is_set():
                    stopped.set()  # A pauses here: preflight posted, attempt not yet started
                    with trio.CancelScope(shield=True), trio.move_on_after(LIMIT / 2):
                        await resume.wait()

            recorder.write_many = stalled_write_many  # type: ignore[method-assign]
            envs: dict[str, Any] = {}

            async def call(name: str, broker: Broker, **kw: Any) -> None:
                envs[name] = await broker.call(ACTION, **kw)

            with trio.fail_after(LIMIT):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(lambda: call("a", a, timeout=A_TIMEOUT))
                    await stopped.wait()
                    while not b.journal.list_actions():  # A's posted preamble commits
                        await trio.sleep(0.01)
                    (action,) = b.journal.list_actions()
                    iid = action.invocation_id
                    (accepted,) = [e for e in b.journal.events(iid) if e.kind is E.ACTION_ACCEPTED]
                    await until_lease_lapsed(accepted)  # A's lease runs out; nobody acts yet
                    resume.set()
                    with trio.move_on_after(1.0):
                        await srv.event("a_received").wait()  # A dispatched after all
                    # B, same key, after A's lease ran out: recovery, then a retry.
                    nursery.start_soon(lambda: call("b", b))
                    with trio.move_on_after(2.0):
                        await srv.event("b_received").wait()
                    srv.event("release_a").set()
            events = b.events(iid)
    kinds = [e.kind for e in events]
    in_flight_together = srv.event("a_received").is_set() and srv.event("b_received").is_set()
    # A correct fence stops A at its gate (its lease ran out), as it stops a retry: one request.
    assert len(srv.requests) == 1 and not in_flight_together, (
        f"{len(srv.requests)} requests, A's and B's in flight together; events: "
        f"{[k.value for k in kinds]}"
    )
    assert "result" not in envs["a"], envs["a"]  # A sent nothing: it has no result to give
    error = envs["a"]["error"]
    assert (error["code"], error["outcome"]) == ("LEASE_LOST", "not_attempted"), error
    assert "it sent nothing" in error["message"], error


class HeldCharges:
    """``POST /v1/charges`` is held until ``release_post``, then applied and answered 201 --
    except, with ``drop_first``, the first POST, closed unanswered and not applied (the
    invocation is unknown; the next POST is a same-key retry).  ``GET
    /v1/charges?idempotency_key=K`` reads whether K was applied (200) or not (404)."""

    def __init__(self, drop_first: bool = False) -> None:
        self.applied: list[str] = []
        self.drop_first = drop_first
        self.posts = 0

    async def script(self, peer: Peer) -> None:
        while True:
            req = await peer.read_request()
            if req is None:
                return
            if req.method == "POST":
                self.posts += 1
                if self.drop_first and self.posts == 1:
                    await peer.close()
                    return
                peer.server.event("post_received").set()
                await peer.server.event("release_post").wait()
                self.applied.append(req.header("idempotency-key") or "")
                await peer.respond(Reply(201, body=b'{"id": "ch_1"}'))
                continue
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(req.target).query)
            key = query.get("idempotency_key", [""])[0]
            status = 200 if key in self.applied else 404
            await peer.respond(Reply(status, body=json.dumps({"key": key}).encode()))


def _charge(key: str) -> dict[str, Any]:
    body = json.dumps({"amount": 5})
    return {
        "target": "api",
        "method": "POST",
        "path": "/v1/charges",
        "body": body,
        "idempotency_key": key,
    }


@BACKENDS
async def test_a_reconciliation_cannot_close_a_first_attempt_dispatched_after_its_lease_ran_out(
    tmp_path: Path, token: str, backend: str, request: pytest.FixtureRequest
) -> None:
    # The same unfenced dispatch, met by a reconciliation query instead of a retry: recovery
    # closes A's live attempt, the query reads "absent" while A's POST is in flight, and the
    # record says reconciled_rejected -- then A's POST is applied.  "rejected" invites the
    # charge again: the false record 8b514dd set out to prevent, through the first attempt.
    api = HeldCharges()
    charge = _charge("charge-first")
    async with (
        HostileServer.running(api.script) as srv,
        _pair(tmp_path, reconcile_target(srv.url), backend, request) as (a, b),
    ):
        recorder = a._engine.recorder
        real_write_many = recorder.write_many
        stopped, resume = trio.Event(), trio.Event()

        async def stalled_write_many(items: Any, **kw: Any) -> None:
            await real_write_many(items, **kw)
            kinds = [ev.kind for ev, _ in items]
            if E.CREDENTIAL_AUTHORIZED in kinds and not stopped.is_set():
                stopped.set()
                with trio.CancelScope(shield=True), trio.move_on_after(LIMIT / 2):
                    await resume.wait()

        recorder.write_many = stalled_write_many  # type: ignore[method-assign]
        out: dict[str, Any] = {}

        async def call_a() -> None:
            out["a"] = await a.call(charge, timeout=A_TIMEOUT)

        with trio.fail_after(LIMIT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(call_a)
                await stopped.wait()
                while not b.journal.list_actions():
                    await trio.sleep(0.01)
                (action,) = b.journal.list_actions()
                iid = action.invocation_id
                (accepted,) = [e for e in b.journal.events(iid) if e.kind is E.ACTION_ACCEPTED]
                await until_lease_lapsed(accepted)
                resume.set()
                with trio.move_on_after(1.0):
                    await srv.event("post_received").wait()
                try:
                    out["reconciled"] = await b.reconcile(iid, query=True)
                except Exception as exc:
                    out["reconciled"] = exc
                srv.event("release_post").set()
        record = b.record(iid)
        assert record is not None
    # If the charge was applied, the record must not say the effect is absent.
    assert not (api.applied and record.state == "reconciled_rejected"), (
        f"applied={api.applied}, record={record.state}, A={out['a'].get('error', {}).get('code')}"
    )


@BACKENDS
async def test_a_retry_s_call_does_not_outlive_its_lease(
    tmp_path: Path, token: str, backend: str, request: pytest.FixtureRequest
) -> None:
    # The same gap with a *valid* lease at the gate.  A lease's expiry is the moment every other
    # worker may take its holder for gone ("a lease's margin is its ttl beyond the call's
    # timeout": journal/leases.py) -- but the attempt's deadline is started only after the
    # preflight (run_tries), so a retry whose preflight was slow dispatches in time (its gate
    # checks the lease: valid) and is still in flight when its lease runs out.  Then a
    # reconciliation recovers the record -- closing the live, in-flight attempt -- and its
    # query reads "absent"; the retry's POST is applied afterwards, and the record says
    # reconciled_rejected over an applied charge (shown in the failure message).  A correct
    # implementation ends the attempt by its lease (its deadline within expiry - margin).
    api = HeldCharges(drop_first=True)
    charge = _charge("charge-retry")
    timeout, margin = 2.0, 1.0  # the retry's lease: 3 s
    async with HostileServer.running(api.script) as srv:
        targets = reconcile_target(srv.url)
        async with _pair(tmp_path, targets, backend, request, margin) as (a, b):
            first = await a.call(charge, timeout=timeout)
            assert first["error"]["outcome"] == "unknown", first
            iid = first["invocation_id"]
            recorder = a._engine.recorder
            real_write_many = recorder.write_many
            slowed = trio.Event()

            async def slow_write_many(items: Any, **kw: Any) -> None:
                await real_write_many(items, **kw)
                kinds = [ev.kind for ev, _ in items]
                if E.CREDENTIAL_AUTHORIZED in kinds and not slowed.is_set():
                    slowed.set()  # a slow preflight: longer than the margin, within the lease
                    with trio.CancelScope(shield=True):
                        await trio.sleep(margin * 1.5)

            recorder.write_many = slow_write_many  # type: ignore[method-assign]
            out: dict[str, Any] = {}

            async def retry() -> None:
                out["a"] = await a.call(charge, timeout=timeout)

            with trio.fail_after(LIMIT):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(retry)
                    await srv.event("post_received").wait()  # dispatched under a valid lease
                    (lease,) = [
                        e for e in b.journal.events(iid) if e.kind is E.RETRY_LEASE_ACQUIRED
                    ]
                    while time.time() <= lease.attrs["expires_at"]:
                        await trio.sleep(0.02)
                    over_by_expiry = "a" in out  # the holder's call ended within its lease?
                    try:
                        out["reconciled"] = await b.reconcile(iid, query=True)
                    except Exception as exc:
                        out["reconciled"] = exc
                    srv.event("release_post").set()
            record = b.record(iid)
            assert record is not None
    assert over_by_expiry, (
        f"the retry was still in flight when its lease ran out; then applied={api.applied}, "
        f"record={record.state}, A={out['a'].get('error', {}).get('code')}"
    )


STEP = 120.0  # seconds the lease clock jumps while A's barrier waits: past A's lease


@BACKENDS
async def test_a_first_dispatch_whose_lease_ends_while_its_barrier_waits_sends_nothing(
    tmp_path: Path,
    token: str,
    backend: str,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A's broker checked its lease before its gate; the DISPATCH_STARTED barrier then waited
    (for the writer, the chain head) while the lease clock went past the deadline -- stepped
    forward on SQLite (the journal's clock is the host's wall clock), really run out on
    PostgreSQL (the database's clock cannot be stepped from here).  The journal judges it again
    in the writing transaction: the caller is told LEASE_LOST, nothing sent, and the record
    says the lease was lost, never that a dispatch started."""
    async with HostileServer.running(_remote) as srv:
        targets = {"api": http_target(srv.url, idempotency=IDEM)}
        async with _pair(tmp_path, targets, backend, request) as (a, _b):
            journal = a.journal
            real_append = journal.append
            submitted: list[float] = []

            async def waits(event: Any, **kw: Any) -> Any:
                if event.kind is E.DISPATCH_STARTED and kw.get("first_gate"):
                    if backend == "sqlite":
                        monkeypatch.setattr(journal, "_clock", lambda: time.time() + STEP)
                    else:  # the lease (A_TIMEOUT, no margin) was taken before the gate
                        with trio.CancelScope(shield=True):  # as the append's own wait is
                            await trio.sleep(A_TIMEOUT + 0.2)
                    submitted.append(time.time())
                return await real_append(event, **kw)

            monkeypatch.setattr(journal, "append", waits)
            with trio.fail_after(LIMIT):
                env = await a.call(ACTION, timeout=A_TIMEOUT)
            monkeypatch.undo()
            iid = env["invocation_id"]
            events = a.events(iid)
            record = a.record(iid)
    assert srv.requests == [] and not srv.event("a_received").is_set()  # nothing sent
    error = env["error"]
    assert (error["code"], error["outcome"]) == ("LEASE_LOST", "not_attempted"), error
    assert "it sent nothing" in error["message"], error
    kinds = [e.kind for e in events]
    assert E.DISPATCH_STARTED not in kinds, kinds
    (lost,) = [e for e in events if e.kind is E.LEASE_LOST]
    assert (lost.attrs["generation"], lost.attrs["holder"]) == (0, "worker-A"), dict(lost.attrs)
    assert "after_dispatch" not in lost.attrs
    assert record is not None and not record.evidence.get("dispatch_started"), record.evidence
    (accepted,) = [e for e in events if e.kind is E.ACTION_ACCEPTED]
    if backend == "postgresql":  # the barrier really was submitted past the recorded deadline
        assert submitted[0] > accepted.attrs["lease_expires_at"], (submitted, accepted.attrs)
