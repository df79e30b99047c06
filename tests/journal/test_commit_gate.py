"""A barrier's ``meanwhile`` waits at a gate the writer opens as it goes to send the COMMIT
(``journal/commit.py``, ``_Gate``; issue 15): woken by the writer's wake-up ``send``, the loop
used to take the GIL there and run the whole ``meanwhile`` before the writer could send its
COMMIT.  Waiting at the gate, the loop holds no GIL and runs nothing until it opens."""

from __future__ import annotations

import threading
import time

from affidavit.journal.commit import _Gate, _run_meanwhile


def test_a_meanwhile_runs_only_once_its_gate_is_opened() -> None:
    gate = _Gate()
    order: list[str] = []

    def writer() -> None:
        time.sleep(0.05)  # the writer's last steps before its COMMIT
        order.append("opened")
        gate.open()

    thread = threading.Thread(target=writer)
    thread.start()
    _run_meanwhile([lambda: order.append("meanwhile")], gate)
    thread.join()
    assert order == ["opened", "meanwhile"]


def test_an_open_gate_is_passed_at_once_and_may_be_opened_again() -> None:
    gate = _Gate()
    gate.open()
    gate.open()  # (a writer that opens it twice: no error)
    ran: list[int] = []
    _run_meanwhile([lambda: ran.append(1), lambda: ran.append(2)], gate)
    _run_meanwhile([lambda: ran.append(3)], gate)  # passing leaves it open
    assert ran == [1, 2, 3]
