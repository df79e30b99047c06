"""A SQLite journal file replaced under a running writer (renamed over, or deleted and made
again): the writer holds the file it opened and would go on writing it, while a reader opened by
the path reads the new one -- a record answered from a file the writer is not writing.  So the
writer's transaction start and every check of a view reader compare the path's (device, inode)
with the writer's file, and refuse with ``JournalReplaced`` (``JOURNAL_REPLACED``): nothing is
written, nothing is read from the file at the path.  A journal opened again on the new file
writes and reads it as any other."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from affidavit.api.readers import ViewReaders
from affidavit.journal import Journal, JournalReader, JournalReplaced, JournalWriteError, sqlite_wal
from affidavit.journal.errors import ResultStoreFailed

from .helpers import happy


def _keys(tmp: Path) -> dict[str, Path]:
    return {"key_file": tmp / "k.key", "signing_key": tmp / "k.sk"}


async def _other(path: Path, tmp: Path) -> None:
    """Another journal with the same keys, at ``path`` (its WAL folded in at close)."""
    async with Journal.open(path, **_keys(tmp)) as j:
        for ev in happy("act_other"):
            await j.append(ev)


@pytest.mark.parametrize("how", ["renamed-over", "moved-aside", "removed", "recreated"])
async def test_a_replaced_file_refuses_the_writer_and_the_view_readers(
    tmp_path: Path, how: str
) -> None:
    path, other, moved = tmp_path / "j.db", tmp_path / "other.db", tmp_path / "moved.db"
    await _other(other, tmp_path)
    async with Journal.open(path, **_keys(tmp_path)) as j:
        for ev in happy("act_1")[:2]:
            await j.append(ev, barrier=True)
        readers = ViewReaders(
            path, tmp_path / "k.key", fresh_for=0.0, writer_file=j.backend.require_writer_file
        )
        readers.give_back(readers.take(), 2)  # an idle reader of the writer's file
        head = j.head()
        if how == "renamed-over":
            os.replace(other, path)
        elif how == "moved-aside":
            path.rename(moved)
            os.replace(other, path)
        elif how == "removed":
            path.unlink()
        else:  # deleted, and a new file made at the path
            path.unlink()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # (private)
            with os.fdopen(fd, "wb") as f:
                f.write(other.read_bytes())
        with pytest.raises(JournalReplaced, match="JOURNAL_REPLACED") as refused:
            await j.append(happy("act_1")[2], barrier=True)
        assert isinstance(refused.value, JournalWriteError) and refused.value.code == (
            "JOURNAL_REPLACED"
        )
        with pytest.raises(ResultStoreFailed) as store:
            await j.put_result_chunk("act_1", "body", 0, b"x")
        assert isinstance(store.value, JournalReplaced)
        # The idle reader (of the writer's file) and a new one (by the path) alike.
        with pytest.raises(JournalReplaced):
            readers.take()
        assert readers.idle() == 0
        with pytest.raises(JournalReplaced):
            readers.take()
        assert j.head() == head  # nothing written to the file it holds either
        readers.close()
    if how == "moved-aside":  # what the writer committed is in the file it held, whole
        with JournalReader.open(moved, key_file=tmp_path / "k.key") as r:
            assert r.verify().ok and len(r.events("act_1")) == 2
    if how == "removed":
        return
    # Opened again on the file now at the path -- none of the other file's rows in it (its WAL,
    # still named by the path, was folded into the file it belongs to and emptied), written
    # and read as any journal.
    async with Journal.open(path, **_keys(tmp_path)) as again:
        await again.append(happy("act_2")[0], barrier=True)
        readers = ViewReaders(
            path, tmp_path / "k.key", fresh_for=0.0, writer_file=again.backend.require_writer_file
        )
        reader = readers.take()
        assert {a.invocation_id for a in reader.list_actions()} == {"act_other", "act_2"}
        readers.give_back(reader, 2)
        readers.close()
    with JournalReader.open(path, key_file=tmp_path / "k.key") as r:
        assert r.verify().ok


_HOLD = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=5)
conn.execute("BEGIN IMMEDIATE")
print("held", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
"""


