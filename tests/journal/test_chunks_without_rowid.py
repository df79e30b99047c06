"""``result_chunks`` is a WITHOUT ROWID table in a journal made from schema 8 on (one B-tree
keyed by (invocation, stream, idx) instead of a rowid table and its key's index: fewer WAL frames
a result commit, issue 15); a journal made before keeps its table, with the same rows and the
same answers."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest

from affidavit.journal import Journal, JournalReader
from affidavit.statemachine import Event
from affidavit.statemachine import EventKind as E

from .helpers import happy

_ROWID_TABLE = """CREATE TABLE result_chunks (
  invocation_id TEXT NOT NULL,
  stream        TEXT NOT NULL,
  idx           INTEGER NOT NULL CHECK (idx >= 0),
  data          BLOB NOT NULL,
  PRIMARY KEY (invocation_id, stream, idx)
)"""
"""The table as journals from before schema 8 hold it."""

_STREAMS = {"body": (b"a" * 3000, b"b" * 10, b""), "stderr": (b"e" * 5,)}


async def _fill(path: Path) -> None:
    async with Journal.open(path) as j:
        for iid in ("inv-1", "inv-2"):
            for ev in happy(iid):
                await j.append(ev)
        await (await j.post_result_chunk("inv-2", "body", 0, b"dropped")).wait()
        for stream, parts in _STREAMS.items():
            for i, part in enumerate(parts):
                await (await j.post_result_chunk("inv-1", stream, i, part)).wait()
        expect = {s: hashlib.sha256(b"".join(p)).hexdigest() for s, p in _STREAMS.items()}
        await j.commit_result(Event(E.RESULT_COMMITTED, "inv-1"), summary={}, expect=expect)


def _sql(path: Path, query: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(query).fetchall()
    finally:
        conn.close()


@pytest.mark.parametrize("made_before", [False, True], ids=["schema-8", "made-before"])
async def test_result_chunks_read_the_same_in_either_table(
    tmp_path: Path, made_before: bool
) -> None:
    path = tmp_path / "j.db"
    if made_before:
        conn = sqlite3.connect(path)
        conn.execute(_ROWID_TABLE)
        conn.close()
    await _fill(path)
    table = str(_sql(path, "SELECT sql FROM sqlite_master WHERE name = 'result_chunks'")[0][0])
    assert table.endswith("WITHOUT ROWID") is not made_before
    indexes = _sql(path, "SELECT name FROM sqlite_master WHERE tbl_name = 'result_chunks' AND "
                   "type = 'index'")  # fmt: skip
    assert len(indexes) == int(made_before)  # the rowid table's key is an index of its own
    keys = "SELECT invocation_id, stream, idx FROM result_chunks ORDER BY 1, 2, 3"
    assert _sql(path, keys) == [
        ("inv-1", "body", 0),
        ("inv-1", "body", 1),
        ("inv-1", "body", 2),
        ("inv-1", "stderr", 0),
        ("inv-2", "body", 0),  # (sealed: the bytes differ each run)
    ]
    with JournalReader.open(path) as r:
        result = r.read_result("inv-1")
        assert result is not None
        assert result.streams == {s: b"".join(p) for s, p in _STREAMS.items()}
        assert r.verify().ok
