"""One clock for every deadline a read outside the writer judges (``JournalReader.now``): the
database's on a shared journal, the journal's own clock on SQLite -- the engine's retry hints
(``Recorder.hint_now``) read it as every view does.  The engine's copy fell back to
``time.time()``, not the journal's clock: on SQLite an envelope's hint and the actions view's
could be computed by two clocks."""

from __future__ import annotations

import time
from pathlib import Path

from affidavit.engine.recorder import Recorder
from affidavit.journal import Journal

AHEAD = 3600.0


def _ahead() -> float:
    return time.time() + AHEAD


async def test_sqlite_deadlines_are_read_by_the_journal_s_clock(tmp_path: Path) -> None:
    async with Journal.open(tmp_path / "j.db", clock=_ahead) as j:
        for now in (j.now(), Recorder(j).hint_now()):
            assert abs(now - _ahead()) < 60, now


async def test_shared_deadlines_are_read_by_the_database_s_clock(
    pg_url: str, tmp_path: Path
) -> None:
    keys = {"key_file": tmp_path / "k", "signing_key": tmp_path / "s"}
    async with Journal.open(pg_url, clock=_ahead, **keys) as j:
        for now in (j.now("a test"), Recorder(j).hint_now()):
            assert abs(now - time.time()) < 60, now  # the database's, not the skewed one
