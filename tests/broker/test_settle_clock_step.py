"""A wall clock stepped forward does not cut a reconciliation's settle window short (audit 51d).

The hazard ``settle`` guards against: the broker gave up on a POST the remote still holds in
its queue; a query right then finds it absent, and the queued request applies a moment later.
The window was measured between two wall-clock labels -- the attempt's closing event and the
query's DISPATCH_STARTED --, so with the host's clock stepped +120 s (an NTP step, ``date -s``)
a query 9 s after the attempt ended was taken for one outside the 60 s window: the record
became ``reconciled_rejected`` / ``after_correction`` for good, inviting a resend of a charge
the remote still held.  Both events now carry a boot mark (``boot``: ``journal/boot.py``), and
on the boot that wrote them the span is the shorter of the two clocks' readings
(``boot_between``); where the boot clock cannot tell (another boot or host, an older record),
the wall clock's alone, as before.

The wall clock is monkeypatched (``time.time`` and the journal writer's clock, which labels the
events), the step a real one would make; the boot clock (``_boot_now``) and the boot id only
where a case says so.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from affidavit.api.broker import Broker
from affidavit.engine.recovery import closing_event
from affidavit.journal import boot
from affidavit.reconcile import service
from affidavit.statemachine import EventKind
from tests.statemachine.lifecycle_helpers import projector_in

from .approvalkit import PaymentsApi, verify_ok
from .helpers import event_kinds
from .test_reconcile import _unknown, payments

E = EventKind
STEP = 120.0  # seconds the wall clock jumps: twice the default settle window (60 s)

CASES = {
    # the wall clock stepped, the boot clock not: the window has not passed -- inconclusive
    "stepped": False,
    # both clocks moved (the time really passed): the absent finding settles it, as before
    "lapsed": True,
    # the reconciling process reads another boot's id: only the wall clock can judge (the
    # documented limit, docs/journal.md "Clocks") -- settled as before the marks
    "other_boot": True,
}


def _step(monkeypatch: pytest.MonkeyPatch, b: Broker, case: str) -> None:
    """What every process on the host sees after the wall clock is stepped ``STEP`` forward:
    ``time.time`` and the clock the journal labels events with (bound when it was opened)."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + STEP)
    monkeypatch.setattr(b.journal._writer, "clock", lambda: real() + STEP)
    if case == "lapsed":
        now = boot._boot_now()
        assert now is not None
        monkeypatch.setattr(boot, "_boot_now", lambda: now + STEP)
    elif case == "other_boot":
        monkeypatch.setattr(boot, "_boot_id", lambda: "another-boot")


def _mark(b: Broker, iid: str, kind: EventKind) -> Mapping[str, Any]:
    (event,) = [e for e in b.events(iid) if e.kind is kind][-1:]
    mark = event.attrs["boot"]
    assert isinstance(mark, Mapping)
    return mark


