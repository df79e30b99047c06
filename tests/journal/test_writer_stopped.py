"""A writer thread stopped by something that is not an ``Exception`` (a ``KeyboardInterrupt``
or ``SystemExit`` delivered to it) fails the batch it had and every write queued behind it
with ``JournalWriteError`` -- they waited for it uncancellably, for ever -- refuses later
writes, and raises it again (the journal's close re-raises it; the thread ends with it) --
whether it stops inside a batch or between two (``_thread_main``'s outer handler, ``_die``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.journal import Journal, JournalWriteError

from .helpers import accepted, unstick, unstick_handed

WAIT = 5.0


async def _until(reached: Callable[[], bool]) -> None:
    """Wait for the writer's state the test stages (bounded: ``WAIT``), not for 50 ms of wall
    time that a loaded machine may not give the tasks that reach it."""
    with trio.fail_after(WAIT):
        while not reached():
            await trio.sleep(0.01)


def _handed(writer: Any) -> int:
    """How many writes the batch handed to the writer's thread holds (0: none handed)."""
    return 0 if writer._inflight is None else len(writer._inflight.batch)


class Stop(BaseException):
    """Stands for a KeyboardInterrupt/SystemExit delivered to the writer thread."""


async def test_a_writer_stopped_by_a_base_exception_fails_every_queued_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    died: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))
    started, go = threading.Event(), threading.Event()

    def op(_txn: Any) -> None:
        started.set()
        go.wait(WAIT)
        raise Stop()

    answers: dict[str, BaseException | None] = {}

    async def write(name: str, fn: Any) -> None:
        try:
            await fn()
        except (Exception, Stop) as exc:
            answers[name] = exc
        else:
            answers[name] = None

    later: list[BaseException] = []
    # The writer task raising it cancels the journal's owner, and its close raises it again.
    with pytest.raises(BaseExceptionGroup) as closed:
        async with Journal.open(tmp_path / "j.db") as j:
            await j.append(accepted("warm"), barrier=True)
            writer = j._writer
            try:
                async with trio.open_nursery() as nursery:
                    try:
                        nursery.start_soon(
                            write, "inflight", lambda: writer.submit(op, barrier=True)
                        )
                        await trio.to_thread.run_sync(started.wait, WAIT)
                        for i in range(3):  # queued behind the batch the thread is in
                            ev = accepted(f"q{i}")
                            nursery.start_soon(
                                write, f"q{i}", lambda ev=ev: j.append(ev, barrier=True)
                            )
                        await _until(lambda: len(writer._pending) == 3)
                        go.set()
                        with trio.move_on_after(WAIT):
                            while len(answers) < 4:
                                await trio.sleep(0.01)
                    finally:
                        unstick(writer)
            finally:
                assert writer._closed, "a dead writer still takes writes"  # (else: waits)
                with pytest.raises(JournalWriteError) as refused:
                    await j.append(accepted("later"), barrier=True)
                later.append(refused.value)
    assert sorted(answers) == ["inflight", "q0", "q1", "q2"], answers
    assert all(isinstance(e, JournalWriteError) for e in answers.values()), answers
    assert "the writer stopped (Stop)" in str(answers["q0"])
    assert "the writer stopped (Stop)" in str(later[0])
    assert closed.group_contains(Stop)
    assert len(died) == 1 and isinstance(died[0], Stop)  # the thread re-raised it


async def test_a_writer_stopped_between_batches_fails_the_batch_handed_over_and_every_queued_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thread stops outside any transaction -- in its upkeep between two batches
    (``Backend.between``), after the last batch was answered -- while the next batch was handed
    to it (never taken) and more writes wait in the queue: the committed write stays committed,
    every waiting one fails with the documented refusal, later ones are refused, nothing waits
    for ever."""
    died: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))
    inside, go = threading.Event(), threading.Event()
    answers: dict[str, BaseException | None] = {}

    async def write(name: str, j: Journal) -> None:
        try:
            await j.append(accepted(name), barrier=True)
        except (Exception, Stop) as exc:
            answers[name] = exc
        else:
            answers[name] = None

    later: list[BaseException] = []
    with pytest.raises(BaseExceptionGroup) as closed:
        async with Journal.open(tmp_path / "j.db") as j:
            await j.append(accepted("warm"), barrier=True)
            writer = j._writer
            upkeep = writer.backend.between

            def between(conn: Any) -> None:
                # Only once the batch with "last-committed" is committed and answered: the
                # warm write's upkeep may still be running.
                sql = "SELECT 1 FROM events WHERE invocation_id = 'last-committed'"
                if conn.execute(sql).fetchone() is not None:
                    inside.set()
                    go.wait(WAIT)
                    raise Stop()
                upkeep(conn)

            monkeypatch.setattr(writer.backend, "between", between)
            try:
                async with trio.open_nursery() as nursery:
                    try:
                        await write("last-committed", j)  # answered before the upkeep runs
                        await trio.to_thread.run_sync(inside.wait, WAIT)
                        for name in ("handed-0", "handed-1"):
                            nursery.start_soon(write, name, j)
                        # handed to the thread as one batch
                        await _until(lambda: _handed(writer) == 2)
                        for name in ("queued-0", "queued-1"):
                            nursery.start_soon(write, name, j)
                        await _until(lambda: len(writer._pending) == 2)
                        assert _handed(writer) == 2
                        go.set()
                        with trio.move_on_after(WAIT):
                            while len(answers) < 5:
                                await trio.sleep(0.01)
                    finally:
                        unstick(writer)
                        unstick_handed(writer)
            finally:
                assert writer._closed, "a dead writer still takes writes"
                with pytest.raises(JournalWriteError) as refused:
                    await j.append(accepted("later"), barrier=True)
                later.append(refused.value)
    assert answers.pop("last-committed") is None
    assert sorted(answers) == ["handed-0", "handed-1", "queued-0", "queued-1"], answers
    for name, exc in answers.items():
        assert isinstance(exc, JournalWriteError), (name, exc)
        assert "the writer stopped (Stop)" in str(exc), (name, exc)
    assert "the writer stopped (Stop): write not taken" in str(later[0])
    assert closed.group_contains(Stop)
    assert len(died) == 1 and isinstance(died[0], Stop)
    # What was answered as committed is durable; nothing of what failed is.
    async with Journal.open(tmp_path / "j.db") as again:
        assert again.record("last-committed") is not None
        for name in ("handed-0", "handed-1", "queued-0", "queued-1", "later"):
            assert again.record(name) is None, name
