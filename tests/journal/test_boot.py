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

from affidavit.journal import Journal, boot, boot_between, boot_lapsed, boot_mark, boot_stamp
from affidavit.statemachine import EventKind as E

from .helpers import interrupted


def test_a_stamp_of_this_boot_is_judged_by_the_boot_clock() -> None:
    live, over = boot_stamp(60.0), boot_stamp(-1.0)
    assert live is not None and over is not None  # Linux: the clock and a boot id exist
    assert boot_lapsed(live, 60.0) is False
    assert boot_lapsed(over, 60.0) is True


@pytest.mark.parametrize("length", [None, math.nan, math.inf, 1.0])
def test_a_stamp_left_longer_than_its_lease_says_nothing(length: float | None) -> None:
    """A stamp of this boot claiming more time than its lease's own length (or a lease of no
    known length) is not judged: the wall clock decides, as for another boot's."""
    live = boot_stamp(60.0)
    assert live is not None
    assert boot_lapsed(live, length) is None
    assert boot_lapsed(live, 60.0 - boot.SLACK + 1.0) is False  # within the slack: judged


def test_a_stamp_far_ahead_keeps_nothing_open() -> None:
    """Anyone who can write the journal could keep a record open for ever by the boot clock."""
    mine = boot_stamp(0.0)
    assert mine is not None
    assert boot_lapsed({"id": mine["id"], "expires_at": 1e15}, 60.0) is None


def test_a_boot_clock_running_behind_judges_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Restored into a time namespace (CRIU, ``podman restore``), a process keeps the host's
    boot id but reads ``CLOCK_BOOTTIME`` offset: behind, every lease would look live an hour
    longer by it.  Ahead, a lease only looks lapsed, as the wall clock already said."""
    stamp = boot_stamp(60.0)
    assert stamp is not None
    now = boot._boot_now()
    assert now is not None
    monkeypatch.setattr(boot, "_boot_now", lambda: now - 3600.0)
    assert boot_lapsed(stamp, 60.0) is None
    monkeypatch.setattr(boot, "_boot_now", lambda: now + 3600.0)
    assert boot_lapsed(stamp, 60.0) is True


def test_a_boot_id_read_that_failed_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One failed read (EMFILE at the first lease) must not turn the boot clock off for the
    process's life; a read that succeeded is kept."""
    monkeypatch.setattr(boot, "_READ", {})
    monkeypatch.setattr(boot, "BOOT_ID", tmp_path / "boot_id")
    assert boot_stamp(60.0) is None  # not readable yet
    (tmp_path / "boot_id").write_text("boot-1\n", encoding="ascii")
    stamp = boot_stamp(60.0)
    assert stamp is not None and stamp["id"] == "boot-1"
    (tmp_path / "boot_id").write_text("boot-2\n", encoding="ascii")
    assert boot_lapsed(stamp, 60.0) is False  # read once: still boot-1


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
    assert boot_lapsed(stamp, 60.0) is None


def test_a_span_between_two_marks_is_the_shorter_clocks_where_the_boot_clock_can_tell() -> None:
    """``boot_between``: the settle window's span (``reconcile/service._too_soon``).  A wall
    clock stepped forward between the marks does not lengthen it; a mark it cannot judge --
    malformed, another boot's, ahead of this boot's clock -- leaves the wall clock's span."""
    mine = boot_mark()
    now = boot._boot_now()
    assert mine is not None and now is not None
    earlier, later = {**mine, "at": now - 20.0}, {**mine, "at": now - 11.3}
    assert boot_between(earlier, later, 128.7) == pytest.approx(8.7)
    assert boot_between(earlier, later, 5.0) == 5.0  # the wall clock's, shorter: stepped back
    for bad in (None, {"id": mine["id"]}, {**mine, "id": "another boot"}, {**mine, "at": 1e15}):
        assert boot_between(bad, later, 128.7) == 128.7
        assert boot_between(earlier, bad, 128.7) == 128.7


def test_without_a_boot_id_nothing_is_stamped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(boot, "_boot_id", lambda: None)
    assert boot_stamp(60.0) is None


async def test_a_lease_records_its_end_by_the_boot_clock(tmp_path: Path) -> None:
    async with Journal.open(tmp_path / "j.db") as j:
        for ev in interrupted("inv-1"):
            await j.append(ev)
        await j.acquire_lease("inv-1", "w1", ttl=60)
        (taken,) = [e for e in j.events("inv-1") if e.kind is E.RETRY_LEASE_ACQUIRED]
        assert taken.at is not None
        length = taken.attrs["expires_at"] - taken.at
        assert length == pytest.approx(60)
        assert boot_lapsed(taken.attrs["lease_boot"], length) is False
