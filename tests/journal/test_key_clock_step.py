"""A wall clock stepped back re-opens no idempotency key's retention.

Seed, "Idempotency is defined by the remote contract": stop same-key retries before the remote
forgets the key.  On a SQLite journal a key's age was judged by the host's wall clock alone: a
keyed POST whose outcome was unknown, judged 200 s after its 2 min retention had passed, was
``reconcile`` -- but with the wall clock stepped back an hour (an NTP step, a VM restored) the
same-key call took RETRY_LEASE_ACQUIRED and sent the POST again.  The key's binding now records
its moment by the boot clock too (``operation.idempotency.boot``, ``journal/boot.py``); on that
boot the key is judged at the later of the two clocks, and a clock reading before the binding
leaves no retention to judge (``key_moment``): ``reconcile``, never a lease.

The steps are the journal's injected clock (``Journal.open(clock=...)``) and ``_boot_now`` /
``_boot_id`` in ``journal/boot.py``; the host's clocks are never touched.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from affidavit.journal import Journal, KeyRetentionPassed, boot, boot_mark
from affidavit.statemachine import Event
from affidavit.statemachine import EventKind as E
from tests.external import require_boot_clock

from .helpers import FINGERPRINT, interrupted

T0 = 1_700_000_000.0  # the wall clock when the key was bound
RETENTION = 120.0  # the remote keeps the key 2 min
WINDOW = 10.0  # a retry's lease (timeout + lease_margin)
HOUR = 3600.0


class Clock:
    """The journal's wall clock, set by the test."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


async def _record_unknown(j: Journal, iid: str, mark: object) -> None:
    """A keyed POST, dispatched, its outcome unknown; its key bound at ``T0``."""
    expires = T0 + RETENTION
    await j.bind_idempotency("payments.create", "k-" + iid, FINGERPRINT, iid, expires)
    first, *rest = interrupted(iid)
    idem: dict[str, object] = {
        "key": "k-" + iid,
        "scope": "payments.create",
        "retention_s": RETENTION,
        "expires_at": expires,
        "send_window": WINDOW,
    }
    if mark is not None:
        idem["boot"] = mark
    operation = {**first.attrs["operation"], "idempotency": idem}
    for ev in [Event(first.kind, iid, {**first.attrs, "operation": operation}), *rest]:
        await j.append(ev)


def _hint(j: Journal, iid: str) -> str:
    record = j.record(iid)
    assert record is not None
    return record.retry


@pytest.fixture(autouse=True)
def _boot_clock() -> None:
    require_boot_clock()


def _boot_later(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    now = boot._boot_now()
    assert now is not None
    monkeypatch.setattr(boot, "_boot_now", lambda: now + seconds)


CASES = {
    # the boot clock 200 s on, the wall clock stepped back an hour: past retention by the boot
    "stepped_back": (200.0 - HOUR, 200.0, None),
    # another boot (or host): the wall clock reads an hour before the binding -- unknown
    "before_binding": (200.0 - HOUR, 200.0, "another-boot"),
    # a smaller step back, within the binding's moment but younger than the boot clock says
    "stepped_back_after_binding": (5.0, 200.0, None),
}


@pytest.mark.parametrize("case", CASES)
async def test_a_clock_stepped_back_never_reopens_a_keys_retention(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    wall, boot_on, other_boot = CASES[case]
    clock = Clock()
    mark = boot_mark()
    assert mark is not None
    async with Journal.open(tmp_path / "j.db", clock=clock) as j:
        await _record_unknown(j, "inv-1", mark)
        assert _hint(j, "inv-1") == "same_idempotency_key"  # just bound: a same-key retry
        clock.now = T0 + wall
        _boot_later(monkeypatch, boot_on)
        if other_boot is not None:
            monkeypatch.setattr(boot, "_boot_id", lambda: other_boot)
        assert _hint(j, "inv-1") == "reconcile"
        assert [r.retry for r in j.list_actions()] == ["reconcile"]
        # The lease's own check (``acquire_op``), for a caller that decided by the wall clock.
        with pytest.raises(KeyRetentionPassed):
            await j.acquire_lease("inv-1", "broker-1", ttl=WINDOW, same_key=True)
        assert E.RETRY_LEASE_ACQUIRED not in [e.kind for e in j.events("inv-1")]


async def test_a_key_within_its_retention_by_both_clocks_is_still_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The boot clock only ever makes the key older: 20 s on by both, the retry is invited and
    takes its lease."""
    clock = Clock()
    async with Journal.open(tmp_path / "j.db", clock=clock) as j:
        await _record_unknown(j, "inv-1", boot_mark())
        clock.now = T0 + 20.0
        _boot_later(monkeypatch, 20.0)
        assert _hint(j, "inv-1") == "same_idempotency_key"
        lease = await j.acquire_lease("inv-1", "broker-1", ttl=WINDOW, same_key=True)
        assert lease.generation == 1


async def test_a_forged_boot_mark_ahead_of_the_clock_makes_no_key_younger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mark written by anyone who can write the journal, an hour ahead of this boot's clock:
    ignored, the wall clock judges alone (past retention: ``reconcile``)."""
    clock = Clock()
    mark = boot_mark()
    assert mark is not None
    forged = {**mark, "at": float(mark["at"]) + HOUR}  # type: ignore[arg-type]
    elapsed = boot.boot_elapsed(mark)
    assert elapsed is not None and elapsed >= 0  # the true mark is read
    assert boot.boot_elapsed(forged) is None  # the forged one is not: no younger key
    async with Journal.open(tmp_path / "j.db", clock=clock) as j:
        await _record_unknown(j, "inv-1", forged)
        clock.now = T0 + 200.0
        assert _hint(j, "inv-1") == "reconcile"


async def test_a_hint_made_reconcile_by_a_clock_before_the_binding_comes_back_once_past_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one way a hint becomes more permissive as time passes (docs/contract.md, 'When the
    hint is computed'): a clock reading before the key's binding knows no retention --
    ``reconcile`` -- and once it reads past the binding again, a key still usable is
    ``same_idempotency_key`` again; never past what the boot clock says elapsed."""
    clock = Clock()
    async with Journal.open(tmp_path / "j.db", clock=clock) as j:
        await _record_unknown(j, "inv-1", boot_mark())
        clock.now = T0 - HOUR  # stepped back (a failover to a server whose clock is behind)
        _boot_later(monkeypatch, 5.0)
        assert _hint(j, "inv-1") == "reconcile"
        clock.now = T0 + 5.0  # corrected
        assert _hint(j, "inv-1") == "same_idempotency_key"
