"""A daemon's start-up drops the result chunks a stopped broker stored for an attempt it never
committed (``journal/reclaim.py``), once its recovery has closed that record: a broker stopped
mid-body left a record at ``response_started`` and two chunk rows no RESULT_COMMITTED names.
After the restart the record is closed ``unknown`` (what its events prove, with or without the
chunks), the rows are gone, nothing else is, and the journal verifies."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from affidavit.api import Broker
from affidavit.config import load_config
from affidavit.journal import JournalReader
from tests.journal.helpers import happy

from .kit import api_target, start_daemon, stop, write_daemon_config

UNMARKED = "SELECT count(*) FROM {} WHERE invocation_id = 'inv-mid'"


def _rows(journal: Path) -> tuple[int, int]:
    conn = sqlite3.connect(journal)
    try:
        return tuple(  # type: ignore[return-value]
            int(conn.execute(UNMARKED.format(t)).fetchone()[0])
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


async def test_start_up_names_the_first_records_it_reclaimed_not_every_one(
    tmp_path: Path, token: str
) -> None:
    """A caller cancelling calls mid-body leaves such records by the thousand between two
    restarts: the log line counts them all and names the first ``LOGGED_IDS`` (20)."""
    socket = tmp_path / "affidavit.sock"
    config = write_daemon_config(tmp_path, api_target("http://127.0.0.1:9"), socket=socket)
    iids = [f"inv-{n:02}" for n in range(23)]
    async with Broker.open(config) as broker:
        for iid in iids:
            for ev in happy(iid)[:-1]:  # through REMOTE_RESPONSE_STARTED
                await broker.journal.append(ev, barrier=True)
            await broker.journal.put_result_chunk(iid, "body", 0, b"part", generation=0)
    daemon = await start_daemon(config, socket, tmp_path / "daemon.log", token)
    stop(daemon)
    log = daemon.log_text()
    named = ", ".join(iids[:20])
    line = f"reclaimed the uncommitted result chunks of 23 closed record(s): {named} and 3 more\n"
    assert line in log, log
    assert "inv-22" not in log.split("reclaimed the uncommitted", 1)[1].splitlines()[0]