async def test_a_replaced_file_is_refused_without_waiting_for_its_own_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file now at the path shares the writer's ``<journal>-shm`` (SQLite names it after
    the path), so the write lock another process holds on *that* file is the one this writer's
    ``BEGIN IMMEDIATE`` would wait for -- the busy timeout (30 s), then "database is locked"
    where the answer is JOURNAL_REPLACED.  The check before ``BEGIN`` refuses at once; the one
    under the lock alone would only after that wait (the busy timeout is cut to 2 s here, so
    the test fails soon without the first check)."""
    monkeypatch.setattr(sqlite_wal, "BUSY_TIMEOUT_MS", 2_000)
    path, other = tmp_path / "j.db", tmp_path / "other.db"
    await _other(other, tmp_path)
    async with Journal.open(path, **_keys(tmp_path)) as j:
        await j.append(happy("act_1")[0], barrier=True)
        os.replace(other, path)
        with subprocess.Popen(
            [sys.executable, "-c", _HOLD, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        ) as holder:
            assert holder.stdin is not None and holder.stdout is not None
            try:
                assert holder.stdout.readline() == "held\n"  # (its own wait is bounded: 5 s)
                with pytest.raises(JournalReplaced, match="JOURNAL_REPLACED"):
                    await j.append(happy("act_1")[1], barrier=True)
            finally:
                holder.stdin.close()  # it lets go
                holder.wait(timeout=10)
        assert [e.kind for e in j.events("act_1")] == [happy("act_1")[0].kind]


async def test_the_file_the_writer_opened_passes_the_check(tmp_path: Path) -> None:
    """Unreplaced, nothing changes: the writer writes, a view reader is taken and taken again."""
    path = tmp_path / "j.db"
    async with Journal.open(path, **_keys(tmp_path)) as j:
        j.backend.require_writer_file()
        readers = ViewReaders(
            path, tmp_path / "k.key", fresh_for=0.0, writer_file=j.backend.require_writer_file
        )
        first = readers.take()
        readers.give_back(first, 2)
        for ev in happy("act_1"):
            await j.append(ev, barrier=True)
        assert readers.take() is first
        readers.close()


async def test_a_stat_that_fails_otherwise_is_not_taken_for_a_replacement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EACCES, EIO, ESTALE on the path's ``stat`` prove nothing about which file is there: the
    write is refused as a storage fault (nothing written), a view's check as a read declined
    this once -- never JOURNAL_REPLACED, and the WAL is not folded on that word."""
    import errno

    from affidavit.journal import ReadFailed
    from affidavit.journal import sqlite as sqlite_backend

    path = tmp_path / "j.db"
    async with Journal.open(path, **_keys(tmp_path)) as j:
        await j.append(happy("act_1")[0], barrier=True)
        head = j.head()
        real = os.stat
        folds: list[str] = []

        def failing(p: object, *args: object, **kw: object) -> os.stat_result:
            if Path(str(p)) == path:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            return real(p, *args, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(sqlite_backend.os, "stat", failing)
        monkeypatch.setattr(
            sqlite_backend.SqliteBackend,
            "_fold_wal",
            staticmethod(lambda *a, **k: folds.append("x")),
        )
        with pytest.raises(JournalWriteError) as refused:
            await j.append(happy("act_1")[1], barrier=True)
        assert not isinstance(refused.value, JournalReplaced)
        assert "could not be checked" in str(refused.value)
        with pytest.raises(ReadFailed, match="could not be checked"):
            j.backend.require_writer_file()
        assert folds == []
        monkeypatch.setattr(sqlite_backend.os, "stat", real)
        assert j.head() == head  # nothing written; and the journal goes on once it can check
        await j.append(happy("act_1")[1], barrier=True)


async def test_a_refused_transaction_folds_the_wal_without_waiting_for_readers(
    tmp_path: Path,
) -> None:
    """The fold at a refused transaction's start never waits on a reader's lock (the single
    writer thread would be held for the busy timeout): busy_timeout 0 around its checkpoint,
    the connection's own restored after."""
    import sqlite3

    path, other = tmp_path / "j.db", tmp_path / "other.db"
    await _other(other, tmp_path)
    seen: list[str] = []
    async with Journal.open(path, **_keys(tmp_path)) as j:
        await j.append(happy("act_1")[0], barrier=True)
        os.replace(other, path)
        conn: sqlite3.Connection = j._writer.conn
        conn.set_trace_callback(seen.append)
        with pytest.raises(JournalReplaced):
            await j.append(happy("act_1")[1], barrier=True)
        conn.set_trace_callback(None)
        waits = conn.execute("PRAGMA busy_timeout").fetchone()[0]
    fold = [s for s in seen if "busy_timeout" in s or "wal_checkpoint" in s]
    assert waits > 0 and fold == [
        "PRAGMA busy_timeout",  # (the connection's own, read)
        "PRAGMA busy_timeout=0",
        "PRAGMA wal_checkpoint(TRUNCATE)",
        f"PRAGMA busy_timeout={waits}",
    ]


def test_a_call_refused_so_names_its_invocation_and_never_says_nothing_was_sent() -> None:
    """A call whose write is refused past its dispatch may have been sent: its answer names the
    invocation and where its record is, as JOURNAL_UNAVAILABLE's does; only a call refused
    before it was accepted says nothing was sent."""
    from affidavit.engine.recovery import call_failure

    exc = JournalReplaced("journal j.db: the file at this path is not the one ...")
    status, code, message = call_failure(exc, "act_1")
    assert (status, code) == (503, "JOURNAL_REPLACED")
    assert "act_1: whether it was sent is recorded in the file this broker held" in message
    assert "nothing was sent" not in message
    assert call_failure(exc, None)[2].endswith("before the call was accepted: nothing was sent)")
