"""Leases on a shared PostgreSQL journal are judged by one clock -- the database's: a broker on
a host whose clock runs far ahead (its journal's injected ``clock``) must neither take over nor
close another broker's live attempt (two brokers both sending it: the double send the project
exists to prevent), while a lease that really ran out is still taken over and closed."""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.journal import Journal, LeaseBusy
from affidavit.journal.postgres import PostgresTables
from affidavit.journal.txn import Txn
from affidavit.statemachine import Event
from affidavit.statemachine import EventKind as E

from .helpers import interrupted, until_dispatch

AHEAD = 3600.0


def _skewed() -> float:
    return time.time() + AHEAD


def _keys(tmp: Path, name: str) -> dict[str, Path]:
    return {"key_file": tmp / "shared.key", "signing_key": tmp / f"{name}.signing.key"}


def _closing(iid: str) -> Event:
    return Event(E.ATTEMPT_INTERRUPTED, iid, {"code": "REMOTE_OUTCOME_UNKNOWN", "generation": 1})


async def test_a_clock_running_ahead_neither_takes_over_nor_closes_a_live_lease(
    pg_url: str, tmp_path: Path
) -> None:
    async with (
        Journal.open(pg_url, **_keys(tmp_path, "a")) as a,
        Journal.open(pg_url, clock=_skewed, **_keys(tmp_path, "b")) as b,
    ):
        for ev in interrupted("inv-1"):
            await a.append(ev)
        lease = await a.acquire_lease("inv-1", "broker-a", ttl=60)
        assert lease.expires_at < time.time() + 61  # the database's clock, not a skewed one
        await a.append(Event(E.DISPATCH_STARTED, "inv-1", {"attempt": 2, "generation": 1}))
        # B's clock says A's lease ran out an hour ago: the journal says it did not.
        with pytest.raises(LeaseBusy):
            await b.acquire_lease("inv-1", "broker-b", ttl=60)
        with pytest.raises(LeaseBusy):
            await b.append(_closing("inv-1"), barrier=True, lapsed=True, deadline=None)
        record = b.record("inv-1")
        assert record is not None and record.state == "dispatched" and record.generation == 1
        # A still holds its lease: its own writes under it go on.
        await a.append(Event(E.REQUEST_SENT, "inv-1", {"generation": 1}), lease=("broker-a", 1))


async def test_a_skewed_holder_keeps_its_lease_by_the_database_clock(
    pg_url: str, tmp_path: Path
) -> None:
    """The holder's own clock running ahead: it does not lose the lease it just took."""
    async with Journal.open(pg_url, clock=_skewed, **_keys(tmp_path, "b")) as b:
        for ev in interrupted("inv-1"):
            await b.append(ev)
        await b.acquire_lease("inv-1", "broker-b", ttl=60)
        await b.append(
            Event(E.DISPATCH_STARTED, "inv-1", {"attempt": 2, "generation": 1}),
            lease=("broker-b", 1),
        )


async def test_the_first_attempt_deadline_is_judged_by_the_database_clock(
    pg_url: str, tmp_path: Path
) -> None:
    """Generation 0 has no lease row: its deadline is ACTION_ACCEPTED's, compared with the
    database's clock when a recovery closes it."""
    async with (
        Journal.open(pg_url, **_keys(tmp_path, "a")) as a,
        Journal.open(pg_url, clock=_skewed, **_keys(tmp_path, "b")) as b,
    ):
        for ev in until_dispatch("inv-1"):
            await a.append(ev)
        closing = Event(E.ATTEMPT_INTERRUPTED, "inv-1", {"code": "REMOTE_OUTCOME_UNKNOWN"})
        with pytest.raises(LeaseBusy):
            await b.append(closing, barrier=True, lapsed=True, deadline=time.time() + 60)
        await b.append(closing, barrier=True, lapsed=True, deadline=time.time() - 1)
        record = b.record("inv-1")
        assert record is not None and record.state == "interrupted"


