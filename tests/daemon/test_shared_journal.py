"""Several daemons on one PostgreSQL journal (issue 16, "What it must show"): one history, one
idempotency-key space, leases that fence a retry across brokers -- with real ``affidavit serve``
processes, a real PostgreSQL and the scripted remote counting what it received.

* 4 daemons, 2,000 calls from 32 clients: every invocation runs once; a key sent to two daemons
  at the same moment is dispatched once; ``journal verify`` is intact with the four brokers'
  public keys.  Then one daemon is SIGKILLed while its calls are dispatched and held: they stay
  ``unknown`` (never lost, never not_attempted), and another daemon's same-key retry is answered
  from the record while the dead one's lease runs, then takes a new lease generation -- and the
  dead one's generation can no longer dispatch.
* PostgreSQL stopped and restarted during a run: calls that had not reached their gate fail
  cleanly (nothing recorded is claimed; nothing is sent), dispatched ones are ``unknown`` or
  committed as their records prove, none is lost or misclassified.

Bounded: every wait has a limit, every loop a count; the big test takes ~1 minute on 2 cores.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.client import Client
from affidavit.api.wire import ApiError
from affidavit.journal import Journal, JournalReader, LeaseLost, SigningKey
from affidavit.journal.sealing import BrokerKey
from affidavit.statemachine import Event, EventKind, ImpossibleEvent
from tests.http.hostile import HostileServer, Peer, Received, Reply
from tests.postgres import Cluster

from .kit import DaemonProc, api_target, start_sharing, stop, wait_until

pytestmark = pytest.mark.slow

DAEMONS = 4
CLIENTS = 32
KEYED = 100
"""Idempotency keys each sent to two daemons at once (200 of the calls)."""
CALLS = 2000
LIMIT = 240.0
IDEM = {"header": "Idempotency-Key", "scope": "api.create", "retention": "24h"}


class Remote:
    """The scripted remote: answers at once, except ``/hold/...``, which it holds (bounded) --
    a call dispatched and waiting when its daemon dies."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.held = 0

    async def script(self, peer: Peer) -> None:
        while True:
            req = await peer.read_request()
            if req is None:
                return
            self.received.append(req)
            if req.target.startswith("/hold/"):
                self.held += 1
                await trio.sleep(LIMIT)
                return
            await peer.respond(Reply(200, [("Content-Type", "application/json")], b'{"ok":true}'))

    def count(self, what: str) -> Counter[str]:
        """Requests by idempotency key (``key``) or by path (``target``)."""
        if what == "key":
            return Counter(r.header("Idempotency-Key") or "" for r in self.received)
        return Counter(r.target for r in self.received)


@asynccontextmanager
async def daemons(
    tmp: Path,
    url: str,
    remote_url: str,
    token: str,
    n: int = DAEMONS,
    reconnect: float = 10,
    total: float = 4,
) -> AsyncIterator[list[DaemonProc]]:
    BrokerKey.create(tmp / "shared.key")  # the sealing key every broker holds
    targets = api_target(
        remote_url,
        methods=["GET", "POST"],
        idempotent=["GET"],
        idempotency=IDEM,
        timeout={"connect": 2, "total": total},
    )
    procs: list[DaemonProc] = []
    try:
        for i in range(n):
            # Hundreds of calls from one uid in seconds: the per-uid call rate out of the way.
            service = {
                "max_calls": 1024,
                "lease_margin": 1,
                "call_rate": 100000,
                "call_burst": 100000,
            }
            d = await start_sharing(tmp, f"d{i}", url, targets, token, service, reconnect=reconnect)
            procs.append(d)
        yield procs
    finally:
        for p in procs:
            stop(p)


def _public_keys(procs: list[DaemonProc]) -> list[bytes]:
    return [SigningKey.load(p.config.parent / "signing.key").public_raw for p in procs]


