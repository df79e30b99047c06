"""Leases and idempotency records: records that outlive the process (issue 3, item 6; seed:
"Include competing workers and stale leases in the recovery tests")."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from affidavit.journal import (
    Batch,
    IdempotencyMismatch,
    Journal,
    JournalWriteError,
    LeaseBusy,
    LeaseLost,
)
from affidavit.statemachine import Event, ImpossibleEvent, Outcome
from affidavit.statemachine import EventKind as E

from ..helpers import accepted, interrupted, until_dispatch
from .conftest import Place, storage_fault

CHILD = Path(__file__).parent.parent / "child.py"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _stall(place: Place, clock: Clock, seconds: float) -> None:
    """``seconds`` pass for every lease: the journal's clock on SQLite; on PostgreSQL, which
    judges leases by the database's own clock, every stored lease is moved that much nearer
    its end instead."""
    clock.now += seconds
    if place.kind == "postgresql":
        place.tamper(f"UPDATE leases SET expires_at = expires_at - {seconds}")


def _lease_now(place: Place, clock: Clock) -> float:
    """Now by the clock leases are judged by (the database's on PostgreSQL)."""
    return time.time() if place.kind == "postgresql" else clock.now


async def _interrupted(j: Journal, iid: str = "inv-1") -> None:
    for ev in interrupted(iid):
        await j.append(ev)


async def test_the_first_attempt_deadline_is_recorded_by_the_lease_clock(place: Place) -> None:
    """ACTION_ACCEPTED's ``lease_expires_at`` (generation 0's deadline, by its broker's clock)
    is recorded as the same instant by the clock leases are judged by: unchanged on SQLite
    (the journal's clock is that clock); on PostgreSQL moved into the database's time, and
    the event stays chained (``verify``).  Events without it are written as given."""
    clock = Clock()
    async with place.open(clock=clock) as j:
        first = accepted("inv-1")
        await j.append(
            Event(first.kind, "inv-1", {**first.attrs, "lease_expires_at": clock.now + 30})
        )
        await j.append(accepted("inv-2"))
        (stored,) = j.events("inv-1")
        deadline = stored.attrs["lease_expires_at"]
        if place.kind == "sqlite":
            assert deadline == clock.now + 30
        else:
            assert abs(deadline - (_lease_now(place, clock) + 30)) < 5
        assert {k: v for k, v in stored.attrs.items() if k != "lease_expires_at"} == first.attrs
        assert "lease_expires_at" not in j.events("inv-2")[0].attrs
        assert j.verify().ok


async def test_acquiring_bumps_the_generation_and_records_it(place: Place) -> None:
    clock = Clock()
    async with place.open(clock=clock) as j:
        await _interrupted(j)
        lease = await j.acquire_lease("inv-1", "w1", ttl=10)
        assert (lease.generation, lease.holder) == (1, "w1")
        assert abs(lease.expires_at - (_lease_now(place, clock) + 10)) < 5
        assert j.lease("inv-1") == lease
        ev = j.events("inv-1")[-1]
        assert ev.kind is E.RETRY_LEASE_ACQUIRED and ev.attrs["generation"] == 1
        rec = j.record("inv-1")
        assert rec is not None and rec.generation == 1 and rec.budget.used == 2


async def test_an_unexpired_lease_of_another_holder_is_busy(place: Place) -> None:
    clock = Clock()
    async with place.open(clock=clock) as j:
        await _interrupted(j)
        await j.acquire_lease("inv-1", "w1", ttl=10)
        with pytest.raises(LeaseBusy) as info:
            await j.acquire_lease("inv-1", "w2", ttl=10)
        assert info.value.current.holder == "w1"
        _stall(place, clock, 10.5)
        # Expired: w2 takes it over with a higher generation.
        taken = await j.acquire_lease("inv-1", "w2", ttl=10)
        assert (taken.holder, taken.generation) == ("w2", 2)
        with pytest.raises(LeaseBusy):
            await j.acquire_lease("inv-1", "w1", ttl=10)


async def test_an_unexpired_retry_lease_is_busy_to_its_own_holder_too(place: Place) -> None:
    """A holder names a broker, not a task: two same-key retries of one broker must not both
    take the lease (each spending the budget, the first told LEASE_LOST at its gate)."""
    clock = Clock()
    async with place.open(clock=clock) as j:
        await _interrupted(j)
        first = await j.acquire_lease("inv-1", "w1", ttl=10)
        with pytest.raises(LeaseBusy) as info:
            await j.acquire_lease("inv-1", "w1", ttl=10)
        assert info.value.current == first
        assert j.lease("inv-1") == first
        rec = j.record("inv-1")
        assert rec is not None and rec.generation == 1 and rec.budget.used == 2


async def test_the_lease_of_an_attempt_that_is_over_keeps_no_one_out(place: Place) -> None:
    """w1's retry attempt was closed (here by recovery, as the daemon's start-up closes a dead
    broker's; a holder that answered closes it alike) while w1's lease still runs: nothing can
    be written under that lease any more, so w2 takes the next generation -- it used to be
    LeaseBusy, and the engine answered IN_PROGRESS ("has not finished") for a finished one."""
    clock = Clock()
    async with place.open(clock=clock) as j:
        await _interrupted(j)
        await j.acquire_lease("inv-1", "w1", ttl=10)
        with pytest.raises(LeaseBusy):  # open: w1's attempt may still dispatch
            await j.acquire_lease("inv-1", "w2", ttl=10)
        closing = {"code": "SETUP_FAILED", "stage": "broker_stopped", "generation": 1}
        await j.append(Event(E.SETUP_FAILED, "inv-1", closing))
        rec = j.record("inv-1")
        assert rec is not None and rec.final and rec.outcome is Outcome.UNKNOWN
        clock.now += 1  # w1's lease has 9 s left
        taken = await j.acquire_lease("inv-1", "w2", ttl=10)
        assert (taken.holder, taken.generation) == ("w2", 2)
        # w1 cannot come back: its lease is no longer the invocation's.
        with pytest.raises(LeaseLost):
            await j.append(Event(E.DISPATCH_STARTED, "inv-1"), lease=("w1", 1))


async def test_a_stale_generation_is_refused_before_dispatch(place: Place) -> None:
    clock = Clock()
    async with place.open(clock=clock) as j:
        await _interrupted(j)
        first = await j.acquire_lease("inv-1", "w1", ttl=5)
        _stall(place, clock, 6)  # w1 stalls past its lease
        with pytest.raises(LeaseLost) as info:
            await j.append(Event(E.DISPATCH_STARTED, "inv-1"), lease=("w1", first.generation))
        assert info.value.seq is not None
        lost = j.events("inv-1")[-1]
        assert lost.kind is E.LEASE_LOST and lost.attrs["generation"] == first.generation
        assert all(e.kind is not E.DISPATCH_STARTED for e in j.events("inv-1")[4:])
        # A live lease dispatches (the stalled one ran out: its holder takes the next).
        second = await j.acquire_lease("inv-1", "w1", ttl=5)
        assert second.generation == first.generation + 1
        with pytest.raises(LeaseLost):
            await j.append(Event(E.DISPATCH_STARTED, "inv-1"), lease=("w1", first.generation))
        ev = await j.append(Event(E.DISPATCH_STARTED, "inv-1"), lease=("w1", second.generation))
        assert ev.kind is E.DISPATCH_STARTED
        with pytest.raises(LeaseBusy):  # live: busy to its own holder's other tasks too
            await j.acquire_lease("inv-1", "w1", ttl=5)
        _stall(place, clock, 6)
        with pytest.raises(ImpossibleEvent):  # no retry lease while an attempt is in flight
            await j.acquire_lease("inv-1", "w1", ttl=5)


async def test_the_first_attempt_s_gate_is_refused_once_its_deadline_passed(place: Place) -> None:
    """Generation 0 has no lease row: its gate judges ACTION_ACCEPTED's ``lease_expires_at``
    (recorded in the lease clock) by that clock, in the writing transaction, as a retry's gate
    judges its row -- a DISPATCH_STARTED that waited for the writer past the deadline is
    refused (LEASE_LOST written), never sent while another worker may close the attempt."""
    clock = Clock()
    async with place.open(clock=clock) as j:
        await _first_attempts(j, clock, {"inv-1": -1.0, "inv-2": 60.0})
        with pytest.raises(LeaseLost) as info:
            await j.append(Event(E.DISPATCH_STARTED, "inv-1"), first_gate="w1")
        assert (info.value.generation, info.value.holder) == (0, "w1")
        kinds = [e.kind for e in j.events("inv-1")]
        assert E.DISPATCH_STARTED not in kinds and kinds[-1] is E.LEASE_LOST, kinds
        assert info.value.seq == j.events("inv-1")[-1].seq
        ev = await j.append(Event(E.DISPATCH_STARTED, "inv-2"), first_gate="w1")  # in time
        assert ev.kind is E.DISPATCH_STARTED
        with pytest.raises(ValueError, match="first_gate"):  # a retry's gate checks its row
            await j.append(Event(E.REQUEST_SENT, "inv-2"), lease=("w1", 1), first_gate="w1")


def _hop(iid: str, hop: int) -> Event:
    facts = {f"hop{hop}": {"hop": hop}}
    attrs = {"protocol": "http", "state": "hop_dispatch", "facts": facts, "generation": 0}
    return Event(E.PROTOCOL_OBSERVED, iid, attrs)


async def test_the_first_attempt_s_redirect_hop_is_gated_by_its_deadline(place: Place) -> None:
    """A redirect's next hop is a dispatch boundary of its own: on the first attempt (no lease
    row) its barrier is judged by ACTION_ACCEPTED's deadline as the first hop's was -- the
    gate says so (``first_gate``), not the event's kind.  Past it, nothing of the hop is
    written and LEASE_LOST says the attempt's first hop was sent."""
    clock = Clock()
    async with place.open(clock=clock) as j:
        await _first_attempts(j, clock, {"inv-1": -1.0, "inv-2": 60.0})
        for iid in ("inv-1", "inv-2"):
            # Sent before the deadline passed (no gate: the deadline is in the past already).
            await j.append(Event(E.DISPATCH_STARTED, iid, {"generation": 0}))
            await j.append(Event(E.REQUEST_SENT, iid))
        with pytest.raises(LeaseLost) as info:
            await j.append(_hop("inv-1", 2), barrier=True, first_gate="w1")
        assert (info.value.generation, info.value.holder) == (0, "w1")
        last = j.events("inv-1")[-1]
        assert last.kind is E.LEASE_LOST and last.attrs["after_dispatch"] is True, last
        assert E.PROTOCOL_OBSERVED not in [e.kind for e in j.events("inv-1")]
        ev = await j.append(_hop("inv-2", 2), barrier=True, first_gate="w1")  # in time
        assert ev.kind is E.PROTOCOL_OBSERVED


async def test_a_binder_s_gate_in_a_taker_s_record_is_refused(place: Place) -> None:
    """A take-over at generation 0: the binder B's preamble failed to be stored (a locked
    database), the taker T won the record's first event under a later deadline and wrote its
    preamble.  B's gate (generation 0, as T's) is refused, nothing of B written: with its
    failed preamble among its unread posts (``after``) by that failure -- its premises are not
    on record -- and without them because the record's lease is T's, not B's, whose own
    deadline has passed (LEASE_LOST recorded for B).  T's gate passes."""
    clock = Clock()
    async with place.open(clock=clock) as j:
        first, validated, authorized, dispatch = until_dispatch("inv-1")
        binder = {"holder": "B", "lease_expires_at": clock.now - 5}
        taker = {"holder": "T", "lease_expires_at": clock.now + 60}

        def fault(_: Batch) -> None:
            raise storage_fault(place)

        with trio.fail_after(10):
            j.before_commit = fault
            preamble = [Event(first.kind, "inv-1", {**first.attrs, **binder}), validated]
            late = await j.post_many([(ev, None) for ev in (*preamble, authorized)])
            with pytest.raises(JournalWriteError):  # the barrier its posts ride with
                await j.append(until_dispatch("inv-2")[0], barrier=True)
            j.before_commit = None
            for ev in (Event(first.kind, "inv-1", {**first.attrs, **taker}), validated):
                await j.append(ev)
            await j.append(authorized)
            rows = j.events("inv-1")
            with pytest.raises(JournalWriteError) as failed:
                await j.append(dispatch, first_gate="B", after=[late])
            with pytest.raises(JournalWriteError) as first_failure:
                await late.wait()
            assert failed.value is first_failure.value
            assert j.events("inv-1") == rows
            with pytest.raises(LeaseLost) as info:
                await j.append(dispatch, first_gate="B")
            assert (info.value.holder, info.value.generation) == ("B", 0)
            lost = j.events("inv-1")[-1]
            assert lost.kind is E.LEASE_LOST and lost.attrs == {"generation": 0, "holder": "B"}
            assert info.value.seq == lost.seq
            ev = await j.append(dispatch, first_gate="T")
        assert ev.kind is E.DISPATCH_STARTED
        assert j.verify().ok


async def _first_attempts(j: Journal, clock: Clock, left: dict[str, float]) -> None:
    """First attempts up to their gate, each with its deadline ``left[iid]`` s from now."""
    for iid, seconds in left.items():
        first, *rest = until_dispatch(iid)[:3]
        deadline = {"holder": "w1", "lease_expires_at": clock.now + seconds}
        await j.append(Event(first.kind, iid, {**first.attrs, **deadline}))
        for ev in rest:
            await j.append(ev)


async def test_one_process_dispatches_an_approved_invocation_and_spends_no_budget(
    place: Place,
) -> None:
    clock = Clock()
    fp = "sha256:a990"
    async with place.open(clock=clock) as j:
        for ev in [
            accepted("inv-1", budget=1),
            Event(E.PREFLIGHT_VALIDATED, "inv-1", {"config_hash": "sha256:c0ff"}),
            Event(E.APPROVAL_REQUESTED, "inv-1", {"fingerprint": fp, "expires_at": 2e6}),
        ]:
            await j.append(ev)
        kind = E.DISPATCH_LEASE_ACQUIRED
        with pytest.raises(ImpossibleEvent):  # nothing to dispatch before the grant
            await j.acquire_lease("inv-1", "w1", ttl=10, kind=kind)
        await j.append(Event(E.APPROVAL_GRANTED, "inv-1", {"fingerprint": fp, "operator": {}}))
        first = await j.acquire_lease("inv-1", "w1", ttl=10, kind=kind)
        for holder in ("w2", "w1"):  # busy even to its holder's other tasks
            with pytest.raises(LeaseBusy):
                await j.acquire_lease("inv-1", holder, ttl=10, kind=kind)
        _stall(place, clock, 11)  # w1 stalls: w2 takes over, and w1's gate is refused
        second = await j.acquire_lease("inv-1", "w2", ttl=10, kind=kind)
        await j.append(Event(E.CREDENTIAL_AUTHORIZED, "inv-1", {"credential": "c"}))
        with pytest.raises(LeaseLost):
            await j.append(
                Event(E.DISPATCH_STARTED, "inv-1", {"generation": first.generation}),
                lease=("w1", first.generation),
            )
        await j.append(
            Event(E.DISPATCH_STARTED, "inv-1", {"generation": second.generation}),
            lease=("w2", second.generation),
        )
        rec = j.record("inv-1")
        assert rec is not None and (rec.budget.total, rec.budget.used) == (1, 1)
        assert [e.kind for e in j.events("inv-1")].count(E.DISPATCH_STARTED) == 1
        with pytest.raises(ValueError, match="not a lease event"):
            await j.acquire_lease("inv-1", "w2", ttl=10, kind=E.RECONCILED)


async def test_the_retry_budget_survives_a_restart(place: Place) -> None:
    clock = Clock()
    async with place.open(clock=clock) as j:
        for ev in interrupted("inv-1")[:-2]:
            await j.append(ev)
        await j.append(Event(E.DISPATCH_STARTED, "inv-1"))
        await j.append(Event(E.ATTEMPT_INTERRUPTED, "inv-1", {"code": "REMOTE_OUTCOME_UNKNOWN"}))
        lease = await j.acquire_lease("inv-1", "w1", ttl=60)
        await j.append(Event(E.DISPATCH_STARTED, "inv-1"), lease=("w1", lease.generation))
        await j.append(Event(E.ATTEMPT_INTERRUPTED, "inv-1", {"code": "CALLER_CANCELLED"}))
    clock.now += 61  # w1's lease ran out while the broker was down
    async with place.open(clock=clock) as j:  # a restart: nothing in memory
        rec = j.record("inv-1")
        assert rec is not None and (rec.budget.total, rec.budget.used) == (3, 2)
        assert rec.evidence["config_hash"] == "sha256:c0ff"
        lease = await j.acquire_lease("inv-1", "w2", ttl=60)
        assert lease.generation == 2
        await j.append(Event(E.DISPATCH_STARTED, "inv-1"), lease=("w2", 2))
        await j.append(Event(E.ATTEMPT_INTERRUPTED, "inv-1", {"code": "CALLER_CANCELLED"}))
        clock.now += 61
        with pytest.raises(ImpossibleEvent, match="budget"):
            await j.acquire_lease("inv-1", "w3", ttl=60)
        assert j.lease("inv-1") == lease


def _worker(place: Place, holder: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), "worker", place.location, holder],
        env=place.env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _ask(proc: subprocess.Popen[str], **cmd: object) -> dict[str, object]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(cmd) + "\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    assert line, proc.stderr.read() if proc.stderr else "worker died"
    answer: dict[str, object] = json.loads(line)
    return answer


