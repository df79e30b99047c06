"""The hand-off from the trio loop to the journal's writer thread (issue 15, concurrency 1): a
write queued while the writer is idle leaves in the loop iteration that queued it, at that
iteration's end, and whatever every task of that iteration queued shares its transaction."""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import trio

from affidavit.journal import Batch, Journal, JournalReader
from affidavit.journal.writer import Writer

from .helpers import accepted, until_dispatch


class Iterations(trio.abc.Instrument):
    """Counts the loop's I/O waits: one per iteration of the run loop."""

    def __init__(self) -> None:
        self.n = 0

    def after_io_wait(self, timeout: float) -> None:
        self.n += 1


class Recorded:
    """The writer's queue to its thread, noting the loop iteration of each hand-off."""

    def __init__(self, inner: queue.SimpleQueue[Any], it: Iterations) -> None:
        self.inner, self.it = inner, it
        self.at: list[int] = []

    def put(self, item: Any) -> None:
        if item is not None:
            self.at.append(self.it.n)
        self.inner.put(item)

    def get(self) -> Any:
        return self.inner.get()


@contextmanager
def instrumented(it: trio.abc.Instrument) -> Iterator[None]:
    trio.lowlevel.add_instrument(it)
    try:
        yield
    finally:
        trio.lowlevel.remove_instrument(it)


async def test_a_write_to_an_idle_writer_leaves_in_the_iteration_that_queued_it(
    tmp_path: Path,
) -> None:
    it = Iterations()
    async with Journal.open(tmp_path / "j.db") as j:
        await j.append(accepted("warm"), barrier=True)  # the writer task is idle again
        await trio.sleep(0)
        writer = j._writer
        # The thread reads the queue it was started with; the loop's side puts through this.
        rec = Recorded(writer._batches, it)
        writer._batches = rec  # type: ignore[assignment]
        with instrumented(it):
            for n, ev in enumerate(until_dispatch("a")):
                queued = it.n
                await j.append(ev, barrier=True)
                assert rec.at[n] == queued, "handed off a loop iteration later"
    with JournalReader.open(tmp_path / "j.db") as r:
        assert [e.kind for e in r.events("a")] == [e.kind for e in until_dispatch("a")]


async def test_writes_queued_by_every_task_of_an_iteration_share_one_transaction(
    tmp_path: Path,
) -> None:
    batches: list[Batch] = []

    @contextmanager
    def counted(batch: Batch) -> Iterator[None]:
        batches.append(batch)
        yield

    async with Journal.open(tmp_path / "j.db") as j:
        await j.append(accepted("warm"), barrier=True)
        await trio.sleep(0)
        j.around_transaction = counted
        async with trio.open_nursery() as nursery:
            for i in range(8):  # all eight run in the nursery's first iteration
                nursery.start_soon(functools.partial(j.append, accepted(f"t{i}"), barrier=True))
        assert [(b.writes, b.barrier) for b in batches] == [(8, True)]
    with JournalReader.open(tmp_path / "j.db") as r:
        assert all(r.record(f"t{i}", now=0.0) is not None for i in range(8))


class WriterTaskSteps(trio.abc.Instrument):
    """Counts the steps of the writer task (the one running ``Writer._run``)."""

    def __init__(self) -> None:
        self.n = 0

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if getattr(task.coro, "cr_code", None) is Writer._run.__code__:
            self.n += 1


async def test_a_commit_wakes_its_writers_and_not_the_writer_task(tmp_path: Path) -> None:
    """Issue 15, concurrency 1: the loop learning a batch committed wakes the tasks waiting
    for it, and the next batch is handed off at the end of that iteration without the
    writer task taking a step per batch (one it ran before the submitter's in half the
    passes).  It still wakes to drain what is queued when the journal closes."""
    steps = WriterTaskSteps()
    async with Journal.open(tmp_path / "j.db") as j:
        await j.append(accepted("warm"), barrier=True)
        await trio.sleep(0)
        with instrumented(steps):
            for ev in until_dispatch("a"):
                await j.append(ev, barrier=True)
            posted = await j.post(accepted("b"))
            await posted.wait()
            assert steps.n == 0, f"the writer task stepped {steps.n} times"
            await j.post(accepted("c"))  # queued, not waited for: the close commits it
    with JournalReader.open(tmp_path / "j.db") as r:
        assert [e.kind for e in r.events("a")] == [e.kind for e in until_dispatch("a")]
        assert r.record("c", now=0.0) is not None


async def test_writes_queued_during_a_commit_wait_for_the_writers_it_wakes(
    tmp_path: Path,
) -> None:
    """What is queued while a batch is in the writer thread is not handed off the moment the
    loop learns it committed, but one iteration later, with what the writers that commit
    woke queue first thing (group commit: one transaction, not two)."""
    batches: list[int] = []
    posted = threading.Event()

    @contextmanager
    def held(batch: Batch) -> Iterator[None]:  # the writer thread
        batches.append(batch.writes)
        if len(batches) == 1:
            assert posted.wait(10), "the other task never queued its write"
        yield

    async with Journal.open(tmp_path / "j.db") as j:
        await j.append(accepted("warm"), barrier=True)
        await trio.sleep(0)
        writer = j._writer
        j.around_transaction = held
        first, second = until_dispatch("a")[:2]

        async def a() -> None:
            await j.append(first, barrier=True)
            await j.append(second, barrier=True)  # queued as the commit's answer wakes us

        async def b() -> None:
            for _ in range(1000):
                if writer._inflight is not None:
                    break
                await trio.sleep(0)
            await j.post(accepted("b"))  # queued while the first batch is in the thread
            posted.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(a)
            nursery.start_soon(b)
        assert batches == [1, 2]