def _post(n: int, key: str | None = None, path: str = "/v1/items") -> dict[str, Any]:
    action: dict[str, Any] = {
        "target": "api",
        "method": "POST",
        "path": path,
        "body": json.dumps({"n": n}),
        "headers": {"Content-Type": "application/json"},
    }
    if key is not None:
        action["idempotency_key"] = key
    return action


async def test_four_daemons_share_one_journal_and_fence_a_killed_ones_calls(
    pg: Cluster, pg_url: str, tmp_path: Path, token: str
) -> None:
    remote = Remote()
    async with (
        HostileServer.running(remote.script) as srv,
        daemons(tmp_path, pg_url, srv.url, token) as procs,
    ):
        clients = [Client(p.socket) for p in procs]
        envelopes: dict[int, dict[str, Any]] = {}
        pairs: dict[str, list[dict[str, Any]]] = {}
        limiter = trio.CapacityLimiter(CLIENTS)

        async def plain(n: int) -> None:
            async with limiter:
                envelopes[n] = await clients[n % DAEMONS].call(_post(n))

        async def keyed(k: int) -> None:
            # The same key and body to two daemons at the same moment.
            key = f"key-{k}"
            got: list[dict[str, Any]] = []

            async def one(d: int) -> None:
                got.append(await clients[d].call(_post(10_000 + k, key)))

            async with limiter, trio.open_nursery() as both:
                both.start_soon(one, k % DAEMONS)
                both.start_soon(one, (k + 1) % DAEMONS)
            pairs[key] = got

        with trio.fail_after(LIMIT):
            async with trio.open_nursery() as nursery:
                for n in range(CALLS - 2 * KEYED):
                    nursery.start_soon(plain, n)
                for k in range(KEYED):
                    nursery.start_soon(keyed, k)

        # Every plain call: one envelope, committed, its request received exactly once.
        assert len(envelopes) == CALLS - 2 * KEYED
        bad = [e for e in envelopes.values() if "api_error" in e or "error" in e]
        assert bad == [], bad[:3]
        by_body = Counter(json.loads(r.body)["n"] for r in remote.received)
        assert all(by_body[n] == 1 for n in envelopes), "a plain call was sent twice or never"
        # Every key sent twice at once: one invocation, one dispatch.
        keys = remote.count("key")
        for key, got in pairs.items():
            assert len(got) == 2 and keys[key] == 1, (key, keys[key], got)
            assert len({e["invocation_id"] for e in got}) == 1, got
            assert any("result" in e for e in got), got  # the other: IN_PROGRESS or the same
        invocations = {e["invocation_id"] for e in envelopes.values()}
        invocations |= {got[0]["invocation_id"] for got in pairs.values()}
        assert len(invocations) == CALLS - KEYED

        # -- one daemon dies while its calls are dispatched and held ---------------------------
        victim, other = procs[0], clients[1]
        held_keys = [f"held-{i}" for i in range(5)]
        async with trio.open_nursery() as callers:
            for i, key in enumerate(held_keys):
                callers.start_soon(
                    _call_ignoring_loss, clients[0], _post(20_000 + i, key, f"/hold/{i}")
                )
            await wait_until(lambda: remote.held == len(held_keys), "held calls dispatched")
            os.kill(victim.proc.pid, signal.SIGKILL)
            victim.proc.wait(timeout=30)
            callers.cancel_scope.cancel()
        with JournalReader.open(pg_url) as r:
            held = [rec for rec in r.list_actions() if rec.idempotency
                    and rec.idempotency.get("key") in held_keys]  # fmt: skip
        assert len(held) == len(held_keys)
        assert all(rec.evidence["dispatch_started"] and not rec.final for rec in held)
        # Another daemon, the same key at once: its lease is the dead one's until it runs out,
        # so it is answered from the record and nothing is sent.
        sent_before = len(remote.received)
        first = await other.call(_post(20_000, held_keys[0], "/hold/0"))
        assert first["error"]["outcome"] == "unknown", first
        assert len(remote.received) == sent_before
        # After the lease (timeout 4 s + margin 1 s): closed as unknown (never not_attempted),
        # and a same-key retry runs under a new generation.
        await trio.sleep(5.5)
        retry = await other.call(_post(20_001, held_keys[1], "/hold/1"))
        rec1 = await other.record(retry["invocation_id"])
        assert rec1 is not None and rec1["generation"] == 1, rec1
        kinds = [e["kind"] for e in await other.events(retry["invocation_id"])]
        assert "ATTEMPT_INTERRUPTED" in kinds and "RETRY_LEASE_ACQUIRED" in kinds
        assert len(remote.received) == sent_before + 1  # exactly the retry was sent
        # A caller is shown the dead daemon's holder as a keyed tag, never its host and pid:
        # the recorded one is the operator's (the journal read here).
        shown = (await other.events(retry["invocation_id"]))[0]["attrs"]["holder"]
        with JournalReader.open(pg_url) as r:
            dead = r.events(retry["invocation_id"])[0].attrs["holder"]
        # The dead daemon's generation 0 is stale: a DISPATCH_STARTED under it is refused in
        # the same transaction that checks the lease (as if it had only been paused).
        async with Journal.open(
            pg_url, key_file=tmp_path / "shared.key", signing_key=tmp_path / "x.key"
        ) as j:
            assert shown != dead and shown == j.holder_tag(retry["invocation_id"], dead)
            with pytest.raises((LeaseLost, ImpossibleEvent)):
                await j.append(
                    Event(EventKind.DISPATCH_STARTED, retry["invocation_id"], {"attempt": 9}),
                    lease=(dead, 0),
                )
        for c in clients:
            await c.aclose()
    with JournalReader.open(pg_url) as r:
        report = r.verify(public_keys=[*_public_keys(procs), _x_key(tmp_path)])
        assert report.ok, report
        unknown = [rec for rec in r.list_actions() if rec.idempotency
                   and rec.idempotency.get("key") in held_keys[2:]]  # fmt: skip
        assert all(rec.evidence["dispatch_started"] for rec in unknown)
        assert all(rec.outcome.value != "not_attempted" for rec in unknown)


