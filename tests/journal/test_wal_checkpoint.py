"""SQLite: the WAL is copied into the database file beside the writer, never inside its COMMIT
(issue 15: an automatic checkpoint in the middle of a 50 MiB result stalled it ~0.4 s)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import trio

from affidavit.journal import Journal, JournalReader

from .helpers import happy

THREAD = "affidavit-journal-checkpoint"


def _threads() -> list[str]:
    return [t.name for t in threading.enumerate()]


async def test_the_wal_is_checkpointed_beside_the_writer(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with Journal.open(path) as j:
        assert j.write_connection.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        for ev in happy("inv-1"):
            await j.append(ev, barrier=True)
        size = path.stat().st_size
        for i in range(80):  # 5 MiB, one commit each: the database file only grows by copies
            await j.put_result_chunk("inv-1", "body", i, os.urandom(64 * 1024))
        deadline = time.monotonic() + 10
        while path.stat().st_size < size + (4 << 20) and time.monotonic() < deadline:
            await trio.sleep(0.01)
        assert path.stat().st_size >= size + (4 << 20)
        assert THREAD in _threads()
    assert THREAD not in _threads()  # closing the journal stops it
    with JournalReader.open(path) as r:
        assert r.verify().ok
