"""``Broker.view`` reads on the broker's idle readers (``ViewReaders``): a reader is given back
after a clean read and taken by the next view, with the broker's ``send_windows`` as they are
at that view; one whose read raised is closed, never handed to another view; the broker's
``close`` closes the idle ones, and a reader a view gives back after it is closed then."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.api.readers import ViewReaders
from affidavit.journal import Journal, JournalError, JournalReader


async def _broker(tmp_path: Path) -> Any:
    """What ``Broker.view`` uses of a broker, on a real SQLite journal."""
    path = tmp_path / "j.db"
    async with Journal.open(path):
        pass
    readers = ViewReaders(path, tmp_path / "j.db.key")
    journal = SimpleNamespace(send_windows={"a": 1.0})

    async def settled(*, cancellable: bool = False) -> None:  # no call queued a delivery here
        pass

    return SimpleNamespace(view_readers=readers, journal=journal, view_wait=10.0, settled=settled)


def _closed(reader: JournalReader) -> bool:
    try:
        reader._rconn.execute("SELECT 1")
    except sqlite3.ProgrammingError:
        return True
    return False


async def test_a_clean_read_gives_its_reader_to_the_next_view(tmp_path: Path) -> None:
    broker = await _broker(tmp_path)
    limiter = trio.CapacityLimiter(2)
    seen: list[tuple[JournalReader, Any]] = []

    def read(reader: JournalReader) -> tuple[int, str]:
        seen.append((reader, reader.send_windows))
        return reader.head()

    await Broker.view(broker, read, limiter)
    broker.journal.send_windows = {"a": 2.0}  # (a reload since: judged as it is now)
    await Broker.view(broker, read, limiter)
    assert seen[0][0] is seen[1][0]
    assert [w for _, w in seen] == [{"a": 1.0}, {"a": 2.0}]
    assert broker.view_readers.opened == 1


async def test_a_reader_whose_read_raised_is_closed_not_reused(tmp_path: Path) -> None:
    broker = await _broker(tmp_path)
    limiter = trio.CapacityLimiter(2)
    used: list[JournalReader] = []

    def failing(reader: JournalReader) -> None:
        used.append(reader)
        raise JournalError("journal x: the connection was lost")

    with pytest.raises(JournalError):
        await Broker.view(broker, failing, limiter)
    assert _closed(used[0])
    await Broker.view(broker, used.append, limiter)
    assert used[1] is not used[0]
    assert broker.view_readers.idle() == 1


async def test_close_closes_the_idle_readers_and_one_given_back_after(tmp_path: Path) -> None:
    broker = await _broker(tmp_path)
    limiter = trio.CapacityLimiter(2)
    used: list[JournalReader] = []
    late = broker.view_readers.take()  # a view still reading when the broker closes
    await Broker.view(broker, used.append, limiter)
    assert used[0] is not late and broker.view_readers.idle() == 1
    Broker.close(broker)
    assert _closed(used[0])
    broker.view_readers.give_back(late, 2)
    assert _closed(late)
    assert broker.view_readers.idle() == 0


async def test_a_reader_whose_view_was_abandoned_is_closed_when_its_read_ends(
    tmp_path: Path,
) -> None:
    broker = await _broker(tmp_path)
    limiter = trio.CapacityLimiter(2)
    used: list[JournalReader] = []
    entered, release = threading.Event(), threading.Event()

    def held(reader: JournalReader) -> None:
        used.append(reader)
        entered.set()
        assert release.wait(10)

    with trio.move_on_after(10) as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(Broker.view, broker, held, limiter)
            assert await trio.to_thread.run_sync(entered.wait, 10)
            nursery.cancel_scope.cancel()  # the caller gone: the view abandons its thread
    assert not scope.cancelled_caught
    release.set()
    for _ in range(200):  # until the thread has let its slot go (its read ended)
        if limiter.borrowed_tokens == 0:
            break
        await trio.sleep(0.01)
    assert limiter.borrowed_tokens == 0
    assert _closed(used[0])
    assert broker.view_readers.idle() == 0