def test_two_processes_compete_for_one_retry_lease(place: Place) -> None:
    async def setup() -> None:
        async with place.open() as j:
            await _interrupted(j)

    trio.run(setup)
    ttl = 1.0
    a, b = _worker(place, "worker-a"), _worker(place, "worker-b")
    try:
        first_a = _ask(a, op="acquire", iid="inv-1", ttl=ttl)
        first_b = _ask(b, op="acquire", iid="inv-1", ttl=ttl)
        # One wins (generation 1); the other is told the lease is busy.
        assert first_a == {"ok": True, "generation": 1}
        assert first_b == {"ok": False, "error": "busy", "holder": "worker-a"}
        time.sleep(ttl + 0.2)  # worker-a stalls past its lease
        second_b = _ask(b, op="acquire", iid="inv-1", ttl=30)
        assert second_b == {"ok": True, "generation": 2}
        # worker-a resumes and tries to dispatch under generation 1: refused before dispatch.
        resumed_a = _ask(a, op="dispatch", iid="inv-1", attempt=2, generation=1)
        assert resumed_a["ok"] is False and resumed_a["error"] == "lost"
        dispatch_b = _ask(b, op="dispatch", iid="inv-1", attempt=2, generation=2)
        assert dispatch_b["ok"] is True
    finally:
        for p in (a, b):
            assert p.stdin is not None
            p.stdin.close()
            p.wait(timeout=60)
            for s in (p.stdout, p.stderr):
                if s is not None:
                    s.close()
    with place.reader() as r:
        assert r.verify().ok
        kinds = [(e.kind, e.attrs.get("generation")) for e in r.events("inv-1")[5:]]
        assert kinds == [
            (E.RETRY_LEASE_ACQUIRED, 1),
            (E.RETRY_LEASE_ACQUIRED, 2),
            (E.LEASE_LOST, 1),
            (E.DISPATCH_STARTED, None),
        ]
        rec = r.record("inv-1")
        assert rec is not None and rec.generation == 2
        assert rec.outcome is Outcome.UNKNOWN
        assert [w["generation"] for w in rec.evidence["stale_workers"]] == [1]
        dispatches = [x for x in rec.attempts if x["stage"] == "dispatch"]
        assert [x["generation"] for x in dispatches] == [0, 2]


