"""A protocol machine's memory does not grow with the steps it takes: the peer decides how many
there are (every body piece or output chunk is one), so anything kept per step is the peer's
to inflate -- a list of every step held 8.4 MB after 1M one-byte chunks."""

from __future__ import annotations

import tracemalloc

from affidavit.statemachine import ProtocolMachine

from .example_protocol import EXAMPLE

STEPS = 100_000


def test_a_machine_keeps_nothing_per_step() -> None:
    """100 000 result chunks (a self-loop) leave the machine no bigger: under 4 KiB traced in
    all, where a list of the steps alone would hold 800 KB."""
    m = ProtocolMachine(EXAMPLE)
    m.fire_all(["connect", "send_request", "ack", "chunk"])
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(STEPS):
            m.fire("chunk")
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert m.state == "receiving" and m.dispatched and not m.complete
    assert grown < 4096, f"{grown} bytes held after {STEPS} steps"
