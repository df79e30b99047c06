"""A daemon's start-up drops the result chunks a stopped broker stored for an attempt it never
committed (``journal/reclaim.py``), once its recovery has closed that record: a broker stopped
mid-body left a record at ``response_started`` and two chunk rows no RESULT_COMMITTED names.
After the restart the record is closed ``unknown`` (what its events prove, with or without the
chunks), the rows are gone, nothing else is, and the journal verifies."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api import Broker
from affidavit.api.client import Client
from affidavit.config import load_config
from affidavit.daemon.server import Daemon
from affidavit.journal import JournalReader
from affidavit.journal.tables import Tables
from affidavit.text import NAMED
from tests.broker.helpers import TOKEN_ENV
from tests.journal import segkit as kit
from tests.journal.helpers import happy

from .kit import WAIT, api_target, start_daemon, stop, wait_until, write_daemon_config

HOLD = 5.0
"""Seconds the test hook holds the reclaim's read at most (then lets it go, so that a daemon
that waits for it before binding fails the test instead of hanging it)."""

UNMARKED = "SELECT count(*) FROM {} WHERE invocation_id LIKE '{}'"
RECLAIMED = "reclaimed the uncommitted result chunks of"


def _rows(journal: Path, iid: str = "inv-mid") -> tuple[int, int]:
    conn = sqlite3.connect(journal)
    try:
        return tuple(  # type: ignore[return-value]
            int(conn.execute(UNMARKED.format(t, iid)).fetchone()[0])
            for t in ("result_chunks", "result_audit")
        )
    finally:
        conn.close()


async def test_start_up_reclaims_the_chunks_of_an_attempt_stopped_mid_body(
    tmp_path: Path, token: str
) -> None:
    socket = tmp_path / "affidavit.sock"
    config = write_daemon_config(tmp_path, api_target("http://127.0.0.1:9"), socket=socket)
    journal = Path(load_config(config).journal.location)
    async with Broker.open(config) as broker:  # a broker stopped mid-body, as it left things
        for ev in happy("inv-mid")[:-1]:  # through REMOTE_RESPONSE_STARTED
            await broker.journal.append(ev, barrier=True)
        for i, part in enumerate([b"part-0 ", b"part-1 "]):
            await broker.journal.put_result_chunk("inv-mid", "body", i, part, generation=0)
    assert _rows(journal) == (2, 0)
    daemon = await start_daemon(config, socket, tmp_path / "daemon.log", token)
    await wait_until(lambda: RECLAIMED in daemon.log_text(), "the start-up reclaim")  # background
    stop(daemon)
    log = daemon.log_text()
    assert "start-up recovery closed 1 record(s) a stopped broker left open: inv-mid unknown" in log
    assert "reclaimed the uncommitted result chunks of 1 closed record(s): inv-mid" in log
    assert _rows(journal) == (0, 0)
    with JournalReader.open(str(journal)) as reader:
        assert reader.verify().ok
        rec = reader.record("inv-mid")
        assert rec is not None and rec.state == "interrupted" and rec.outcome.value == "unknown"
        assert reader.read_result("inv-mid") is None


async def test_start_up_returns_the_segment_bytes_of_results_that_never_committed(
    tmp_path: Path, token: str
) -> None:
    """A broker stopped with long results cut mid-body left their bytes in segment files: the
    restarted daemon gives them back (``journal/compact.py``) -- the files' allocated size
    drops by what it logs -- and the committed result still reads back whole."""
    socket = tmp_path / "affidavit.sock"
    config = write_daemon_config(tmp_path, api_target("http://127.0.0.1:9"), socket=socket)
    journal = Path(load_config(config).journal.location)
    async with Broker.open(config) as broker:
        await kit.interrupt(broker.journal, "inv-cut-1", 40)
        await kit.store(broker.journal, "inv-done", kit.DONE)
        await kit.interrupt(broker.journal, "inv-cut-2", 40)
    before = kit.allocated(journal)
    daemon = await start_daemon(config, socket, tmp_path / "daemon.log", token)
    await wait_until(lambda: "start-up returned" in daemon.log_text(), "the start-up compaction")
    stop(daemon)
    freed = before - kit.allocated(journal)
    assert freed > 2 * 40 * kit.CHUNK * 0.9
    assert (
        f"start-up returned {freed} bytes of result segment files no committed result names "
        "(1 file(s) looked at, 0 removed whole)" in daemon.log_text()
    )
    kit.check(journal)


async def test_start_up_names_the_first_records_it_recovered_and_reclaimed_not_every_one(
    tmp_path: Path, token: str
) -> None:
    """A caller cancelling calls mid-body leaves such records by the thousand between two
    restarts: the recovery's line and the reclaim's count them all and name the first
    ``NAMED`` (``affidavit.text.named``)."""
    socket = tmp_path / "affidavit.sock"
    config = write_daemon_config(tmp_path, api_target("http://127.0.0.1:9"), socket=socket)
    iids = [f"inv-{n:02}" for n in range(NAMED + 3)]
    async with Broker.open(config) as broker:
        for iid in iids:
            for ev in happy(iid)[:-1]:  # through REMOTE_RESPONSE_STARTED
                await broker.journal.append(ev, barrier=True)
            await broker.journal.put_result_chunk(iid, "body", 0, b"part", generation=0)
    daemon = await start_daemon(config, socket, tmp_path / "daemon.log", token)
    await wait_until(lambda: RECLAIMED in daemon.log_text(), "the start-up reclaim")  # background
    stop(daemon)
    log = daemon.log_text()
    n, more = len(iids), f" and {len(iids) - NAMED} more\n"
    reclaimed = ", ".join(iids[:NAMED])
    assert f"{RECLAIMED} {n} closed record(s): {reclaimed}{more}" in log, log
    recovered = ", ".join(f"{iid} unknown" for iid in iids[:NAMED])
    assert f"recovery closed {n} record(s) a stopped broker left open: {recovered}{more}" in log


async def test_start_up_serves_while_the_reclaim_still_reads(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reclaim's read of the chunk tables grows with them (thousands of cancelled calls'
    chunks): the daemon binds its socket and answers before it is over, and the read runs off
    the event loop (held here in its thread, the socket still answers).  Once let go, the
    chunks are reclaimed all the same."""
    monkeypatch.setenv(TOKEN_ENV, token)
    socket = tmp_path / "affidavit.sock"
    config = write_daemon_config(tmp_path, api_target("http://127.0.0.1:9"), socket=socket)
    journal = Path(load_config(config).journal.location)
    iids = [f"inv-held-{n:02}" for n in range(30)]
    async with Broker.open(config) as broker:
        for iid in iids:
            for ev in happy(iid)[:-1]:  # through REMOTE_RESPONSE_STARTED
                await broker.journal.append(ev, barrier=True)
            await broker.journal.put_result_chunk(iid, "body", 0, b"part", generation=0)
    assert _rows(journal, "inv-held-%") == (30, 0)
    seen: list[str] = []  # appended from the loop and from the reclaim's thread
    release = threading.Event()
    real = Tables.unmarked_chunk_owners

    def held(self: Tables) -> Any:
        seen.append("reclaim read")
        release.wait(HOLD)
        seen.append("reclaim read done")
        return real(self)

    monkeypatch.setattr(Tables, "unmarked_chunk_owners", held)
    try:
        async with trio.open_nursery() as nursery:
            daemon = Daemon(load_config(config))
            with trio.fail_after(WAIT):
                await nursery.start(daemon.run)
                await wait_until(lambda: "reclaim read" in seen, "the reclaim's read started")
                async with Client.open(socket) as client:
                    health = await client.health()
                seen.append("health answered")
                assert _rows(journal, "inv-held-%") == (30, 0)  # nothing reclaimed yet
                release.set()
                await wait_until(lambda: _rows(journal, "inv-held-%") == (0, 0), "the reclaim")
            daemon.shutdown.set()
    finally:
        release.set()
    assert health["ok"] is True, health
    assert seen == ["reclaim read", "health answered", "reclaim read done"], seen