@pytest.mark.parametrize("case", CASES)
async def test_a_stepped_wall_clock_does_not_cut_the_settle_window_short(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    api = PaymentsApi()
    async with payments(tmp_path, settle=None, api=api) as (_, b):  # the default: 60 s
        iid = await _unknown(b, "pay/stepped", late=True)  # held in the remote's queue
        closed = _mark(b, iid, E.ATTEMPT_INTERRUPTED)
        assert closed["id"] == boot._boot_id()
        _step(monkeypatch, b, case)
        answer = await b.reconcile(iid, query=True)
        query_id = answer["query"]["invocation_id"]
        assert answer["query"]["evidence"]["status"] == 404  # it did find the charge absent
        env = answer["envelope"]
        if CASES[case]:
            assert answer["reconciled"] is True, env
            assert env["evidence"]["state"] == "reconciled_rejected"
            monkeypatch.undo()
            verify_ok(b)
            return
        assert answer["reconciled"] is False, env
        assert (env["error"]["outcome"], env["error"]["code"]) == (
            "unknown",
            "REMOTE_OUTCOME_UNKNOWN",
        )
        [tried] = env["evidence"]["reconcile_queries"]
        assert "within the target's settle window (60s)" in tried["reason"]
        # When a query may settle it: 60 s after the attempt's end by the boot clock, told in
        # the host's (stepped) wall-clock time -- the query's own label plus what is left.
        observed = _mark(b, query_id, E.DISPATCH_STARTED)
        span = float(observed["at"]) - float(closed["at"])
        (dispatched,) = [e for e in b.events(query_id) if e.kind is E.DISPATCH_STARTED]
        assert dispatched.at is not None
        assert tried["not_before"] == pytest.approx(dispatched.at + 60.0 - span)
        assert event_kinds(b, iid)[-1] is E.RECONCILE_INCONCLUSIVE

        api.release_late()  # the queued charge applies after all: it was never "absent"
        late = await b.reconcile(iid, query=True)
        assert late["reconciled"] is True
        assert late["envelope"]["evidence"]["state"] == "reconciled_committed"
        monkeypatch.undo()
        verify_ok(b)
    assert api.applied == ["pay/stepped"]


class _Marked:
    """An engine as ``service._too_soon`` sees it: the two events' wall-clock labels and boot
    marks (``boot``), on a journal of one host."""

    def __init__(
        self,
        ended: tuple[float, object],
        observed: tuple[float, object],
        after: tuple[tuple[EventKind, float, object], ...] = (),
    ) -> None:
        rows = {
            "orig": [(E.ATTEMPT_INTERRUPTED, *ended), *after],
            "query": [(E.DISPATCH_STARTED, *observed)],
        }
        self.settings = SimpleNamespace(lease_margin=30.0)
        self.journal = SimpleNamespace(
            backend=SimpleNamespace(shared=False),
            events=lambda iid: [
                SimpleNamespace(kind=k, at=t, attrs={} if m is None else {"boot": m})
                for k, t, m in rows[iid]
            ],
        )


def _marks(boot_id: str, span: float) -> tuple[dict[str, object], dict[str, object]]:
    """Two marks ``span`` seconds apart on the boot ``boot_id``, both in this boot's past."""
    now = boot._boot_now()
    assert now is not None
    return {"id": boot_id, "at": now - 100.0}, {"id": boot_id, "at": now - 100.0 + span}


WALL = 128.7  # seconds between the two events' labels: past the 60 s window
MARKED = {
    # this boot, 8.7 s apart: the wall clock was stepped between them -- too soon
    "this-boot-stepped": ("this", 8.7, WALL, 1000.0 + WALL + 60.0 - 8.7),
    # this boot, the clocks agree: believed
    "this-boot-agreeing": ("this", WALL, WALL, None),
    # this boot, the boot span longer (the wall clock stepped back): the wall clock's span
    "this-boot-wall-shorter": ("this", 90.0, 30.0, 1000.0 + 60.0),
    # another boot's marks: the wall clock's span alone (believed)
    "another-boot": ("another-boot", 8.7, WALL, None),
    # an older record, written before the marks: the wall clock's span alone (believed)
    "no-marks": (None, 8.7, WALL, None),
}


@pytest.mark.parametrize("case", MARKED)
def test_the_settle_window_is_judged_by_the_boot_clock_only_where_it_can_tell(
    case: str,
) -> None:
    which, span, wall, not_before = MARKED[case]
    if which is None:
        ended_mark: object = None
        observed_mark: object = None
    else:
        this = boot._boot_id()
        assert this is not None  # Linux: the clock and a boot id exist
        ended_mark, observed_mark = _marks(this if which == "this" else which, span)
    engine: Any = _Marked((1000.0, ended_mark), (1000.0 + wall, observed_mark))
    found, reason = service._too_soon(engine, "orig", "query", 60.0)
    assert found == (None if not_before is None else pytest.approx(not_before))
    assert ("within the target's settle window (60s)" in reason) is (not_before is not None)


AFTER = {
    # recovery's marked close, then a stale worker's LEASE_LOST (unmarked, written later): the
    # close still bounds the dispatch -- too soon by the boot clock
    "lease-lost-last": ((E.LEASE_LOST, 1004.0, None),),
    # a same-key retry stopped before its dispatch: nothing left the broker after the close
    "credential-failed-last": (
        (E.RETRY_LEASE_ACQUIRED, 1002.0, None),
        (E.CREDENTIAL_FAILED, 1003.0, None),
    ),
    "setup-failed-last": ((E.RETRY_LEASE_ACQUIRED, 1002.0, None), (E.SETUP_FAILED, 1003.0, None)),
    # a later dispatch not closed by a marked ATTEMPT_INTERRUPTED: the close bounds nothing,
    # the wall clock's span from the last event alone (believed)
    "dispatched-since": ((E.DISPATCH_STARTED, 1002.0, None), (E.SETUP_FAILED, 1003.0, None)),
}


@pytest.mark.parametrize("case", AFTER)
def test_the_settle_window_runs_from_the_last_marked_close_of_a_dispatch(case: str) -> None:
    this = boot._boot_id()
    assert this is not None
    ended_mark, observed_mark = _marks(this, 8.7)  # 8.7 s apart by the boot clock
    engine: Any = _Marked((1000.0, ended_mark), (1000.0 + WALL, observed_mark), AFTER[case])
    found, reason = service._too_soon(engine, "orig", "query", 60.0)
    if case == "dispatched-since":
        assert (found, reason) == (None, "")
        return
    assert found == pytest.approx(1000.0 + WALL + 60.0 - 8.7)
    assert "found the effect absent 8.7s after the attempt ended" in reason


async def test_a_same_key_retry_stopped_before_dispatch_does_not_reopen_the_bypass(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reviewer's probe (recfix51 round 2): after the interruption the hint is
    same_idempotency_key; a retry that fails at its credential appends CREDENTIAL_FAILED, which
    carries no boot mark -- the window was then the wall clock's alone, and a step settled it."""
    api = PaymentsApi()
    async with payments(tmp_path, settle=None, api=api) as (_, b):
        iid = await _unknown(b, "pay/stepped", late=True)  # held in the remote's queue
        action = {
            "target": "api",
            "method": "POST",
            "path": "/v1/charges",
            "body": '{"late": true}',
            "idempotency_key": "pay/stepped",
        }
        monkeypatch.delenv("AFFIDAVIT_TEST_TOKEN")  # the same-key retry fails at credential
        retried = await b.call(action)
        assert retried["error"]["outcome"] == "unknown", retried
        assert event_kinds(b, iid)[-1] is E.CREDENTIAL_FAILED
        monkeypatch.setenv("AFFIDAVIT_TEST_TOKEN", token)
        _step(monkeypatch, b, "stepped")
        answer = await b.reconcile(iid, query=True)
        env = answer["envelope"]
        assert answer["reconciled"] is False, env
        [tried] = env["evidence"]["reconcile_queries"]
        assert "within the target's settle window (60s)" in tried["reason"]
        api.release_late()
        late = await b.reconcile(iid, query=True)
        assert late["envelope"]["evidence"]["state"] == "reconciled_committed"
        monkeypatch.undo()
        verify_ok(b)
    assert api.applied == ["pay/stepped"]


@pytest.mark.parametrize("last", ["recovery-close", "lease-lost"])
def test_a_recovered_record_is_judged_from_recoverys_marked_close(
    last: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recovery closes a dispatched record whose worker is gone with a marked
    ATTEMPT_INTERRUPTED; the stale worker's LEASE_LOST may follow it, unmarked.  A query 8.7 s
    later by the boot clock, 128.7 s by a stepped wall clock, is too soon either way."""
    closing = closing_event(projector_in("dispatched").record(), "broker_stopped")
    assert closing is not None and closing.kind is E.ATTEMPT_INTERRUPTED
    closed = closing.attrs["boot"]
    assert isinstance(closed, Mapping) and closed["id"] == boot._boot_id()
    observed = {"id": closed["id"], "at": float(closed["at"]) + 8.7}
    now = float(closed["at"]) + 10.0  # the boot clock when the query's finding is judged
    monkeypatch.setattr(boot, "_boot_now", lambda: now)
    after = ((E.LEASE_LOST, 1004.0, None),) if last == "lease-lost" else ()
    engine: Any = _Marked((1000.0, closed), (1000.0 + WALL, observed), after)
    found, reason = service._too_soon(engine, "orig", "query", 60.0)
    assert found == pytest.approx(1000.0 + WALL + 60.0 - 8.7)
    assert "found the effect absent 8.7s after the attempt ended" in reason
