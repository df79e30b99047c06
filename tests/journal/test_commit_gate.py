"""A barrier's ``meanwhile`` waits at a gate the writer opens as it goes to send the COMMIT
(``journal/commit.py``, ``_Gate``; issue 15): woken by the writer's wake-up ``send``, the loop
used to take the GIL there and run the whole ``meanwhile`` before the writer could send its
COMMIT.  Waiting at the gate, the loop holds no GIL and runs nothing until it opens -- or,
opened late or never, until ``GATE_WAIT`` passed: a head start lost, never a loop stopped."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest
import trio

from affidavit.journal import Journal
from affidavit.journal.commit import GATE_WAIT, _Gate, _run_meanwhile

from .helpers import until_dispatch


def test_a_meanwhile_runs_only_once_its_gate_is_opened() -> None:
    gate = _Gate()
    order: ClassVar[list[str]] = []

    def writer() -> None:
        time.sleep(GATE_WAIT / 4)  # the writer's last steps before its COMMIT
        order.append("opened")
        gate.open()

    thread = threading.Thread(target=writer)
    thread.start()
    _run_meanwhile([lambda: order.append("meanwhile")], gate)
    thread.join()
    assert order == ["opened", "meanwhile"]


def test_an_open_gate_is_passed_at_once_and_may_be_opened_again() -> None:
    gate = _Gate()
    openers = [threading.Thread(target=gate.open) for _ in range(8)]
    for t in openers:
        t.start()
    for t in openers:
        t.join()
    gate.open()  # (opened again, from any thread: no error, it stays open)
    ran: list[int] = []
    _run_meanwhile([lambda: ran.append(1), lambda: ran.append(2)], gate)
    _run_meanwhile([lambda: ran.append(3)], gate)  # passing leaves it open
    assert ran == [1, 2, 3]
    assert not gate._lock.locked()


def test_a_gate_never_opened_holds_the_loop_only_for_its_bound() -> None:
    """A misplaced ``open`` (late or never) must slow the loop, not freeze it: the
    ``meanwhile`` runs anyway once ``GATE_WAIT`` passed, and the gate opened later is open."""
    gate = _Gate()
    ran: list[int] = []
    loop = threading.Thread(target=_run_meanwhile, args=([lambda: ran.append(1)], gate))
    loop.daemon = True
    loop.start()
    loop.join(5.0)
    frozen = loop.is_alive()
    gate.open()  # (lets a frozen one go)
    loop.join()
    assert not frozen and ran == [1]
    _run_meanwhile([lambda: ran.append(2)], gate)
    assert ran == [1, 2]


class _Traced(sqlite3.Connection):
    """A connection marking the COMMIT's send in ``order``; its page-count read lets go of
    the GIL for a while, as a real one may (a file read under the pragma)."""

    order: ClassVar[list[str]] = []

    def execute(self, sql: str, *args: Any) -> Any:  # type: ignore[override]
        if sql.startswith("PRAGMA page_count"):
            self.order.append("pages")
            time.sleep(0.001)
        elif sql == "COMMIT":
            self.order.append("sent")
        return super().execute(sql, *args)


async def test_the_meanwhile_starts_after_the_commit_is_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Everything SQLite's ``commit`` did before sending its COMMIT -- the page count its
    checkpointer wants, which lets go of the GIL -- is done before the loop is woken
    (``Backend.prepare_commit``): the loop, given the GIL there, ran a GIL-holding
    ``meanwhile`` whole before the COMMIT was sent (the gate moved the race, not closed it).
    Each barrier's ``meanwhile`` now starts after its COMMIT is sent."""
    real = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        return real(*args, factory=_Traced, **kwargs)

    order: ClassVar[list[str]] = []
    monkeypatch.setattr(_Traced, "order", order)
    monkeypatch.setattr(sqlite3, "connect", connect)

    def meanwhile() -> None:  # holds the GIL: pure Python for ~0.5 ms
        order.append("meanwhile")
        end = time.perf_counter() + 0.0005
        while time.perf_counter() < end:
            pass

    with trio.fail_after(30):
        async with Journal.open(tmp_path / "j.db") as j:
            for n in range(20):
                order.clear()
                for ev in until_dispatch(f"x{n}"):
                    await j.append(ev, barrier=True, meanwhile=meanwhile)
                txns = "".join({"pages": "p", "sent": "s", "meanwhile": "m"}[o] for o in order)
                # Per transaction: pages read, COMMIT sent, then the meanwhile (never "pms").
                assert txns == "psm" * len(until_dispatch("x")), txns