async def test_idempotency_first_binding_wins_and_survives_restart(place: Place) -> None:
    clock = Clock()
    async with place.open(clock=clock) as j:
        await j.append(accepted("inv-1"))
        rec = await j.bind_idempotency("payments.create", "req_01", "sha256:aa", "inv-1", 2e6)
        assert rec.invocation_id == "inv-1"
        # Bound at the clock leases are judged by: the journal's on SQLite, the database's on
        # PostgreSQL (docs/journal.md, "Clocks"); the key's expiry is recorded in it too (the
        # binder's 2e6, 1e6 s after its clock's now, is that long after the database's now).
        if place.kind == "sqlite":
            assert (rec.created_at, rec.expires_at) == (clock.now, 2e6)
        else:
            assert abs(rec.created_at - time.time()) < 60, rec
            assert rec.expires_at is not None
            assert abs(rec.expires_at - (rec.created_at + 1e6)) < 60, rec
        again = await j.bind_idempotency("payments.create", "req_01", "sha256:aa", "inv-2", 3e6)
        assert again == rec  # the same request retries under the first invocation
        with pytest.raises(IdempotencyMismatch) as info:
            await j.bind_idempotency("payments.create", "req_01", "sha256:bb", "inv-3", None)
        assert info.value.existing == rec
        other = await j.bind_idempotency("refunds", "req_01", "sha256:bb", "inv-4", None)
        assert other.invocation_id == "inv-4"
    with place.reader() as r:
        assert r.find_idempotency("payments.create", "req_01") == rec
        assert r.find_idempotency("payments.create", "nope") is None


