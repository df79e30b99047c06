"""On SQLite a result's chunk rows are written by the transaction that writes its marker
(``segments.py``: held in memory, or referenced in a segment file): nothing is ever uncommitted
there, so that commit does not name the invocation in ``chunk_owners`` only to take the name out
again -- a page of that table written for nothing in every commit (``Tables.put_chunk``'s
``own``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from affidavit.journal import Journal
from affidavit.journal.tables import Tables

from .segkit import body, store


async def test_a_segment_writers_commit_does_not_touch_chunk_owners(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[str] = []
    real = Tables.run

    def spied(self: Tables, name: str, params: Sequence[Any] = ()) -> None:
        ran.append(name)
        real(self, name, params)

    monkeypatch.setattr(Tables, "run", spied)
    async with Journal.open(tmp_path / "j.db") as j:
        await store(j, "inv-short", b"a short answer")  # held, written inline at the commit
        await store(j, "inv-long", body(5, 10))  # spilled to a segment, one chunk row inline
    assert "put_result_chunks" in ran  # the inline rows were written through put_chunk
    assert "own_chunks" not in ran
