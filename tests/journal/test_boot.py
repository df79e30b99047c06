"""A lease's end by the boot clock (``journal/boot.py``): recorded with every lease, judged only
on the boot that took it, and never trusted from a stamp read back malformed.

A lease's recorded expiry is wall-clock time; stepped forward, the wall clock made a live lease
look run out to every other process on the host (tests/broker/test_wall_clock_step.py).  A
stamp is read back from the journal -- whoever wrote it: a malformed one says nothing (None),
never a crash and never "still live" for ever.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from affidavit.journal import Journal, boot, boot_lapsed, boot_stamp
from affidavit.statemachine import EventKind as E

from .helpers import interrupted


def test_a_stamp_of_this_boot_is_judged_by_the_boot_clock() -> None:
    live, over = boot_stamp(60.0), boot_stamp(-1.0)
    assert live is not None and over is not None  # Linux: the clock and a boot id exist
    assert boot_lapsed(live) is False
    assert boot_lapsed(over) is True


@pytest.mark.parametrize(
    "stamp",
    [
        None,
        "x",
        [],
        {},
        {"id": None, "expires_at": 1e12},
        {"expires_at": 1e12},
        {"id": "BOOT", "expires_at": "1e12"},
        {"id": "BOOT", "expires_at": True},
        {"id": "BOOT", "expires_at": math.nan},
        {"id": "BOOT", "expires_at": math.inf},
        {"id": "another boot", "expires_at": 1e12},
    ],
)
def test_a_stamp_it_cannot_judge_says_nothing(stamp: object) -> None:
    mine = boot_stamp(0.0)
    assert mine is not None
    if isinstance(stamp, dict) and stamp.get("id") == "BOOT":
        stamp = {**stamp, "id": mine["id"]}
    assert boot_lapsed(stamp) is None


def test_without_a_boot_id_nothing_is_stamped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(boot, "_boot_id", lambda: None)
    assert boot_stamp(60.0) is None


async def test_a_lease_records_its_end_by_the_boot_clock(tmp_path: Path) -> None:
    async with Journal.open(tmp_path / "j.db") as j:
        for ev in interrupted("inv-1"):
            await j.append(ev)
        await j.acquire_lease("inv-1", "w1", ttl=60)
        (taken,) = [e for e in j.events("inv-1") if e.kind is E.RETRY_LEASE_ACQUIRED]
        assert boot_lapsed(taken.attrs["lease_boot"]) is False
