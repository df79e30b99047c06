"""The writer refuses a server in recovery (``journal/postgres.py``, ``_refuse_standby``).

A multi-host URL, a proxy or a failover can hand a reconnecting writer a hot standby: its
advisory lock is its own, not the primary's chain head, and the re-read after a lost commit
there can miss a COMMIT that landed on the primary (not yet replayed) and claim "not
committed".  The writer treats such a server as away -- the reconnect goes on within
``[journal] reconnect`` -- and takes the primary when one answers.

A real standby needs a second cluster and replication; here the server's answer is forced in
Python (``journal.postgres._in_recovery`` patched): what ``_STANDBY`` says, asked on each new
session as the real query is -- as a failover would."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from affidavit.journal import (
    CommitUnknown,
    Journal,
    JournalReader,
    JournalUnavailable,
    JournalWriteError,
    postgres,
)
from tests.postgres import Cluster

from .helpers import at_dispatch, pg_keys, until_dispatch

LIMIT = 30


_STANDBY = [False]


@pytest.fixture(autouse=True)
def _forceable(monkeypatch: pytest.MonkeyPatch) -> None:
    """New sessions find the server in recovery while ``_STANDBY[0]``, else ask it."""
    real = postgres._in_recovery
    _STANDBY[0] = False
    monkeypatch.setattr(postgres, "_in_recovery", lambda conn: _STANDBY[0] or real(conn))


def _standby(on: bool) -> None:
    _STANDBY[0] = on


async def test_a_journal_opened_on_a_server_in_recovery_is_refused_at_once(
    pg_url: str, tmp_path: Path
) -> None:
    """The first connection is not retried (only reconnects are): an open that reaches a
    standby is refused ``JournalUnavailable``, saying so, and nothing is written there."""
    _standby(True)
    with pytest.raises(JournalUnavailable, match="standby in recovery") as info:
        async with Journal.open(pg_url, reconnect_within=5.0, **pg_keys(tmp_path)):
            pass
    assert "broker writes only to the primary" in str(info.value), info.value


async def test_a_writer_reconnecting_to_a_server_in_recovery_treats_it_as_away(
    pg: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """The writer's session is lost; every server it reaches within ``reconnect`` (1 s) is in
    recovery: the write fails, not committed, having written nothing there -- never a write
    (or a re-read) on a standby.  Once the primary answers again, the writer writes."""
    database = pg_url.rsplit("/", 1)[1]
    async with at_dispatch(pg_url, tmp_path, 1.0) as (j, events):
        _standby(True)
        assert pg.terminate(j.write_connection.info.backend_pid, database)
        with trio.fail_after(LIMIT), pytest.raises(JournalWriteError) as info:
            await j.append(events[3], barrier=True)
        assert not isinstance(info.value, CommitUnknown), info.value
        assert "no new one could be made within 1s" in str(info.value), info.value
        assert pg.sql("SELECT count(*) FROM events", database) == [(3,)]
        _standby(False)
        with trio.fail_after(LIMIT):
            stored = await j.append(events[3], barrier=True)
        assert stored.seq == 4
    with JournalReader.open(pg_url) as r:
        assert [e.seq for e in r.events("inv-1")] == [1, 2, 3, 4] and r.verify().ok


async def test_a_writer_waits_out_a_standby_within_reconnect(
    pg: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """The servers answering are in recovery for a while, then the primary is back within
    ``reconnect``: the write is committed, on the primary -- the standby's answers were the
    database being away, not a write refused."""
    database = pg_url.rsplit("/", 1)[1]
    async with at_dispatch(pg_url, tmp_path, 20.0) as (j, events):
        _standby(True)
        assert pg.terminate(j.write_connection.info.backend_pid, database)

        async def promoted() -> None:
            await trio.sleep(1.0)
            _standby(False)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(promoted)
            with trio.fail_after(LIMIT):
                stored = await j.append(events[3], barrier=True)
            standby_then = _STANDBY[0]
        assert stored.seq == 4 and standby_then is False, standby_then


async def test_the_writing_journals_reader_refuses_a_standby_and_a_tool_reads_it(
    pg: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """The broker's own reads (a call's record after its commits) replace a lost connection:
    on a standby they would read behind the writer, so the new connection is refused --
    ``JournalUnavailable``, which the engine waits out within ``reconnect`` -- and taken once
    the primary answers.  An auditor's read-only reader (``journal verify``) opens it."""
    database = pg_url.rsplit("/", 1)[1]
    async with Journal.open(pg_url, reconnect_within=1.0, **pg_keys(tmp_path)) as j:
        for ev in until_dispatch("inv-1"):
            await j.append(ev)
        _standby(True)
        assert pg.terminate(j._rconn.info.backend_pid, database)
        with pytest.raises(JournalUnavailable, match="standby in recovery"):
            j.events("inv-1")
        with JournalReader.open(pg_url) as r:
            assert len(r.events("inv-1")) == 4 and r.verify().ok
        _standby(False)
        assert len(j.events("inv-1")) == 4
