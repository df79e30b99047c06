"""Brokers on a shared PostgreSQL journal whose clocks disagree with the database's: leases
are recorded and judged in the database's time (docs/journal.md, "Clocks"), while each broker
times its own attempt by its own clock.

Generation 0 has no lease row: its deadline is ACTION_ACCEPTED's ``lease_expires_at``, written
by the accepting broker.  Written by that broker's own clock, an hour behind, it was already
past in database time -- the clock recovery judges it by (``leases.check_lapsed``) -- and
broker B's ``fetch_result`` closed A's attempt while A was mid-redirect: a same-key retry could
then have sent the request again.  The journal records it in database time instead
(``Txn.lease_offset``): B answers the record in progress, A sends its next hop and finishes.

A retry's lease is recorded in database time too; its holder compared that expiry with its own
clock (``run_tries``): an hour ahead, every retry was refused LEASE_LOST; an hour behind, the
retry's deadline was no longer bounded by its lease, and it was still in flight when another
broker could take the invocation over.  It ends within ``held_until`` (its own clock) now.
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

import affidavit.engine.approval as approval
import affidavit.engine.attempt as attempt
import affidavit.engine.invocation as invocation
from affidavit import approvals
from affidavit.api.broker import Broker
from affidavit.api.wire import SOCKET_ENV
from affidavit.cli import approvals as cli_approvals
from affidavit.config import load_config
from affidavit.console import pages
from affidavit.engine import EngineSettings
from affidavit.protocols.actions import fingerprint, parse_action
from affidavit.statemachine import Code
from affidavit.statemachine import EventKind as E
from tests.http.hostile import HostileServer, Peer, Reply, Script

from .approvalkit import OPS
from .helpers import http_target, stalled_call, write_config
from .http_rows import IDEM

LIMIT = 30  # seconds: the bound on the scenario
BEHIND = 3600.0
HOP = {"target": "api", "method": "POST", "path": "/v1/x", "idempotency_key": "behind"}


class _Behind:
    """Broker A's host clock: an hour behind the database's (and B's)."""

    @staticmethod
    def time() -> float:
        return time.time() - BEHIND


class _Ahead:
    """Broker A's host clock: an hour ahead of the database's (and B's)."""

    @staticmethod
    def time() -> float:
        return time.time() + BEHIND


def _redirecting() -> Script:
    """``POST /v1/x`` answers 307 to ``/landing``, which answers 201."""

    async def script(peer: Peer) -> None:
        while True:
            req = await peer.read_request()
            if req is None:
                return
            if req.target.startswith("/landing"):
                await peer.respond(Reply(201, body=b'{"hop": 2}'))
            else:
                await peer.respond(Reply(307, headers=[("Location", "/landing")], body=b"moved"))

    return script


@asynccontextmanager
async def _brokers(
    tmp: Path,
    url: str,
    pg_url: str,
    monkeypatch: pytest.MonkeyPatch,
    clock: type[_Behind | _Ahead] = _Behind,
    margin: float = 0.0,
    approve: str | dict[str, str] | None = None,
) -> AsyncIterator[tuple[Broker, Broker]]:
    """``approve``: the target's approval policy (``OPS`` decides)."""
    # A day's retention: a key bound by A's clock is still usable by the real one.
    idem = {**IDEM, "retention": "1d"}
    target = http_target(url, idempotency=idem, follow_redirects=True, approval=approve)
    cfg = []
    for n in "ab":
        journal = {"url": pg_url, "key_file": str(tmp / "k"), "signing_key": str(tmp / n)}
        path = write_config(tmp, {"api": target}, journal=journal, name=f"{n}.toml")
        with path.open("a", encoding="utf-8") as f:
            f.write(f"[service]\noperator_uids = [{OPS.uid}]\n")
        cfg.append(load_config(path))
    settings = EngineSettings(lease_margin=margin)
    async with (
        Broker.open(config=cfg[0], settings=settings, holder="worker-A") as a,
        Broker.open(config=cfg[1], settings=settings, holder="worker-B") as b,
    ):
        # A's host clock, as its engine and its journal's writer read it; B reads the real one
        # (B runs only recovery here, in modules not patched).
        monkeypatch.setattr(a.journal._writer, "clock", clock.time)
        monkeypatch.setattr(a.journal, "_clock", clock.time)
        for module in (invocation, attempt, approval):
            monkeypatch.setattr(module, "time", clock)
        yield a, b


async def test_a_clock_behind_does_not_get_its_live_first_attempt_closed(
    tmp_path: Path, pg_url: str, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with (
        HostileServer.running(_redirecting()) as srv,
        _brokers(tmp_path, srv.url, pg_url, monkeypatch) as (a, b),
    ):
        # A sent its first hop and is stopped mid-redirect:
        async with stalled_call(a, HOP, limit=LIMIT, hop=2) as stalled:
            (action,) = b.journal.list_actions()
            iid = action.invocation_id
            seen = await b.fetch_result(iid)  # B's recovery looks at A's attempt
            assert seen is not None and seen["evidence"]["state"] == "dispatched", seen
        events = b.events(iid)
    (accepted,) = [e for e in events if e.kind is E.ACTION_ACCEPTED]
    # The deadline every broker judges by: the database's time, not A's.
    assert accepted.attrs["lease_expires_at"] > time.time(), accepted.attrs
    assert [r.target for r in srv.requests] == ["/v1/x", "/landing"]
    kinds = [e.kind for e in events]
    assert E.ATTEMPT_INTERRUPTED not in kinds and E.LEASE_LOST not in kinds, kinds
    assert stalled.envelope is not None
    assert "error" not in stalled.envelope, stalled.envelope


def _dropping_first() -> tuple[Script, list[str]]:
    """``POST /v1/x``: the first closed unanswered (the invocation is unknown: a same-key retry
    follows); each later one held until the server's ``release`` event, then answered 201.
    The list collects what was answered."""
    answered: list[str] = []

    async def script(peer: Peer) -> None:
        while True:
            req = await peer.read_request()
            if req is None:
                return
            if peer.index == 0:
                await peer.close()
                return
            peer.server.event("retry_received").set()
            await peer.server.event("release").wait()
            answered.append(req.target)
            await peer.respond(Reply(201, body=b'{"ok": true}'))

    return script, answered


CHARGE = {"target": "api", "method": "POST", "path": "/v1/x", "idempotency_key": "charge"}


async def test_a_clock_ahead_still_retries_under_its_lease(
    tmp_path: Path, pg_url: str, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A's retry lease ends (database time) an hour before A's clock: compared so, A refused
    # its own fresh lease -- LEASE_LOST, nothing sent, for every retry it ever took.
    script, answered = _dropping_first()
    async with (
        HostileServer.running(script) as srv,
        _brokers(tmp_path, srv.url, pg_url, monkeypatch, _Ahead) as (a, _b),
    ):
        srv.event("release").set()
        with trio.fail_after(LIMIT):
            first = await a.call(CHARGE)
            assert first["error"]["outcome"] == "unknown", first
            retry = await a.call(CHARGE)
    assert "error" not in retry, retry
    assert answered == ["/v1/x"]


async def test_a_clock_behind_ends_its_retry_within_its_lease(
    tmp_path: Path, pg_url: str, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A's retry is slow before its dispatch (longer than the margin, within the lease): its
    # attempt must end by its lease's end less the margin.  Compared with A's clock, an hour
    # behind, the database-time expiry bounded nothing: the retry ran its whole timeout and was
    # still in flight when its lease ran out -- when another broker may take it over and send.
    script, _answered = _dropping_first()
    timeout, margin = 2.0, 1.0  # the retry's lease: 3 s
    async with (
        HostileServer.running(script) as srv,
        _brokers(tmp_path, srv.url, pg_url, monkeypatch, _Behind, margin) as (a, b),
    ):
        first = await a.call(CHARGE, timeout=timeout)
        assert first["error"]["outcome"] == "unknown", first
        iid = first["invocation_id"]
        recorder = a._engine.recorder
        real_write_many = recorder.write_many

        async def slow_write_many(items: Any, **kw: Any) -> None:
            await real_write_many(items, **kw)
            if any(ev.kind is E.CREDENTIAL_AUTHORIZED for ev, _ in items):
                with trio.CancelScope(shield=True):
                    await trio.sleep(margin * 1.5)  # a slow preflight

        monkeypatch.setattr(recorder, "write_many", slow_write_many)
        out: dict[str, Any] = {}

        async def retry() -> None:
            out["a"] = await a.call(CHARGE, timeout=timeout)

        with trio.fail_after(LIMIT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(retry)
                await srv.event("retry_received").wait()  # dispatched under a valid lease
                (lease,) = [e for e in b.events(iid) if e.kind is E.RETRY_LEASE_ACQUIRED]
                while time.time() <= lease.attrs["expires_at"]:  # bounded: a 3 s lease
                    await trio.sleep(0.02)
                ended_in_time = "a" in out
                srv.event("release").set()
    assert ended_in_time, "the retry was still in flight when its lease ran out"


async def test_a_clock_ahead_dispatches_an_approved_request(
    tmp_path: Path, pg_url: str, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The dispatch lease of an approved request, as a retry's: compared with A's clock an hour
    # ahead, its database-time expiry had passed -- LEASE_LOST, the approved request never sent.
    script, answered = _dropping_first()
    async with (
        HostileServer.running(script) as srv,
        _brokers(tmp_path, srv.url, pg_url, monkeypatch, _Ahead, approve="always") as (a, _b),
    ):
        srv.event("release").set()
        with trio.fail_after(LIMIT):
            pending = await a.call({**CHARGE, "idempotency_key": "approved"})
            assert pending["error"]["code"] == "APPROVAL_PENDING", pending
            iid = pending["invocation_id"]
            await a.approve(iid, operator=OPS)
            first = await a.dispatch_approved(iid)  # the first POST is dropped: unknown
            assert first is not None and first["error"]["outcome"] == "unknown", first
            sent = await a.call({**CHARGE, "idempotency_key": "approved"})  # its same-key retry
    assert "error" not in sent, sent
    assert answered == ["/v1/x"]


async def test_a_clock_ahead_approves_and_sends_a_request_still_within_its_window(
    tmp_path: Path, pg_url: str, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # B (the database's clock) asks for approval; A, an hour ahead, decides and dispatches.
    # Judged by A's clock the 15-minute window had long run out: A recorded APPROVAL_EXPIRED
    # (the record claimed an expiry that had not happened) and the request was never sent.
    script, _answered = _dropping_first()
    approve = {"ttl": "15m"}
    async with (
        HostileServer.running(script) as srv,
        _brokers(tmp_path, srv.url, pg_url, monkeypatch, _Ahead, approve=approve) as (a, b),
    ):
        srv.event("release").set()
        with trio.fail_after(LIMIT):
            # B's request, by the real clock (the engine's modules are A's clock: one process).
            monkeypatch.setattr(approval, "time", time)
            pending = await b.call({**CHARGE, "idempotency_key": "window"})
            assert pending["error"]["code"] == "APPROVAL_PENDING", pending
            monkeypatch.setattr(approval, "time", _Ahead)
            iid = pending["invocation_id"]
            decided = await a.approve(iid, operator=OPS)
            assert decided["approval"] == "granted", decided
            approval.watch(a._engine)  # A's dispatcher learns of B's request, as at its start
            assert await a.approvals_ready() == [iid]
            sent = await a.dispatch_approved(iid)  # the first POST is dropped: unknown
        kinds = [e.kind for e in b.events(iid)]
    assert sent is not None and sent["error"]["outcome"] == "unknown", sent
    assert E.DISPATCH_STARTED in kinds and E.PREFLIGHT_FAILED not in kinds, kinds


async def test_an_approval_asked_by_a_clock_ahead_expires_by_the_database_clock(
    tmp_path: Path, pg_url: str, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A, an hour ahead, asks for a 1-second approval.  Recorded by A's clock its expiry lay an
    # hour later for every other broker: B granted it and sent it long after it expired.
    script, _answered = _dropping_first()
    async with (
        HostileServer.running(script) as srv,
        _brokers(tmp_path, srv.url, pg_url, monkeypatch, _Ahead, approve={"ttl": "1s"}) as (a, b),
    ):
        srv.event("release").set()
        with trio.fail_after(LIMIT):
            pending = await a.call({**CHARGE, "idempotency_key": "short"})
            assert pending["error"]["code"] == "APPROVAL_PENDING", pending
            iid = pending["invocation_id"]
            (requested,) = [e for e in b.events(iid) if e.kind is E.APPROVAL_REQUESTED]
            assert requested.attrs["expires_at"] < time.time() + 60, requested.attrs
            await trio.sleep(1.2)
            with pytest.raises(Exception, match="approval window ran out"):
                await b.approve(iid, operator=OPS)
        record = b.journal.record(iid)
    assert srv.requests == []
    assert record is not None and record.code is Code.APPROVAL_EXPIRED, record


@pytest.mark.parametrize("clock", [_Behind, _Ahead])
async def test_a_key_just_bound_is_not_taken_over_across_clocks(
    tmp_path: Path,
    pg_url: str,
    token: str,
    monkeypatch: pytest.MonkeyPatch,
    clock: type[_Behind | _Ahead],
) -> None:
    # A key has just been bound and nothing recorded yet (its binder is writing its first
    # events); another broker calls with the same key.  _Behind: A, an hour behind, binds and
    # B takes: the row said bound an hour ago.  _Ahead: B binds and A, an hour ahead, takes:
    # A compared the row with its own clock.  Either way the invocation was taken over and
    # sent while its binder was about to send it.
    script, answered = _dropping_first()
    async with (
        HostileServer.running(script) as srv,
        _brokers(tmp_path, srv.url, pg_url, monkeypatch, clock) as (a, b),
    ):
        binder, taker = (a, b) if clock is _Behind else (b, a)
        srv.event("release").set()
        cfg = a._engine.config
        target = cfg.targets["api"]
        fp = fingerprint(parse_action(CHARGE, cfg), target, a._engine.snapshot.hash(target))
        with trio.fail_after(LIMIT):
            bound = await binder.journal.bind_idempotency(
                IDEM["scope"], "charge", fp, "act_bound", None
            )
            assert abs(bound.created_at - time.time()) < 60, bound  # the database's time
            seen = await taker.call(CHARGE)
    assert seen["error"]["code"] == "IN_PROGRESS", seen
    assert seen["invocation_id"] == "act_bound", seen
    assert srv.requests == [] and answered == []


async def test_an_approval_s_time_left_is_shown_by_the_database_clock(
    tmp_path: Path,
    pg_url: str,
    token: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # B (the database's clock) asks for a 15-minute approval; the operator's tools run on A's
    # host, an hour ahead.  The view said ``expired: false`` (the database's clock) while
    # ``affidavit approvals`` printed "expired" and the console "0 s" left (A's own clock).
    script, _answered = _dropping_first()
    async with (
        HostileServer.running(script) as srv,
        _brokers(tmp_path, srv.url, pg_url, monkeypatch, _Ahead, approve={"ttl": "15m"}) as (a, b),
    ):
        with trio.fail_after(LIMIT):
            monkeypatch.setattr(approval, "time", time)
            pending = await b.call({**CHARGE, "idempotency_key": "shown"})
            assert pending["error"]["code"] == "APPROVAL_PENDING", pending
        monkeypatch.setattr(cli_approvals, "_reading", lambda *_: [row])
        monkeypatch.delenv(SOCKET_ENV, raising=False)
        listing = argparse.Namespace(config=None, json=False, socket=None)
        real = time.time
        with monkeypatch.context() as m:
            m.setattr(time, "time", lambda: real() + BEHIND)  # this host's clock
            (row,) = approvals.pending(a.journal)
            assert row["expired"] is False and 800 < row["expires_in"] <= 900, row
            assert cli_approvals._list(listing) == 0
            (shown,) = pages.approvals_page(a.journal)["rows"]
    line = capsys.readouterr().out.splitlines()[1]
    assert "expired" not in line and re.search(r" (8\d\d|900)s ", line), line
    assert 800 < shown["left"] <= 900, shown