async def test_ttl_must_be_positive(place: Place) -> None:
    async with place.open() as j:
        with pytest.raises(ValueError, match="ttl"):
            await j.acquire_lease("inv-1", "w", ttl=0)


async def test_a_lease_taken_before_the_approval_was_asked_keeps_no_dispatch_out(
    place: Place,
) -> None:
    # A record closed before its approval was asked (setup_failed) is retried under a retry
    # lease, and the retry asks for approval: that lease -- still live -- is no dispatch lease
    # of the approval (nothing may be sent under it), so it keeps no DISPATCH claim out.  A
    # dispatch lease taken after the request is busy to everyone, as before.
    clock = Clock()
    fp = "sha256:a990"
    async with place.open(clock=clock) as j:
        for ev in [
            accepted("inv-1"),
            Event(E.PREFLIGHT_VALIDATED, "inv-1", {"config_hash": "sha256:c0ff"}),
            Event(E.SETUP_FAILED, "inv-1", {"stage": "broker_stopped", "code": "SETUP_FAILED"}),
        ]:
            await j.append(ev)
        retry = await j.acquire_lease("inv-1", "w1", ttl=10)
        for ev in [
            Event(E.APPROVAL_REQUESTED, "inv-1", {"fingerprint": fp, "expires_at": 2e6}),
            Event(E.APPROVAL_GRANTED, "inv-1", {"fingerprint": fp, "operator": {}}),
        ]:
            await j.append(ev)
        kind = E.DISPATCH_LEASE_ACQUIRED
        first = await j.acquire_lease("inv-1", "w1", ttl=10, kind=kind)
        assert first.generation == retry.generation + 1
        for holder in ("w2", "w1"):
            with pytest.raises(LeaseBusy):
                await j.acquire_lease("inv-1", holder, ttl=10, kind=kind)


