"""Storage faults during a barrier (issue 3, item 8): disk full, read-only database and I/O
errors surface as a clear error — RESULT_STORE_FAILED for the result commit — never as a silent
success, and every earlier row stays intact and verifiable."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from affidavit.journal import (
    CommitUnknown,
    Journal,
    JournalReader,
    JournalWriteError,
    ResultStoreFailed,
    ResultStoreUnknown,
)
from affidavit.statemachine import Event
from affidavit.statemachine import EventKind as E

from .helpers import CANARY, happy, until_dispatch


def _pages(j: Journal) -> int:
    return int(j.write_connection.execute("PRAGMA page_count").fetchone()[0])


async def test_disk_full_during_the_result_commit_is_result_store_failed(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with Journal.open(path) as j:
        for ev in happy("inv-1"):
            await j.append(ev, barrier=True)
        before = j.verify()
        # The disk "fills": the database may not grow by a single page.
        j.write_connection.execute(f"PRAGMA max_page_count = {_pages(j)}")
        with pytest.raises(ResultStoreFailed, match="full") as info:
            await j.put_result_chunk("inv-1", "body", 0, CANARY.encode() * 2000)
        assert CANARY not in str(info.value)
        with pytest.raises(ResultStoreFailed, match="full"):
            for i in range(40):
                await j.put_result_chunk("inv-1", "body", i, b"y" * 4000)
            await j.commit_result(Event(E.RESULT_COMMITTED, "inv-1"), summary={"s": 1})
        assert j.read_result("inv-1") is None
        assert j.verify() == before
        assert j.record("inv-1") is not None
        assert j.record("inv-1").state == "completed_committed"  # type: ignore[union-attr]
        # Space comes back: the journal goes on from the same intact chain.
        j.write_connection.execute("PRAGMA max_page_count = 1073741823")
        await j.put_result_chunk("inv-1", "body", 0, b"ok")
        ev = await j.commit_result(Event(E.RESULT_COMMITTED, "inv-1"), summary={"s": 1})
        assert ev.seq == before.count + 1
    with JournalReader.open(path) as r:
        assert r.verify().ok
        res = r.read_result("inv-1")
        assert res is not None and res.streams == {"body": b"ok"}


SQLITE_IOERR_FSYNC = 10 | (4 << 8)


async def test_a_result_commit_that_may_have_landed_carries_the_doubt(tmp_path: Path) -> None:
    """RESULT_COMMITTED's COMMIT raises after the -wal write (its sync failed): a store
    failure to the result's writer (``ResultStoreFailed``) that says its commit may yet land
    (``CommitUnknown``) -- the engine must not answer it as a plain store failure."""
    async with Journal.open(tmp_path / "j.db") as j:
        for ev in happy("inv-1"):
            await j.append(ev, barrier=True)
        await j.put_result_chunk("inv-1", "body", 0, b"ok")
        commit = j.backend.commit

        def sync_fails(conn: Any) -> None:
            j.backend.commit = commit  # type: ignore[method-assign]
            exc = sqlite3.OperationalError("disk I/O error")
            exc.sqlite_errorcode = SQLITE_IOERR_FSYNC  # type: ignore[attr-defined]
            raise exc

        j.backend.commit = sync_fails  # type: ignore[method-assign]
        with pytest.raises(ResultStoreUnknown, match="unknown") as info:
            await j.commit_result(Event(E.RESULT_COMMITTED, "inv-1"), summary={"s": 1})
        assert isinstance(info.value, ResultStoreFailed)
        assert isinstance(info.value, CommitUnknown)


async def test_disk_full_during_a_dispatch_barrier_is_an_error_not_a_success(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    async with Journal.open(path) as j:
        for ev in until_dispatch("inv-1")[:3]:
            await j.append(ev)
        # Fill the last page so the next row needs a new one.
        j.write_connection.execute(f"PRAGMA max_page_count = {_pages(j)}")
        with pytest.raises(JournalWriteError):
            for i in range(500):
                await j.append(
                    Event(E.PROTOCOL_OBSERVED, "inv-1", {"protocol": "http", "state": f"s{i}"})
                )
        count = j.verify().count
        with pytest.raises(JournalWriteError) as info:
            await j.append(Event(E.DISPATCH_STARTED, "inv-1"), barrier=True)
        assert not isinstance(info.value, ResultStoreFailed)
        assert all(e.kind is not E.DISPATCH_STARTED for e in j.events("inv-1"))
        assert j.verify().ok and j.verify().count == count


async def test_read_only_database_is_a_clear_error(tmp_path: Path) -> None:
    async with Journal.open(tmp_path / "j.db") as j:
        for ev in until_dispatch("inv-1")[:3]:
            await j.append(ev)
        j.write_connection.execute("PRAGMA query_only = ON")
        with pytest.raises(JournalWriteError, match="readonly"):
            await j.append(Event(E.DISPATCH_STARTED, "inv-1"), barrier=True)
        j.write_connection.execute("PRAGMA query_only = OFF")
        ev = await j.append(Event(E.DISPATCH_STARTED, "inv-1"), barrier=True)
        assert ev.seq == 4 and j.verify().ok


async def test_a_lost_database_handle_fails_the_barrier_and_the_file_stays_intact(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    async with Journal.open(path) as j:
        for ev in until_dispatch("inv-1")[:3]:
            await j.append(ev, barrier=True)
        j.write_connection.close()  # the I/O path is gone underneath the writer
        with pytest.raises(ResultStoreFailed):
            await j.put_result_chunk("inv-1", "body", 0, b"x")
        with pytest.raises(JournalWriteError):
            await j.append(Event(E.DISPATCH_STARTED, "inv-1"), barrier=True)
    with JournalReader.open(path) as r:
        assert r.verify().ok and r.verify().count == 3


async def test_canary_never_reaches_the_database_wal_or_logs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    """Seed: secrets never appear in a journal row or a log line.  Sensitive detail goes to the
    sealed payload and the sealed result; the plaintext columns hold ids and codes only."""
    caplog.set_level(logging.DEBUG)
    path = tmp_path / "j.db"
    secret = CANARY.encode()
    async with Journal.open(path) as j:
        for ev in happy("inv-1"):
            await j.append(ev, barrier=True, payload={"authorization": f"Bearer {CANARY}"})
        await j.put_result_chunk("inv-1", "body", 0, b'{"token":"' + secret + b'"}')
        await j.commit_result(
            Event(E.RESULT_COMMITTED, "inv-1"), summary={"header": f"X-Secret: {CANARY}"}
        )
        await j.bind_idempotency("s", "k", "sha256:1", "inv-1", None)
        res = j.read_result("inv-1")
        assert res is not None and secret in res.streams["body"]  # the broker can read it back
        files = [Path(p) for p in (str(path), f"{path}-wal", f"{path}-shm")]
        assert Path(f"{path}-wal").exists()
        for f in files:
            if f.exists():
                assert secret not in f.read_bytes(), f
    for f in files:
        if f.exists():
            assert secret not in f.read_bytes(), f
    out, err = capfd.readouterr()
    assert CANARY not in out + err
    assert CANARY not in caplog.text