def _x_key(tmp: Path) -> bytes:
    return SigningKey.load(tmp / "x.key").public_raw


async def _call_ignoring_loss(client: Client, action: dict[str, Any]) -> None:
    """A caller of the daemon about to be killed: its answer never comes."""
    from affidavit.api.wire import ClientError

    with contextlib.suppress(ClientError):
        await client.call(action)


@pytest.mark.parametrize("outage", ["restart", "stop-3s"])
async def test_postgresql_restarted_mid_run_loses_nothing_and_misclassifies_nothing(
    pg: Cluster, pg_url: str, tmp_path: Path, token: str, outage: str
) -> None:
    """Calls keep coming while PostgreSQL goes away: ``pg_ctl restart -m fast`` (every session
    ended; back within the brokers' reconnect window, so callers see nothing of it), or a stop
    three times longer than that window (``[journal] reconnect = 1``).  Each call either gets
    its envelope -- and the journal, read afterwards, holds exactly that outcome -- or fails
    without one (503 JOURNAL_UNAVAILABLE).  Once leases have run out and the records are
    recovered: no record says not_attempted for a request the remote received, every request
    the remote received has a durable DISPATCH_STARTED, nothing the remote never received is
    claimed committed, nothing is sent twice, and the chain verifies."""
    remote = Remote()
    answers: dict[int, dict[str, Any]] = {}
    calls = 240
    window = 10.0 if outage == "restart" else 1.0  # [journal] reconnect
    total = max(window, 4.0)  # each call's own timeout
    async with (
        HostileServer.running(remote.script) as srv,
        # A restart must be invisible within the window (10 s) to calls whose own timeout lasts
        # as long (on a loaded machine ``pg_ctl restart`` can outlast a 4 s call); the stop
        # outlasts its 1 s.
        daemons(tmp_path, pg_url, srv.url, token, n=2, reconnect=window, total=total) as procs,
    ):
        clients = [Client(p.socket) for p in procs]
        limiter = trio.CapacityLimiter(16)
        done = trio.Event()

        async def one(n: int) -> None:
            async with limiter:
                try:
                    answers[n] = await clients[n % 2].call(_post(n, path=f"/slow/{n}"))
                except ApiError as exc:
                    answers[n] = {"api_error": {"code": exc.code, "message": exc.message}}

        async def go_away() -> None:
            await wait_until(lambda: len(answers) >= 40, "calls before the outage", LIMIT)
            if outage == "restart":
                await trio.to_thread.run_sync(pg.restart)
            else:
                await trio.to_thread.run_sync(pg.stop)
                await trio.sleep(3)
                await trio.to_thread.run_sync(pg.start)
            done.set()

        with trio.fail_after(LIMIT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(go_away)
                for n in range(calls):
                    nursery.start_soon(one, n)
        assert done.is_set()
        # Leases run out (the call's timeout + margin 1 s, from an acceptance before now: total
        # + 1.5 s); then every open record is recovered by a read through a daemon, with what
        # it proves.  A restart within the window leaves every call answered and nothing open:
        # no wait (before, 11.5 s for nothing).
        with JournalReader.open(pg_url) as r:
            still_open = [rec for rec in r.list_actions() if not rec.final]
        if outage == "restart":
            assert still_open == [], still_open
        else:
            await trio.sleep(total + 1.5)
        with JournalReader.open(pg_url) as r:
            open_ids = [rec.invocation_id for rec in r.list_actions() if not rec.final]
        for iid in open_ids:
            await clients[0].fetch_result(iid)
        for c in clients:
            await c.aclose()
    received = Counter(json.loads(r.body)["n"] for r in remote.received)
    assert max(received.values()) == 1  # nothing was sent twice
    with JournalReader.open(pg_url, key_file=tmp_path / "shared.key") as r:
        assert r.verify(public_keys=_public_keys(procs)).ok
        records = {rec.invocation_id: rec for rec in r.list_actions()}
        by_n = {}
        for rec in records.values():
            payload = r.payload(r.events(rec.invocation_id)[0].seq)
            assert payload is not None
            by_n[json.loads(payload["action"]["body"])["n"]] = rec
    assert len(answers) == calls
    kinds = Counter(_answer_kind(a) for a in answers.values())
    if outage == "restart":
        # Within the reconnect window: invisible (the answers that are not results, if any).
        assert kinds == {"result": calls}, [a for a in answers.values() if "result" not in a]
    else:
        assert kinds["JOURNAL_UNAVAILABLE"] > 0 and kinds["result"] > 0, kinds
    for n, answer in answers.items():
        rec = by_n.get(n)
        if "api_error" in answer:
            # It names its invocation when one was begun; the journal then says the rest.
            iid = answer["api_error"]["message"].split("(", 1)[-1].split(":", 1)[0]
            assert rec is None or rec.invocation_id == iid, (answer, rec)
        if "invocation_id" in answer:
            assert rec is not None and rec.invocation_id == answer["invocation_id"]
            if "result" in answer:
                assert rec.outcome.value == "committed"  # an envelope's claim is durable
        if rec is None:
            assert not received[n], n  # sent without a durable record: never
            continue
        assert rec.final, rec
        if received[n]:
            assert rec.evidence["dispatch_started"], rec
            assert rec.outcome.value in ("committed", "unknown"), rec
        else:
            assert rec.outcome.value != "committed", rec


def _answer_kind(answer: dict[str, Any]) -> str:
    if "result" in answer:
        return "result"
    if "api_error" in answer:
        return str(answer["api_error"]["code"])
    return str(answer["error"]["code"])
