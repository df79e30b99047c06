"""A logged result commit (``ChunkLog``) refuses a result a chunk of which never reached the
database, as the commit that reads every chunk back does (``Journal.post_result_chunk``: "a chunk
lost with a failed batch then makes the commit fail instead of completing a result without
it")."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest

from affidavit.journal import ChunkLog, Journal, JournalReader, ResultStoreFailed
from affidavit.statemachine import Event
from affidavit.statemachine import EventKind as E

from .helpers import happy

BODY = (b"a" * 10, b"b" * 10, b"tail")


@pytest.mark.parametrize("logged", [False, True], ids=["read-back", "logged"])
async def test_a_tail_chunk_whose_batch_never_began_fails_the_commit(
    tmp_path: Path, logged: bool
) -> None:
    """The tail chunk's batch fails before its op runs -- another process holds the write lock
    past the busy timeout, so ``BEGIN IMMEDIATE`` fails -- and the commit lands in a later batch
    (as it does when the queue's batch boundary falls between them).  The chunk was never
    sealed, so the log never saw it: the commit must not take the stored chunks, one short, for
    the whole result its ``expect`` hash describes."""
    path = tmp_path / "j.db"
    expect = {"body": hashlib.sha256(b"".join(BODY)).hexdigest()}
    log = ChunkLog() if logged else None
    async with Journal.open(path) as j:
        for ev in happy("inv-1"):
            await j.append(ev)
        for i, part in enumerate(BODY[:-1]):
            await (await j.post_result_chunk("inv-1", "body", i, part, log=log)).wait()
        j.write_connection.execute("PRAGMA busy_timeout = 50")
        other = sqlite3.connect(path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            tail = await j.post_result_chunk("inv-1", "body", len(BODY) - 1, BODY[-1], log=log)
            with pytest.raises(ResultStoreFailed):
                await tail.wait()
        finally:
            other.close()
        with pytest.raises(ResultStoreFailed, match="stored streams differ"):
            await j.commit_result(
                Event(E.RESULT_COMMITTED, "inv-1"), summary={}, expect=expect, log=log
            )
        assert j.read_result("inv-1") is None
    with JournalReader.open(path) as r:
        assert r.read_result("inv-1") is None
        assert r.verify().ok
