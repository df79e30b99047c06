"""A writer thread stopped by something that is not an ``Exception`` (a ``KeyboardInterrupt``
or ``SystemExit`` delivered to it) fails the batch it had and every write queued behind it
with ``JournalWriteError`` -- they waited for it uncancellably, for ever -- refuses later
writes, and raises it again (the journal's close re-raises it; the thread ends with it)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.journal import Journal, JournalWriteError
from affidavit.journal.writer import Writer

from .helpers import accepted

WAIT = 5.0


class Stop(BaseException):
    """Stands for a KeyboardInterrupt/SystemExit delivered to the writer thread."""


def _unstick(writer: Writer) -> None:
    """Only when the writer left writes unanswered (the bug): answer them, so that the test
    fails on its assertions instead of hanging."""
    for r in list(writer._pending):
        r.error = JournalWriteError("left waiting by the test")
        r.finished = True
        if r.parked and r.task is not None:
            trio.lowlevel.reschedule(r.task)
    writer._pending.clear()


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
                        await trio.sleep(0.05)
                        assert len(writer._pending) == 3
                        go.set()
                        with trio.move_on_after(WAIT):
                            while len(answers) < 4:
                                await trio.sleep(0.01)
                    finally:
                        _unstick(writer)
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
