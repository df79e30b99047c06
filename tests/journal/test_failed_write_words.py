"""The words a failed write is answered with (``journal/commit.py``: ``_fail``): a storage
fault names the journal and what the driver said -- ``journal <where>: write not committed:
<the driver's message>`` -- and a refusal of the journal's own is quoted as it is, ``write
refused: <its words>``.  The in-doubt variant (a rerun after a lost COMMIT) quotes the same two
phrases: tests/journal/test_postgres_lost_doubt.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from affidavit.journal import Journal, JournalError, JournalWriteError
from affidavit.journal.tables import Tables

from .helpers import happy


async def test_a_storage_fault_names_the_journal_and_the_drivers_words(tmp_path: Path) -> None:
    async with Journal.open(tmp_path / "j.db") as j:
        for ev in happy("inv-1"):
            await j.append(ev, barrier=True)
        pages = int(j.write_connection.execute("PRAGMA page_count").fetchone()[0])
        j.write_connection.execute(f"PRAGMA max_page_count = {pages}")  # the disk "fills"
        with pytest.raises(JournalWriteError) as info:
            await j.put_result_chunk("inv-1", "body", 0, b"x" * 100_000)
        said = str(info.value)
        assert said == f"journal {j.backend.where}: write not committed: database or disk is full"


async def test_a_refusal_of_the_journal_is_quoted_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(self: Tables, rows: Any) -> None:
        raise JournalError("the journal's own words")

    async with Journal.open(tmp_path / "j.db") as j:
        first, *_ = happy("inv-1")
        monkeypatch.setattr(Tables, "insert_events", refuse)
        with pytest.raises(JournalWriteError) as info:
            await j.append(first, barrier=True)
        assert str(info.value) == "write refused: the journal's own words"