async def test_a_barrier_runs_its_meanwhile_once_and_a_refused_one_never(place: Place) -> None:
    """``append(meanwhile=)``: run on the loop while the barrier's COMMIT is under way, once,
    before the append answers -- and not at all for a write the lease check refused (its
    submitter's work ahead, a request's bytes, would only be thrown away)."""
    clock = Clock()
    async with place.open(clock=clock) as j:
        await _interrupted(j)
        first = await j.acquire_lease("inv-1", "w1", ttl=5)
        _stall(place, clock, 6)
        ran: list[str] = []
        with pytest.raises(LeaseLost):
            await j.append(
                Event(E.DISPATCH_STARTED, "inv-1"),
                lease=("w1", first.generation),
                meanwhile=lambda: ran.append("stale"),
            )
        second = await j.acquire_lease("inv-1", "w1", ttl=5)

        def live() -> None:
            ran.append("live")
            raise RuntimeError("dropped: the submitter does the work after the write instead")

        await j.append(
            Event(E.DISPATCH_STARTED, "inv-1"), lease=("w1", second.generation), meanwhile=live
        )
        assert ran == ["live"]
        assert j.events("inv-1")[-1].kind is E.DISPATCH_STARTED


async def test_a_lease_refusal_says_nothing_of_the_recorded_holder(place: Place) -> None:
    """Canary: a recorded holder is ``hostname:pid:hex`` -- where the broker runs -- and callers
    see only its keyed tag (``JournalReader.holder_tag``).  ``LeaseBusy`` and ``LeaseLost`` carry
    the holders as data for an operator's tools, but neither their words nor what every
    caller-facing surface renders of a journal error (``read_failure``, ``call_failure``,
    ``act_failure``) holds them."""
    from affidavit.engine.recovery import act_failure, call_failure, read_failure

    mine, theirs = "canary-host-7:4242:5eed1e55", "canary-host-9:4343:0ddba11"
    clock = Clock()
    async with place.open(clock=clock) as j:
        await _interrupted(j)
        first = await j.acquire_lease("inv-1", mine, ttl=5)
        with pytest.raises(LeaseBusy) as busy:
            await j.acquire_lease("inv-1", theirs, ttl=5)
        _stall(place, clock, 6)
        await j.acquire_lease("inv-1", theirs, ttl=5)
        with pytest.raises(LeaseLost) as lost:
            await j.append(Event(E.DISPATCH_STARTED, "inv-1"), lease=(mine, first.generation))
    assert busy.value.current.holder == mine  # the data an operator's tool reads
    assert lost.value.holder == mine
    assert lost.value.current is not None and lost.value.current.holder == theirs
    for exc in (busy.value, lost.value):
        shown = [str(exc), repr(exc), *map(str, exc.args)]
        shown += [
            read_failure(exc, "the record")[2],
            call_failure(exc, "inv-1")[2],
            act_failure(exc, "the record", "the decision", "`affidavit result inv-1`")[2],
        ]
        for text in shown:
            for holder in (mine, theirs):
                for part in holder.split(":"):
                    assert part not in text, (type(exc).__name__, text)
    assert "inv-1" in str(busy.value) and "generation 1" in str(busy.value)
    assert "stale or expired" in str(lost.value)
