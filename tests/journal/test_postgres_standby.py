"""The writer refuses a server in recovery (``journal/postgres.py``, ``_refuse_standby``).

A multi-host URL, a proxy or a failover can hand a reconnecting writer a hot standby: its
advisory lock is its own, not the primary's chain head, and the re-read after a lost commit
there can miss a COMMIT that landed on the primary (not yet replayed) and claim "not
committed".  The writer treats such a server as away -- the reconnect goes on within
``[journal] reconnect`` -- and takes the primary when one answers.

A real standby needs a second cluster and replication; here the server's answer is forced: a
``pg_is_in_recovery()`` of the database's ``public`` schema, which a ``search_path`` listing
``pg_catalog`` after it puts in front of the catalog's, answers what the test's database-level
setting ``affidavit_test.standby`` says -- for each new session, as a failover would."""

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
)
from tests.postgres import Cluster

from .helpers import until_dispatch

LIMIT = 30


def _standby(pg: Cluster, database: str, on: bool) -> None:
    """New sessions of ``database`` find the server in recovery (``on``) or not."""
    value = "on" if on else "off"
    pg.sql(f"ALTER DATABASE {database} SET affidavit_test.standby = '{value}'")


def _forceable(pg: Cluster, database: str) -> None:
    pg.sql(
        "CREATE FUNCTION public.pg_is_in_recovery() RETURNS boolean LANGUAGE sql AS "
        "$$ SELECT current_setting('affidavit_test.standby', true) = 'on' $$",
        database,
    )
    pg.sql(f'ALTER DATABASE {database} SET search_path = "$user", public, pg_catalog')
    _standby(pg, database, False)


async def test_a_writer_reconnecting_to_a_server_in_recovery_treats_it_as_away(
    pg: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """The writer's session is lost; every server it reaches within ``reconnect`` (1 s) is in
    recovery: the write fails, not committed, having written nothing there -- never a write
    (or a re-read) on a standby.  Once the primary answers again, the writer writes."""
    database = pg_url.rsplit("/", 1)[1]
    _forceable(pg, database)
    keys = {"key_file": tmp_path / "shared.key", "signing_key": tmp_path / "a.signing.key"}
    events = until_dispatch("inv-1")
    async with Journal.open(pg_url, reconnect_within=1.0, **keys) as j:
        for ev in events[:3]:
            await j.append(ev)
        _standby(pg, database, True)
        assert pg.terminate(j.write_connection.info.backend_pid, database)
        with trio.fail_after(LIMIT), pytest.raises(JournalWriteError) as info:
            await j.append(events[3], barrier=True)
        assert not isinstance(info.value, CommitUnknown), info.value
        assert "no new one could be made within 1s" in str(info.value), info.value
        assert pg.sql("SELECT count(*) FROM events", database) == [(3,)]
        _standby(pg, database, False)
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
    _forceable(pg, database)
    keys = {"key_file": tmp_path / "shared.key", "signing_key": tmp_path / "a.signing.key"}
    events = until_dispatch("inv-1")
    async with Journal.open(pg_url, reconnect_within=20.0, **keys) as j:
        for ev in events[:3]:
            await j.append(ev)
        _standby(pg, database, True)
        assert pg.terminate(j.write_connection.info.backend_pid, database)

        async def promoted() -> None:
            await trio.sleep(1.0)
            await trio.to_thread.run_sync(_standby, pg, database, False)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(promoted)
            with trio.fail_after(LIMIT):
                stored = await j.append(events[3], barrier=True)
            standby_then = pg.sql("SHOW affidavit_test.standby", database)
        assert stored.seq == 4 and standby_then == [("off",)], standby_then


async def test_the_writing_journals_reader_refuses_a_standby_and_a_tool_reads_it(
    pg: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """The broker's own reads (a call's record after its commits) replace a lost connection:
    on a standby they would read behind the writer, so the new connection is refused --
    ``JournalUnavailable``, which the engine waits out within ``reconnect`` -- and taken once
    the primary answers.  An auditor's read-only reader (``journal verify``) opens it."""
    database = pg_url.rsplit("/", 1)[1]
    _forceable(pg, database)
    keys = {"key_file": tmp_path / "shared.key", "signing_key": tmp_path / "a.signing.key"}
    async with Journal.open(pg_url, reconnect_within=1.0, **keys) as j:
        for ev in until_dispatch("inv-1"):
            await j.append(ev)
        _standby(pg, database, True)
        assert pg.terminate(j._rconn.info.backend_pid, database)
        with pytest.raises(JournalUnavailable, match="standby in recovery"):
            j.events("inv-1")
        with JournalReader.open(pg_url) as r:
            assert len(r.events("inv-1")) == 4 and r.verify().ok
        _standby(pg, database, False)
        assert len(j.events("inv-1")) == 4