async def test_an_expired_lease_is_still_taken_over_and_closed(pg_url: str, tmp_path: Path) -> None:
    async with (
        Journal.open(pg_url, **_keys(tmp_path, "a")) as a,
        Journal.open(pg_url, clock=_skewed, **_keys(tmp_path, "b")) as b,
    ):
        for iid in ("inv-1", "inv-2"):
            for ev in interrupted(iid):
                await a.append(ev)
            await a.acquire_lease(iid, "broker-a", ttl=0.2)
        await trio.sleep(0.4)
        taken = await b.acquire_lease("inv-1", "broker-b", ttl=60)
        assert (taken.holder, taken.generation) == ("broker-b", 2)
        # Its holder stopped before dispatching (retry_pending): SETUP_FAILED closes it.
        setup = {"code": "SETUP_FAILED", "stage": "broker_stopped", "generation": 1}
        closing = Event(E.SETUP_FAILED, "inv-2", setup)
        await b.append(closing, barrier=True, lapsed=True, deadline=None)
        record = b.record("inv-2")
        assert record is not None and record.final


BEHIND = 3600.0


def _behind() -> float:
    return time.time() - BEHIND


def _first_attempt(iid: str, deadline: float) -> list[Event]:
    """Generation 0 up to its dispatch, its deadline (``lease_expires_at``) as the engine
    writes it: by its own broker's clock."""
    first, *rest = until_dispatch(iid)
    accepted = Event(first.kind, iid, {**first.attrs, "holder": "w1", "lease_expires_at": deadline})
    return [accepted, *rest]


def _recorded_deadline(j: Journal, iid: str) -> float:
    """Generation 0's deadline as a recovery reads it (``recover_stale``)."""
    (accepted,) = [e for e in j.events(iid) if e.kind is E.ACTION_ACCEPTED]
    return float(accepted.attrs["lease_expires_at"])


async def test_a_clock_running_behind_records_the_first_deadline_in_database_time(
    pg_url: str, tmp_path: Path
) -> None:
    """Broker A's clock runs an hour behind and its first attempt is on the wire: its
    ACTION_ACCEPTED deadline is recorded in the database's time, so B's recovery closes
    nothing (LeaseBusy) until that deadline really passes -- then it closes it."""
    async with (
        Journal.open(pg_url, clock=_behind, **_keys(tmp_path, "a")) as a,
        Journal.open(pg_url, **_keys(tmp_path, "b")) as b,
    ):
        for ev in _first_attempt("inv-1", _behind() + 1.5):
            await a.append(ev)
        deadline = _recorded_deadline(b, "inv-1")
        closing = Event(E.ATTEMPT_INTERRUPTED, "inv-1", {"code": "REMOTE_OUTCOME_UNKNOWN"})
        with pytest.raises(LeaseBusy):
            await b.append(closing, barrier=True, lapsed=True, deadline=deadline)
        assert time.time() + 1 < deadline < time.time() + 2  # the same instant, database time
        record = b.record("inv-1")
        assert record is not None and record.state == "dispatched"
        with trio.fail_after(10):
            while time.time() <= deadline + 0.05:  # bounded: the deadline is 1.5 s away
                await trio.sleep(0.05)
        await b.append(closing, barrier=True, lapsed=True, deadline=deadline)
        record = b.record("inv-1")
        assert record is not None and record.state == "interrupted"


async def test_a_group_commit_of_first_dispatches_reads_the_database_clock_once(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every first attempt's gate judges its deadline by the database's clock, in the writing
    transaction -- read once per transaction (``leases.gate_now``: the writer's clock plus the
    transaction's offset), not once per gate: N dispatches committed together cost one
    ``SELECT clock_timestamp()`` while they hold the chain head, not N."""
    n = 8
    async with Journal.open(pg_url, **_keys(tmp_path, "a")) as j:
        for i in range(n):
            for ev in _first_attempt(f"inv-{i}", time.time() + 60)[:3]:
                await j.append(ev)
        reads: list[int] = []
        txns: list[int] = []
        read_clock, start_txn = PostgresTables.lease_now, Txn.__init__

        def counted_read(self: PostgresTables) -> float | None:
            reads.append(1)
            return read_clock(self)

        def counted_txn(self: Txn, *args: Any) -> None:
            txns.append(1)
            start_txn(self, *args)

        monkeypatch.setattr(PostgresTables, "lease_now", counted_read)
        monkeypatch.setattr(Txn, "__init__", counted_txn)
        async with trio.open_nursery() as nursery:
            for i in range(n):
                ev = Event(E.DISPATCH_STARTED, f"inv-{i}", {"attempt": 1})
                nursery.start_soon(functools.partial(j.append, ev, first_gate="w1"))
        monkeypatch.undo()
        assert 0 < len(txns) < n, txns  # the writer committed them together (else: no proof)
        assert len(reads) == len(txns), (len(reads), len(txns))
        for i in range(n):
            record = j.record(f"inv-{i}")
            assert record is not None and record.state == "dispatched"
