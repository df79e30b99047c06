"""What a stop that could not wait for the journal names (``Journal.unanswered_writes``,
``Writer.unanswered``): each write taken and not answered, by invocation id and what it writes
-- never a row's attributes -- read from another thread while the writer thread is held in its
transaction (``before_commit``: rows inserted, COMMIT not sent)."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.journal import Journal, writer
from affidavit.journal.requests import Req
from affidavit.statemachine import Event
from affidavit.statemachine import EventKind as E

from .helpers import CANARY, accepted, happy

WAIT = 10.0


async def _quietly(write: Callable[[], Awaitable[Any]]) -> None:
    """A queued write whose answer, once the hold ends, does not matter here."""
    try:
        await write()
    except Exception:  # (a chunk of no record is refused: still a write that was waiting)
        return


async def _until(predicate: Callable[[], bool]) -> None:
    with trio.fail_after(WAIT):
        while not predicate():
            await trio.sleep(0.01)


async def test_each_unanswered_write_is_named_by_its_invocation_and_what_it_writes(
    tmp_path: Path,
) -> None:
    held, release = threading.Event(), threading.Event()

    def hold(_batch: Any) -> None:
        held.set()
        release.wait(WAIT)

    async with Journal.open(tmp_path / "j.db") as j:
        for ev in happy("inv-r"):
            await j.append(ev)
        await j.put_result_chunk("inv-r", "body", 0, CANARY.encode())
        assert j.unanswered_writes() == []
        assert j.last_answered_ago() is not None
        j.before_commit = hold
        try:
            async with trio.open_nursery() as nursery:
                secret = Event(E.ACTION_ACCEPTED, "inv-a", accepted("inv-a").attrs)
                nursery.start_soon(_quietly, lambda: j.append(secret))
                await trio.to_thread.run_sync(held.wait, WAIT)  # in its transaction, held
                committed = Event(E.RESULT_COMMITTED, "inv-r")
                nursery.start_soon(
                    _quietly, lambda: j.commit_result(committed, summary={"status": 201})
                )
                await _until(lambda: len(j.unanswered_writes()) == 2)
                nursery.start_soon(
                    _quietly, lambda: j.bind_idempotency("s", CANARY, "fp", "inv-b", None)
                )
                await _until(lambda: len(j.unanswered_writes()) == 3)
                nursery.start_soon(_quietly, lambda: j.acquire_lease("inv-r", "h", 30.0))
                await _until(lambda: len(j.unanswered_writes()) == 4)
                nursery.start_soon(
                    _quietly, lambda: j.put_result_chunk("inv-x", "body", 0, CANARY.encode())
                )
                await _until(lambda: len(j.unanswered_writes()) == 5)
                seen = [(Event(E.PROTOCOL_OBSERVED, "inv-r", {"n": n}), None) for n in (1, 2)]
                nursery.start_soon(_quietly, lambda: j.post_many(seen))
                await _until(lambda: len(j.unanswered_writes()) == 7)
                # From another thread, as the stop's watchdog reads it.
                named = await trio.to_thread.run_sync(j.unanswered_writes)
                assert named == [
                    ("inv-a", "ACTION_ACCEPTED"),  # the batch in the writer thread, first
                    ("inv-r", "RESULT_COMMITTED"),  # a checked write, by its ``about``
                    ("inv-b", "idempotency binding"),
                    ("inv-r", "RETRY_LEASE_ACQUIRED"),
                    ("-", "other write"),  # a result chunk: neither an event nor named
                    ("inv-r", "PROTOCOL_OBSERVED"),  # several rows of one write, each
                    ("inv-r", "PROTOCOL_OBSERVED"),
                ]
                assert CANARY not in repr(named)
                release.set()
        finally:
            release.set()
            j.before_commit = None
        assert j.unanswered_writes() == []  # answered: no longer named
        ago = j.last_answered_ago()
        assert ago is not None and 0 <= ago < WAIT


async def test_a_batch_between_the_queue_and_the_writer_thread_is_still_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hand-off takes a batch out of the queue before it is the writer thread's: a reader
    that copied both meanwhile would see it in neither.  The hand-offs' count (odd while one
    is under way) has the reader read both again once it is over."""
    monkeypatch.setattr(writer, "UNANSWERED_TRIES", 10_000)  # (a loaded machine's slow sleep)
    async with Journal.open(tmp_path / "j.db") as j:
        w = j._writer
        req: Req[Any] = Req(None, (accepted("inv-h"), "{}", None, None, {}), False, False, None)
        w._handoffs += 1  # a hand-off under way: the batch out of the queue ...
        named: list[list[tuple[str, str]]] = []
        reader = threading.Thread(target=lambda: named.append(w.unanswered()))
        reader.start()
        await trio.sleep(0.05)
        w._inflight = writer._Handoff([req])  # ... and now the writer thread's
        w._handoffs += 1
        await trio.to_thread.run_sync(reader.join, WAIT)
        w._inflight = None
        assert named == [[("inv-h", "ACTION_ACCEPTED")]]