async def test_a_shutdown_does_not_wait_for_the_reclaim(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shutdown while the reclaim still reads cancels it: the daemon stops without waiting
    for the read (its thread is left to finish on its own connection), and nothing is
    reclaimed half-way -- the rows are all there."""
    monkeypatch.setenv(TOKEN_ENV, token)
    socket = tmp_path / "affidavit.sock"
    config = write_daemon_config(tmp_path, api_target("http://127.0.0.1:9"), socket=socket)
    journal = Path(load_config(config).journal.location)
    async with Broker.open(config) as broker:
        for ev in happy("inv-mid")[:-1]:
            await broker.journal.append(ev, barrier=True)
        await broker.journal.put_result_chunk("inv-mid", "body", 0, b"part", generation=0)
    seen: list[str] = []
    release = threading.Event()
    real = Tables.unmarked_chunk_owners

    def held(self: Tables) -> Any:
        seen.append("reclaim read")
        release.wait(HOLD)
        seen.append("reclaim read done")
        return real(self)

    monkeypatch.setattr(Tables, "unmarked_chunk_owners", held)
    try:
        with trio.fail_after(WAIT):
            async with trio.open_nursery() as nursery:
                daemon = Daemon(load_config(config))
                await nursery.start(daemon.run)
                await wait_until(lambda: "reclaim read" in seen, "the reclaim's read started")
                daemon.shutdown.set()
            seen.append("stopped")
    finally:
        release.set()
    assert seen[:2] == ["reclaim read", "stopped"], seen
    assert _rows(journal) == (1, 0)
