"""What only a shared journal has: several brokers' signing keys, a database password that must
never be echoed, a role that may append but not change, and a connection that can be lost in
the middle of a commit (seed, "Dispatch shifts the burden of proof": DISPATCH_STARTED must be
durable before the first byte -- so a commit whose answer was lost proves nothing until a
re-read does).  The conformance suite (tests/journal/conformance/) covers the rest on both
backends."""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from affidavit.engine.recorder import Recorder
from affidavit.journal import (
    Batch,
    CommitUnknown,
    Journal,
    JournalError,
    JournalReader,
    JournalUnavailable,
    JournalWriteError,
    SigningKey,
)
from affidavit.journal.postgres import (
    SCHEMA_VERSION,
    SESSION_INDEX_BUILD,
    PostgresBackend,
    grant_statements,
)
from affidavit.statemachine import Event, EvidenceSource, ImpossibleEvent
from affidavit.statemachine import EventKind as E
from tests.postgres import Cluster, Proxy

from .helpers import happy, interrupted, until_dispatch

LIMIT = 30


def _keys(tmp: Path, name: str) -> dict[str, Path]:
    return {"key_file": tmp / "shared.key", "signing_key": tmp / f"{name}.signing.key"}


def _old_broker(
    pg: Cluster, database: str, schema: int, role: str, without: str | None = None
) -> str:
    """``database`` marked as of ``schema``, and a login ``role`` holding its grants -- on every
    table but ``without``, one a later schema adds: the role's URL."""
    pg.sql(f"UPDATE meta SET value = '{schema}' WHERE name = 'schema'", database)
    pg.sql(f"DROP ROLE IF EXISTS {role}")
    pg.sql(f"CREATE ROLE {role} LOGIN PASSWORD 'broker-pw'")
    for statement in grant_statements(role):
        pg.sql(statement.replace(f", {without}", "") if without else statement, database)
    return pg.url(database, user=role, password="broker-pw")


async def _refused(url: str, tmp_path: Path) -> str:
    """The message of the JournalError opening ``url`` as a broker raises."""
    with pytest.raises(JournalError) as refused:
        async with Journal.open(url, **_keys(tmp_path, "broker")):
            pass
    return str(refused.value)


@contextlib.asynccontextmanager
async def _through_proxy(
    pg: Cluster, pg_url: str, tmp_path: Path, **options: Any
) -> AsyncIterator[tuple[Proxy, Journal]]:
    """A journal reaching PostgreSQL through a ``Proxy`` the test cuts, holding the first
    three events of ``inv-1`` (up to its dispatch)."""
    proxy = Proxy(pg.port)
    try:
        async with Journal.open(proxy.url(pg, pg_url), **options, **_keys(tmp_path, "a")) as j:
            for ev in until_dispatch("inv-1")[:3]:
                await j.append(ev)
            yield proxy, j
    finally:
        proxy.close()


async def test_each_broker_signs_with_its_own_key_and_verify_trusts_the_set(
    pg_url: str, tmp_path: Path
) -> None:
    async with (
        Journal.open(pg_url, **_keys(tmp_path, "a")) as a,
        Journal.open(pg_url, **_keys(tmp_path, "b")) as b,
    ):
        for n in range(3):
            for ev in happy(f"a{n}"):
                await a.append(ev, barrier=True)
            for ev in happy(f"b{n}"):
                await b.append(ev, barrier=True)
        # Each reads back what the other stored, and checks it against the other's key.
        await b.put_result_chunk("a0", "body", 0, b"stored by b")
        await b.commit_result(Event(E.RESULT_COMMITTED, "a0"), summary={})
        result = a.read_result("a0")
        assert result is not None and result.streams == {"body": b"stored by b"}
    ka = SigningKey.load(tmp_path / "a.signing.key").public_raw
    kb = SigningKey.load(tmp_path / "b.signing.key").public_raw
    with JournalReader.open(pg_url) as r:
        recorded = r.verify()
        assert recorded.ok and recorded.key_source == "journal"
        assert set(recorded.key_ids) == {SigningKey.load(tmp_path / f"{n}.signing.key").key_id
                                         for n in "ab"}  # fmt: skip
        both = r.verify(public_keys=[ka, kb])
        assert both.ok and both.count == 6 * 7 + 1 and both.results == 1
        only_a = r.verify(public_keys=[ka])
        assert not only_a.ok and "not signed by key" in only_a.reason
        report, anchor = r.anchor(public_keys=[ka, kb])
        assert report.ok and anchor is not None and anchor.public_raw == kb


async def test_every_broker_must_hold_the_same_sealing_key(pg_url: str, tmp_path: Path) -> None:
    async with Journal.open(pg_url, **_keys(tmp_path, "a")):
        pass
    from affidavit.journal.sealing import BrokerKey

    BrokerKey.create(tmp_path / "other.key")
    other = {"key_file": tmp_path / "other.key", "signing_key": tmp_path / "b.signing.key"}
    with pytest.raises(JournalError, match="does not match"):
        async with Journal.open(pg_url, **other):
            pass


async def test_a_shared_journal_needs_its_key_files_named(pg_url: str) -> None:
    with pytest.raises(JournalError, match="key_file and signing_key"):
        async with Journal.open(pg_url):
            pass


def test_the_database_password_is_never_echoed(pg: Cluster, tmp_path: Path) -> None:
    for url in (
        pg.url("no_such_database"),  # the server refuses the database
        pg.url("postgres", password="wrong-" + pg.password),  # and a wrong password
        pg.url("postgres").replace(f":{pg.port}/", ":1/"),  # nothing listens
    ):
        with pytest.raises(JournalError) as info:
            JournalReader.open(url)
        text = str(info.value)
        assert pg.password not in text and "***" in text, text
    with pytest.raises(JournalError, match="no journal") as missing:
        JournalReader.open(pg.database())
    assert pg.password not in str(missing.value)
    assert pg.password not in pg.log_text()


async def test_a_broker_role_appends_but_cannot_change_or_unprotect_the_journal(
    pg: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """Append-only by privilege as well as by trigger: the tables' owner creates the schema and
    grants; the brokers' role can append, but neither update nor delete rows -- idempotency
    bindings included -- nor drop the triggers that refuse it."""
    database = pg_url.rsplit("/", 1)[1]
    async with Journal.open(pg_url, **_keys(tmp_path, "owner")):
        pass  # the schema, created by its owner
    pg.sql("DROP ROLE IF EXISTS broker")
    pg.sql("CREATE ROLE broker LOGIN PASSWORD 'broker-pw'")
    for statement in grant_statements("broker"):
        pg.sql(statement, database)
    broker_url = pg.url(database, user="broker", password="broker-pw")
    async with Journal.open(broker_url, **_keys(tmp_path, "broker")) as j:
        for ev in happy("inv-1"):
            await j.append(ev)
        # bound, its first event not written yet (inv-1's ACTION_ACCEPTED names no key)
        lease_free = await j.bind_idempotency("s", "k", "fp", "inv-2", None)
        assert lease_free.invocation_id == "inv-2"
    with psycopg.connect(broker_url, autocommit=True) as conn:
        for statement in (
            "UPDATE events SET kind = 'RECONCILED' WHERE seq = 3",
            "DELETE FROM events WHERE seq = 7",
            "ALTER TABLE events DISABLE TRIGGER events_no_change",
            "DROP TRIGGER events_no_change ON events",
            "UPDATE idempotency SET fingerprint = 'other'",
            # A deleted binding would let a same-key retry bind the key anew and be sent
            # again; on PostgreSQL no index of the events by key guards that lookup, the
            # broker's role cannot delete a binding (docs/journal.md, "Idempotency bindings").
            "DELETE FROM idempotency",
            "TRUNCATE idempotency",
        ):
            with pytest.raises(psycopg.Error, match=r"append-only|must be owner|permission"):
                conn.execute(statement)  # type: ignore[arg-type]
    with JournalReader.open(broker_url) as r:
        assert r.verify().ok and r.verify().count == 7


async def test_a_broker_role_opens_a_journal_without_the_session_index_and_says_so(
    pg: Cluster, pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``events_session`` on a journal created before it: the brokers' role, which owns no
    table, cannot build it -- it opens the journal all the same, logs why the session views
    read every event, and they answer as before; the owner's next open builds it."""
    database = pg_url.rsplit("/", 1)[1]
    async with Journal.open(pg_url, **_keys(tmp_path, "owner")) as j:
        for ev in happy("inv-1", "alice"):
            await j.append(ev)
    pg.sql("DROP INDEX events_session", database)  # as a broker from before left it
    pg.sql("DROP ROLE IF EXISTS reader_broker")
    pg.sql("CREATE ROLE reader_broker LOGIN PASSWORD 'broker-pw'")
    for statement in grant_statements("reader_broker"):
        pg.sql(statement, database)
    broker_url = pg.url(database, user="reader_broker", password="broker-pw")
    with caplog.at_level(logging.INFO, logger="affidavit.journal"):
        async with Journal.open(broker_url, **_keys(tmp_path, "broker")) as j:
            for ev in happy("inv-2", "alice"):
                await j.append(ev)
    assert pg.sql("SELECT to_regclass('events_session')", database) == [(None,)]
    logged = " ".join(r.getMessage() for r in caplog.records if r.name == "affidavit.journal")
    assert "no index events_session" in logged and "owner" in logged, logged
    with JournalReader.open(broker_url) as r:
        assert [x.invocation_id for x in r.newest_actions(10, session="alice")[0]] == [
            "inv-1",
            "inv-2",
        ]
        assert r.verify().ok
    async with Journal.open(pg_url, **_keys(tmp_path, "owner")):
        pass
    assert pg.sql("SELECT to_regclass('events_session')::text", database) == [("events_session",)]


def _index_state(pg: Cluster, database: str) -> list[tuple[Any, ...]]:
    """``[]`` without ``events_session``, ``[(False,)]`` for one left INVALID, ``[(True,)]``."""
    return pg.sql(
        "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass('events_session')",
        database,
    )


def _logged(caplog: pytest.LogCaptureFixture) -> str:
    return " ".join(r.getMessage() for r in caplog.records if r.name == "affidavit.journal")


async def test_a_session_index_that_cannot_be_built_does_not_refuse_the_journal(
    pg: Cluster, pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``events_session`` is built when its owner opens a journal from before it, with ``CREATE
    INDEX CONCURRENTLY``.  A build that fails (the role's ``statement_timeout`` on a large
    journal, a lock it cannot take, a full disk) must not keep the broker from starting:
    nothing relies on the index.  The journal opens without it, logged, and writes as before.
    A concurrent build that fails leaves the index INVALID: the next open drops it and builds
    it again."""
    database = pg_url.rsplit("/", 1)[1]
    async with Journal.open(pg_url, **_keys(tmp_path, "owner")) as j:
        for ev in happy("inv-1", "alice"):
            await j.append(ev)
    pg.sql("DROP INDEX events_session", database)  # as a broker from before left it
    pg.sql(f'ALTER DATABASE "{database}" SET statement_timeout = 500', database)
    # Another session writing to the table: the build waits for it past the timeout, as a
    # long build on a large journal runs past it.
    with psycopg.connect(pg_url, autocommit=True) as other:
        other.execute("BEGIN")
        other.execute("LOCK TABLE events IN ROW EXCLUSIVE MODE")
        with caplog.at_level(logging.INFO, logger="affidavit.journal"):
            async with Journal.open(pg_url, **_keys(tmp_path, "owner")) as j:
                for ev in happy("inv-2", "alice"):
                    await j.append(ev)
        other.execute("ROLLBACK")
    assert _index_state(pg, database) == [(False,)]  # the failed build's leftover
    logged = _logged(caplog)
    assert "not built" in logged and pg.password not in logged, logged
    with JournalReader.open(pg_url) as r:
        assert len(r.newest_actions(10, session="alice")[0]) == 2
        assert r.verify().ok
    pg.sql(f'ALTER DATABASE "{database}" RESET statement_timeout', database)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="affidavit.journal"):
        async with Journal.open(pg_url, **_keys(tmp_path, "owner")):
            pass
    assert _index_state(pg, database) == [(True,)]
    logged = _logged(caplog)
    assert "left INVALID" in logged and "built index events_session in" in logged, logged
    with JournalReader.open(pg_url) as r:
        assert len(r.newest_actions(10, session="alice")[0]) == 2


def _building(pg: Cluster, database: str) -> bool:
    """Whether a ``CREATE INDEX`` waits for a lock in ``database``."""
    return bool(
        pg.sql(
            "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
            "AND left(query, 12) = 'CREATE INDEX' AND wait_event_type = 'Lock'",
            database,
        )
    )


def test_the_session_index_is_built_while_other_brokers_write(
    pg: Cluster, pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The owner's build of ``events_session`` on a journal from before it may run for minutes
    on a large one.  It must not hold the chain head meanwhile: every other broker's writes --
    DISPATCH_STARTED among them -- need it.  The build is held in progress (it waits for a
    transaction writing the table); meanwhile another broker takes the head at once, opens
    the journal itself (leaving the build to the one running it) and writes."""
    database = pg_url.rsplit("/", 1)[1]

    async def fill() -> None:
        async with Journal.open(pg_url, **_keys(tmp_path, "owner")) as j:
            for ev in happy("inv-1", "alice"):
                await j.append(ev)

    trio.run(fill)
    pg.sql("DROP INDEX events_session", database)  # as a broker from before left it
    failed: list[BaseException] = []

    def owner_opens() -> None:
        async def opens() -> None:
            async with Journal.open(pg_url, **_keys(tmp_path, "owner")):
                pass

        try:
            trio.run(opens)
        except BaseException as exc:
            failed.append(exc)

    with (
        caplog.at_level(logging.INFO, logger="affidavit.journal"),
        psycopg.connect(pg_url, autocommit=True) as other,
    ):
        other.execute("BEGIN")
        other.execute("LOCK TABLE events IN ROW EXCLUSIVE MODE")
        owner = threading.Thread(target=owner_opens, daemon=True)
        owner.start()
        try:
            deadline = time.monotonic() + LIMIT
            while not _building(pg, database):
                assert time.monotonic() < deadline, "the build never started"
                assert owner.is_alive(), failed
                time.sleep(0.02)
            # The head is free: another broker's transaction takes it within 2 s.
            backend = PostgresBackend(pg_url)
            conn = backend.connect("reader")
            try:
                backend.begin(conn, barrier=True, wait=2.0)
                backend.rollback(conn)
            finally:
                backend.close(conn)

            async def second_broker() -> None:
                async with Journal.open(pg_url, **_keys(tmp_path, "second")) as j:
                    for ev in happy("inv-2", "alice"):
                        await j.append(ev, barrier=True)

            trio.run(second_broker)
            assert _building(pg, database) and owner.is_alive()  # all while it still ran
        finally:
            other.execute("ROLLBACK")
            owner.join(LIMIT)
    assert not owner.is_alive() and not failed, failed
    assert _index_state(pg, database) == [(True,)]
    logged = _logged(caplog)
    assert "being built by another broker" in logged, logged
    assert "built index events_session in" in logged, logged
    with JournalReader.open(pg_url) as r:
        assert len(r.newest_actions(10, session="alice")[0]) == 2
        assert r.verify().ok


def test_two_owners_opening_a_journal_without_the_index_at_once_both_open(
    pg: Cluster, pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two brokers of the tables' owner open a journal from before ``events_session`` at the
    same moment: one builds it, the other leaves it to that one (or finds it built); neither
    fails to open, and the index is built once and valid."""
    database = pg_url.rsplit("/", 1)[1]

    async def fill() -> None:
        async with Journal.open(pg_url, **_keys(tmp_path, "a")) as j:
            for ev in happy("inv-0", "alice"):
                await j.append(ev)

    trio.run(fill)
    pg.sql("DROP INDEX events_session", database)
    start = threading.Barrier(2, timeout=LIMIT)
    failed: list[BaseException] = []

    def broker(name: str) -> None:
        async def opens() -> None:
            async with Journal.open(pg_url, **_keys(tmp_path, name)) as j:
                for ev in happy(f"inv-{name}", "alice"):
                    await j.append(ev, barrier=True)

        try:
            start.wait()
            trio.run(opens)
        except BaseException as exc:
            failed.append(exc)

    with caplog.at_level(logging.INFO, logger="affidavit.journal"):
        threads = [threading.Thread(target=broker, args=(n,), daemon=True) for n in "ab"]
        for t in threads:
            t.start()
        for t in threads:
            t.join(LIMIT)
    assert not any(t.is_alive() for t in threads) and not failed, failed
    assert _index_state(pg, database) == [(True,)]
    logged = _logged(caplog)
    assert "not built" not in logged and "INVALID" not in logged, logged
    assert logged.count("built index events_session in") == 1, logged
    with JournalReader.open(pg_url) as r:
        assert len(r.newest_actions(10, session="alice")[0]) == 3
        assert r.verify().ok


async def test_a_broker_role_opens_a_journal_whose_session_index_is_invalid(
    pg: Cluster, pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An INVALID ``events_session`` (a concurrent build that failed) seen by a role that
    cannot drop it: it says so, opens, and the session views answer from the table."""
    database = pg_url.rsplit("/", 1)[1]
    async with Journal.open(pg_url, **_keys(tmp_path, "owner")) as j:
        for ev in happy("inv-1", "alice"):
            await j.append(ev)
    pg.sql("DROP INDEX events_session", database)
    with psycopg.connect(pg_url, autocommit=True) as other, psycopg.connect(pg_url) as build:
        other.execute("BEGIN")
        other.execute("LOCK TABLE events IN ROW EXCLUSIVE MODE")
        build.autocommit = True
        build.execute("SET lock_timeout = 200")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            build.execute(SESSION_INDEX_BUILD)
        other.execute("ROLLBACK")
    assert _index_state(pg, database) == [(False,)]
    pg.sql("DROP ROLE IF EXISTS invalid_broker")
    pg.sql("CREATE ROLE invalid_broker LOGIN PASSWORD 'broker-pw'")
    for statement in grant_statements("invalid_broker"):
        pg.sql(statement, database)
    broker_url = pg.url(database, user="invalid_broker", password="broker-pw")
    with caplog.at_level(logging.INFO, logger="affidavit.journal"):
        async with Journal.open(broker_url, **_keys(tmp_path, "broker")) as j:
            for ev in happy("inv-2", "alice"):
                await j.append(ev)
    assert _index_state(pg, database) == [(False,)]
    logged = _logged(caplog)
    assert "no valid index events_session" in logged and "CONCURRENTLY" in logged, logged
    with JournalReader.open(broker_url) as r:
        assert len(r.newest_actions(10, session="alice")[0]) == 2
        assert r.verify().ok


# -- a connection lost around a commit -----------------------------------------------------------


async def test_a_connection_lost_before_the_commit_landed_runs_the_batch_again(
    pg: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """The session is terminated just before DISPATCH_STARTED's COMMIT: nothing landed.  The
    writer reconnects, reads that the row is not there, and commits the batch again -- the
    append returns only once a commit is known to have landed, and the row is there once."""
    calls: list[Batch] = []
    async with Journal.open(pg_url, **_keys(tmp_path, "a")) as j:
        for ev in until_dispatch("inv-1")[:3]:
            await j.append(ev)

        def terminate_once(batch: Batch) -> None:
            calls.append(batch)
            if len(calls) == 1:
                pid = j.write_connection.info.backend_pid
                assert pg.terminate(pid, pg_url.rsplit("/", 1)[1])

        j.before_commit = terminate_once
        with trio.fail_after(LIMIT):
            stored = await j.append(Event(E.DISPATCH_STARTED, "inv-1", {"attempt": 1}))
        j.before_commit = None
        assert stored.seq == 4 and len(calls) == 2
        assert [e.kind for e in j.events("inv-1")][-1] is E.DISPATCH_STARTED
    with JournalReader.open(pg_url) as r:
        assert [e.seq for e in r.events("inv-1")] == [1, 2, 3, 4]
        assert r.verify().ok


async def test_a_commit_whose_answer_was_lost_is_proven_by_a_reread(
    pg: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """The COMMIT reaches the server and lands; its answer is lost with the connection.  The
    writer cannot know from the error -- it reconnects, reads the row back, and only then
    reports the barrier durable (once: the batch is not run again)."""
    calls: list[Batch] = []
    async with _through_proxy(pg, pg_url, tmp_path) as (proxy, j):

        def lose_answer_once(batch: Batch) -> None:
            calls.append(batch)
            if len(calls) == 1:
                proxy.lose_next_answer()

        j.before_commit = lose_answer_once
        with trio.fail_after(LIMIT):
            stored = await j.append(Event(E.DISPATCH_STARTED, "inv-1", {"attempt": 1}))
        j.before_commit = None
        assert proxy.lost_answers == 1 and len(calls) == 1
        assert stored.seq == 4
    with JournalReader.open(pg_url) as r:
        assert [e.kind for e in r.events("inv-1")][-1] is E.DISPATCH_STARTED
        assert r.head()[0] == 4 and r.verify().ok


@pytest.mark.parametrize("landed", [False, True], ids=["rolled-back", "landed"])
async def test_a_commit_no_reread_can_prove_fails_as_commit_unknown(
    pg: Cluster, pg_url: str, tmp_path: Path, landed: bool
) -> None:
    """The connection goes during the commit and no new one can be made within the reconnect
    window: the append fails with ``CommitUnknown`` -- whether the row landed (the answer was
    lost) or not (the connection was cut first).  The broker never reports a barrier it cannot
    prove; what the journal holds, read later, is the truth either way."""
    async with _through_proxy(pg, pg_url, tmp_path, reconnect_within=1.0) as (proxy, j):

        def fail(_: Batch) -> None:
            if landed:
                proxy.lose_next_answer(then_cut=True)
            else:
                proxy.cut()

        j.before_commit = fail
        with trio.fail_after(LIMIT), pytest.raises(CommitUnknown, match="unknown"):
            await j.append(Event(E.DISPATCH_STARTED, "inv-1", {"attempt": 1}))
        j.before_commit = None
        proxy.restore()
    with JournalReader.open(pg_url) as r:
        kinds = [e.kind for e in r.events("inv-1")]
        assert (E.DISPATCH_STARTED in kinds) is landed
        assert r.verify().ok


async def test_a_read_while_the_database_is_away_waits_within_the_reconnect_window(
    pg: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """A read finds the connection gone and no new one possible: ``JournalUnavailable`` at
    once (the reader never blocks the event loop waiting), and the engine's reads wait on trio
    for as long as the writer would (``reconnect_within``): a database back within that window
    is invisible to a call's reads too; one still away after it is an error."""
    async with _through_proxy(pg, pg_url, tmp_path, reconnect_within=5.0) as (proxy, j):
        recorder = Recorder(j)
        proxy.cut()
        with pytest.raises(JournalUnavailable):
            j.head()

        async def back_later() -> None:
            await trio.sleep(0.5)
            proxy.restore()

        with trio.fail_after(LIMIT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(back_later)
                started = trio.current_time()
                assert (await recorder.read(j.head))[0] == 3
                assert trio.current_time() - started >= 0.4
        j.backend.reconnect_within = 0.5
        proxy.cut()
        with trio.fail_after(LIMIT), pytest.raises(JournalUnavailable):
            await recorder.read(j.head)
        proxy.restore()


async def test_a_commit_still_on_its_way_when_the_connection_went_is_waited_for(
    pg: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """The connection goes while the COMMIT is still on its way: the server's session is alive,
    inside the transaction, and the COMMIT reaches it only later.  A re-read made before then
    finds no row -- yet the transaction is not over, and it lands.  The writer must wait for
    the lost session's transaction to end (it holds the chain head until then) before reading:
    the barrier is then proven once, never written twice nor refused as impossible."""
    calls: list[Batch] = []
    database = pg_url.rsplit("/", 1)[1]
    async with _through_proxy(pg, pg_url, tmp_path) as (proxy, j):

        def hold_commit_once(batch: Batch) -> None:
            calls.append(batch)
            if len(calls) == 1:
                proxy.hold_next_request()

        async def release_once_someone_waits_for_the_head() -> None:
            waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            for _ in range(LIMIT * 20):
                if proxy.holding:
                    rows = await trio.to_thread.run_sync(pg.sql, waiting, database)
                    if rows[0][0]:
                        proxy.release()
                        return
                await trio.sleep(0.05)
            raise AssertionError("nobody waited for the chain head")

        j.before_commit = hold_commit_once
        with trio.fail_after(LIMIT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(release_once_someone_waits_for_the_head)
                stored = await j.append(Event(E.DISPATCH_STARTED, "inv-1", {"attempt": 1}))
        j.before_commit = None
        assert stored.seq == 4
    with JournalReader.open(pg_url) as r:
        assert [e.kind for e in r.events("inv-1")].count(E.DISPATCH_STARTED) == 1
        assert r.head()[0] == 4 and r.verify().ok


async def test_the_wait_for_a_lost_commit_is_bounded_by_reconnect(
    pg: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """The COMMIT is still on its way and never arrives while the writer checks: the lost
    session holds the chain head until PostgreSQL ends it (``idle_in_transaction_session_timeout``,
    a minute).  The re-read waits for the head no longer than ``reconnect`` -- the window the
    operator configured -- and the write then fails ``CommitUnknown``: never reported durable,
    nor blocked for the server's timeout."""
    within = 1.0
    async with _through_proxy(pg, pg_url, tmp_path, reconnect_within=within) as (proxy, j):

        def hold_commit(batch: Batch) -> None:
            proxy.hold_next_request()

        async def release_later() -> None:
            # Unbounded, the writer would wait for as long as the COMMIT is held (the append
            # cannot be cancelled): let it through well after the bound, so the test ends.
            await trio.sleep(within + 4)
            proxy.release()

        j.before_commit = hold_commit
        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(release_later)
            with pytest.raises(CommitUnknown) as unknown:
                await j.append(Event(E.DISPATCH_STARTED, "inv-1", {"attempt": 1}))
            nursery.cancel_scope.cancel()
        assert trio.current_time() - started < within + 3
        # A new connection was made; what ran out was the wait for the head the lost session
        # held -- said so, not "no new connection could be made".
        said = str(unknown.value)
        assert "no new one could be made" not in said, said
        assert "still held the journal's chain head when [journal] reconnect (1s)" in said, said
        j.before_commit = None
        proxy.release()  # the COMMIT lands after all: the record says so, read again
        with JournalReader.open(pg_url) as r:
            for _ in range(LIMIT * 20):
                if r.head()[0] == 4:
                    break
                await trio.sleep(0.05)
            assert [e.kind for e in r.events("inv-1")].count(E.DISPATCH_STARTED) == 1


async def test_the_writer_writes_again_after_its_wait_for_a_lost_commit_ran_out(
    pg: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """The bounded wait for the head (the lost session's COMMIT held) ends the write
    ``CommitUnknown``; PostgreSQL answers that wait's ``lock_timeout`` by aborting the
    transaction it began.  The writer must not keep that aborted transaction: the next write --
    the call's closing event, which is how the record comes to say what happened -- runs on a
    usable connection once the head is free, and sees the COMMIT that landed meanwhile."""
    within = 1.0
    async with _through_proxy(pg, pg_url, tmp_path, reconnect_within=within) as (proxy, j):
        j.before_commit = lambda batch: proxy.hold_next_request()
        with trio.fail_after(LIMIT), pytest.raises(CommitUnknown):
            await j.append(Event(E.DISPATCH_STARTED, "inv-1", {"attempt": 1}))
        j.before_commit = None
        proxy.release()  # the COMMIT lands after all
        closing = Event(E.ATTEMPT_INTERRUPTED, "inv-1", {"code": "REMOTE_OUTCOME_UNKNOWN"})
        with trio.fail_after(LIMIT):
            stored = await j.append(closing, barrier=True)
        assert stored.seq == 5
    with JournalReader.open(pg_url) as r:
        kinds = [e.kind for e in r.events("inv-1")]
        assert kinds[-2:] == [E.DISPATCH_STARTED, E.ATTEMPT_INTERRUPTED]
        assert r.verify().ok


async def test_a_write_refused_while_waiting_for_the_head_leaves_the_writer_usable(
    pg_url: str, tmp_path: Path
) -> None:
    """A database that bounds lock waits itself (``lock_timeout`` set on the role or the
    database, as operators do) refuses a write whose wait for the chain head ran out -- the
    write fails, honestly.  PostgreSQL aborts the transaction the wait was in: the writer must
    end it, or every later write on that journal is refused ("current transaction is
    aborted") long after the head is free."""
    from affidavit.journal.postgres import _LOCK

    with psycopg.connect(pg_url, autocommit=True) as admin:
        name = admin.execute("SELECT current_database()").fetchone()[0]
        admin.execute(f'ALTER DATABASE "{name}" SET lock_timeout = 300')
    async with Journal.open(pg_url, **_keys(tmp_path, "a")) as j:
        events = until_dispatch("inv-1")
        await j.append(events[0], barrier=True)
        with psycopg.connect(pg_url, autocommit=True) as other:
            other.execute("BEGIN")
            other.execute("SELECT pg_advisory_xact_lock(%s, hashtext(current_schema()))", (_LOCK,))
            with trio.fail_after(LIMIT), pytest.raises(JournalError):
                await j.append(events[1], barrier=True)
            other.execute("ROLLBACK")
        with trio.fail_after(LIMIT):
            stored = await j.append(events[1], barrier=True)
        assert stored.seq == 2


_REFUSE = """CREATE FUNCTION refuse_one() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.invocation_id = 'act_refused' THEN RAISE EXCEPTION 'refused by the test'; END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER refuse_one BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION refuse_one()"""


async def test_a_batch_the_database_refused_leaves_the_writer_writing(
    pg: Cluster, tmp_path: Path
) -> None:
    """The database refuses one batch (a trigger of the operator's, say); the broker's next
    writes succeed.  psycopg prepares a statement on its sixth run: when that run was queued in
    the pipeline the refusal aborted, it counted the statement prepared though the server never
    prepared it, and every later write on the connection failed 'prepared statement "_pg3_N"
    does not exist' until a restart -- the writer takes a new connection after a refusal.
    Each count of writes before the refusal on a fresh database, so one of them reaches the
    threshold inside the aborted pipeline."""
    for before in range(1, 9):
        url, keys = pg.database(), tmp_path / str(before)
        keys.mkdir()
        async with Journal.open(url, **_keys(keys, "a")) as j:
            for k in range(before):
                await j.append(interrupted(f"act_a{k}")[0])
            with psycopg.connect(url, autocommit=True) as admin:
                admin.execute(_REFUSE)
            with trio.fail_after(LIMIT), pytest.raises(JournalError, match="refused by the test"):
                await j.append(interrupted("act_refused")[0])
            for k in range(3):
                with trio.fail_after(LIMIT):
                    stored = await j.append(interrupted(f"act_c{k}")[0])
                assert stored.seq == before + k + 1, (before, k)


async def test_a_write_waits_for_the_head_no_longer_than_reconnect(
    pg_url: str, tmp_path: Path
) -> None:
    """Another session holds the chain head (as a broker's lost session does until the server
    ends it, its COMMIT never arriving).  A write waits for it no longer than ``reconnect`` and
    fails, not committed -- it waited for as long as the head was held, every call of this
    broker with it.  Once the head is free the writer writes again."""
    from affidavit.journal.postgres import _LOCK

    within = 1.0
    async with Journal.open(pg_url, reconnect_within=within, **_keys(tmp_path, "a")) as j:
        events = until_dispatch("inv-1")
        await j.append(events[0], barrier=True)
        with psycopg.connect(pg_url, autocommit=True) as other:
            other.execute("BEGIN")
            other.execute("SELECT pg_advisory_xact_lock(%s, hashtext(current_schema()))", (_LOCK,))

            async def release_later() -> None:
                # Unbounded, the append waited (uncancellable) until the head is free: free it
                # well after the bound, so the test ends either way.
                await trio.sleep(within + 4)
                other.execute("ROLLBACK")

            started = trio.current_time()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(release_later)
                with pytest.raises(JournalWriteError) as refused:
                    await j.append(events[1], barrier=True)
                elapsed = trio.current_time() - started
                nursery.cancel_scope.cancel()
            other.execute("ROLLBACK")
        assert within <= elapsed < within + 3, elapsed
        # The refusal names what held the write up and the setting that bounds the wait --
        # not the driver's "lock timeout", nor where the database is.
        said = str(refused.value)
        assert re.search(
            r"another session held the journal's chain head longer than \[journal\] reconnect"
            r" .*\(1 s\): not committed",
            said,
        ), said
        assert "lock timeout" not in said and pg_url.rsplit("/", 1)[1] not in said, said
        with trio.fail_after(LIMIT):
            stored = await j.append(events[1], barrier=True)
        assert stored.seq == 2


def test_a_wait_for_the_head_past_what_postgresql_counts_is_its_longest(pg_url: str) -> None:
    """The re-read after a lost commit waits for the chain head at most what is left of
    ``reconnect`` (``lock_timeout``).  ``reconnect`` may be up to 100 years; PostgreSQL's
    ``lock_timeout`` is at most 2^31-1 ms (~24.8 days) and refuses more: every re-read then
    failed at once and the writer retried it, all writes stalled, until ``reconnect`` ran out
    -- for weeks.  A longer wait is taken as the longest PostgreSQL counts."""
    backend = PostgresBackend(pg_url, reconnect_within=36500 * 86400.0)
    conn = backend.connect("writer")
    try:
        for wait in (0.0001, 2.5, 25 * 86400.0, 36500 * 86400.0):
            backend.begin(conn, barrier=False, wait=wait)
            (shown,) = conn.execute("SHOW lock_timeout").fetchone()
            backend.rollback(conn)
            assert shown != "0", (wait, shown)
        backend.begin(conn, barrier=False)
        backend.rollback(conn)
    finally:
        backend.close(conn)


async def test_a_journal_of_a_newer_schema_is_neither_written_nor_read(
    pg: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """As on SQLite: what this broker would make of a schema it does not know is not what the
    journal holds -- neither a broker nor a reader opens it (and the schema is left alone)."""
    async with Journal.open(pg_url, **_keys(tmp_path, "a")) as j:
        await j.append(until_dispatch("inv-1")[0])
    database = pg_url.rsplit("/", 1)[1]
    pg.sql("UPDATE meta SET value = '99' WHERE name = 'schema'", database)
    with pytest.raises(JournalError, match=r"newer affidavit \(schema 99; this one knows"):
        JournalReader.open(pg_url)
    with pytest.raises(JournalError, match="newer affidavit"):
        async with Journal.open(pg_url, **_keys(tmp_path, "a")):
            pass
    assert pg.sql("SELECT value FROM meta WHERE name = 'schema'", database) == [("99",)]


def test_a_server_that_may_lose_acknowledged_commits_is_refused(tmp_path: Path) -> None:
    """fsync = off (or full_page_writes = off): a commit PostgreSQL acknowledges may be lost in
    a crash, so DISPATCH_STARTED would not be durable before anything is sent.  The writer
    refuses to open the journal -- a stable error, naming the setting and the fix -- and opens
    it once the server is durable again."""
    from affidavit.cli import journal_refusal
    from affidavit.journal import JournalNotDurable
    from tests.postgres import running_cluster

    async def open_once(url: str) -> None:
        async with Journal.open(url, **_keys(tmp_path, "a")) as j:
            await j.append(until_dispatch("inv-1")[0])

    with running_cluster(fsync=False) as cluster:
        url = cluster.database()
        for setting in ("fsync", "full_page_writes"):
            with pytest.raises(JournalNotDurable) as info:
                trio.run(open_once, url)
            message = str(info.value)
            assert f"{setting} = off" in message and f"set {setting} = on" in message
            assert cluster.password not in message
            assert journal_refusal(info.value).code == "JOURNAL_NOT_DURABLE"
            cluster.sql(f"ALTER SYSTEM SET {setting} = on")
            if setting == "fsync":
                cluster.sql("ALTER SYSTEM SET full_page_writes = off")
            _reload(cluster, setting, "on")
        trio.run(open_once, url)  # durable again: opened and written
        with JournalReader.open(url, key_file=tmp_path / "shared.key") as r:
            assert [e.kind for e in r.events("inv-1")] == [E.ACTION_ACCEPTED]


def _reload(cluster: Cluster, setting: str, value: str) -> None:
    """Reload the server's configuration and wait (bounded) until a new session sees it."""
    cluster.sql("SELECT pg_reload_conf()")
    for _ in range(100):
        if cluster.sql(f"SELECT current_setting('{setting}')")[0][0] == value:
            return
        time.sleep(0.05)
    raise AssertionError(f"{setting} did not become {value}")


async def test_a_journal_whose_tables_are_unlogged_is_refused(
    pg: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """An UNLOGGED table (``ALTER TABLE ... SET UNLOGGED``, or one created so before the
    broker's first start: ``CREATE TABLE IF NOT EXISTS`` keeps it) is emptied by PostgreSQL's
    crash recovery: the lease and binding rows that keep a second broker from sending again,
    DISPATCH_STARTED itself, would be gone after a crash although every commit was
    acknowledged, as with fsync = off.  The writer refuses to open the journal, naming the
    table and the fix; a reader still reads it, and the writer opens it once it is logged."""
    from affidavit.journal import JournalNotDurable

    database = pg_url.rsplit("/", 1)[1]
    async with Journal.open(pg_url, **_keys(tmp_path, "a")) as j:
        for ev in happy("inv-1"):
            await j.append(ev)
    for table in ("leases", "idempotency"):
        pg.sql(f"ALTER TABLE {table} SET UNLOGGED", database)
        with pytest.raises(JournalNotDurable) as info:
            async with Journal.open(pg_url, **_keys(tmp_path, "a")):
                pass
        message = str(info.value)
        assert f"{table} is UNLOGGED" in message, message
        assert f"ALTER TABLE {table} SET LOGGED" in message, message
        assert pg.password not in message
        with JournalReader.open(pg_url) as r:
            assert r.verify().ok
        pg.sql(f"ALTER TABLE {table} SET LOGGED", database)
        async with Journal.open(pg_url, **_keys(tmp_path, "a")) as j:
            await j.append(happy(f"inv-{table}")[0])


async def test_a_broker_role_opening_a_schema_1_journal_is_told_to_have_the_owner_upgrade_it(
    pg: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """Schema 2 adds ``chunk_owners`` (filled once from the unmarked chunks): DDL, which a
    broker role that owns nothing may not run.  It is refused with what to do -- not "permission
    denied for schema public" -- and opens once the owner has upgraded and granted the table."""
    database = pg_url.rsplit("/", 1)[1]
    async with Journal.open(pg_url, **_keys(tmp_path, "owner")):
        pass
    pg.sql("DROP TABLE chunk_owners", database)  # as schema 1 left it
    pg.sql("ALTER TABLE idempotency DROP COLUMN send_by, DROP COLUMN target", database)  # (3's)
    broker_url = _old_broker(pg, database, 1, "old_broker", "chunk_owners")  # schema 1's grants
    message = await _refused(broker_url, tmp_path)
    assert f"has schema 1; this affidavit upgrades it to schema {SCHEMA_VERSION}" in message
    assert "only the tables' owner may do" in message and "broker-pw" not in message
    assert 'GRANT SELECT, INSERT, UPDATE, DELETE ON chunk_owners TO "old_broker"' in message
    assert 'GRANT SELECT, INSERT ON linked_calls TO "old_broker"' in message, message
    assert "no new table" not in message, message  # it names a new table and columns
    assert pg.sql("SELECT value FROM meta WHERE name = 'schema'", database) == [("1",)]
    async with Journal.open(pg_url, **_keys(tmp_path, "owner")):
        pass  # the owner's open upgrades it
    for statement in grant_statements("old_broker"):
        pg.sql(statement, database)
    async with Journal.open(broker_url, **_keys(tmp_path, "broker")) as j:
        for ev in happy("inv-1"):
            await j.append(ev)
        await j.put_result_chunk("inv-1", "body", 0, b"kept")
        await j.bind_idempotency("scope", "key", "fp", "inv-2", None, send_by=time.time() + 9)
    assert pg.sql("SELECT invocation_id FROM chunk_owners", database) == [("inv-1",)]
    assert pg.sql("SELECT count(send_by) FROM idempotency", database) == [(1,)]


async def test_a_broker_role_opening_a_schema_2_journal_is_told_only_the_owner_s_open_is_due(
    pg: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """Schema 3 adds two columns to ``idempotency``: DDL again, but ``chunk_owners`` exists and
    was granted -- the message once told the broker role to create and grant it all the same.
    It says the owner opens it once, after which the role opens it with the grants it has."""
    database = pg_url.rsplit("/", 1)[1]
    async with Journal.open(pg_url, **_keys(tmp_path, "owner")):
        pass
    pg.sql("ALTER TABLE idempotency DROP COLUMN send_by, DROP COLUMN target", database)
    broker_url = _old_broker(pg, database, 2, "old_broker2")  # chunk_owners among its grants
    message = await _refused(broker_url, tmp_path)
    assert f"has schema 2; this affidavit upgrades it to schema {SCHEMA_VERSION}" in message
    assert "idempotency.send_by and idempotency.target" in message, message
    assert "chunk_owners" not in message and "broker-pw" not in message, message
    assert "no new table or column" not in message, message
    async with Journal.open(pg_url, **_keys(tmp_path, "owner")):
        pass  # the owner's open upgrades it
    async with Journal.open(broker_url, **_keys(tmp_path, "broker")) as j:  # no new grant
        await j.bind_idempotency("s", "k", "fp", "inv-2", None, send_by=time.time() + 9, target="t")
    assert pg.sql("SELECT target FROM idempotency", database) == [("t",)]


async def test_a_broker_role_opening_a_schema_3_journal_is_told_the_owner_records_the_rules(
    pg: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """Schema 4 is the fence's rules (``FENCE_RULES``): no table or column, only the number --
    which a broker role may not change (``meta``), and must not open without: a broker of schema
    3 would then share the journal.  Schema 5's table (``linked_calls``) comes with it.  The
    message names no DDL it does not need."""
    database = pg_url.rsplit("/", 1)[1]
    async with Journal.open(pg_url, **_keys(tmp_path, "owner")):
        pass
    broker_url = _old_broker(pg, database, 3, "old_broker3")
    message = await _refused(broker_url, tmp_path)
    assert f"has schema 3; this affidavit upgrades it to schema {SCHEMA_VERSION}" in message
    assert "the fence's rules (schema 4)" in message, message
    assert "idempotency.send_by" not in message, message
    assert "a table linked_calls" in message, message
    assert 'GRANT SELECT, INSERT ON linked_calls TO "old_broker3"' in message, message
    assert "chunk_owners" not in message and "broker-pw" not in message, message
    async with Journal.open(pg_url, **_keys(tmp_path, "owner")):
        pass  # the owner's open records the number
    assert pg.sql("SELECT value FROM meta WHERE name = 'schema'", database) == [
        (str(SCHEMA_VERSION),)
    ]
    async with Journal.open(broker_url, **_keys(tmp_path, "broker")) as j:  # no new grant
        await j.bind_idempotency("s", "k", "fp", "inv-2", None, send_by=time.time() + 9, target="t")


async def test_a_broker_role_opening_a_schema_4_journal_is_told_the_owner_indexes_linked_calls(
    pg: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """Schema 5 adds ``linked_calls``, filled once from the events: DDL and a fill, which a
    broker role may not run.  It is refused with what to do; the owner's open fills the table
    from the rows already there (a claim naming a call one of them names is refused), and the
    role, granted the table, writes on."""
    database = pg_url.rsplit("/", 1)[1]
    claim = {"query_invocation": "act_q1", "code": None, "open": True}
    query = Event(E.RECONCILE_INCONCLUSIVE, "inv-1", claim, EvidenceSource.REMOTE_QUERY, None,
                  None, "o", 1)  # fmt: skip
    async with Journal.open(pg_url, **_keys(tmp_path, "owner")) as j:
        for ev in interrupted("inv-1"):
            await j.append(ev)
        await j.append(query)
    pg.sql("DROP TABLE linked_calls", database)  # as schema 4 left it
    broker_url = _old_broker(pg, database, 4, "old_broker4", "linked_calls")  # schema 4's grants
    message = await _refused(broker_url, tmp_path)
    assert f"has schema 4; this affidavit upgrades it to schema {SCHEMA_VERSION}" in message
    assert "a table linked_calls, filled once" in message, message
    assert 'GRANT SELECT, INSERT ON linked_calls TO "old_broker4"' in message, message
    assert "fence" not in message and "chunk_owners" not in message, message
    assert "broker-pw" not in message
    async with Journal.open(pg_url, **_keys(tmp_path, "owner")):
        pass  # the owner's open upgrades and fills it
    assert pg.sql("SELECT seq FROM linked_calls", database) == [(len(interrupted("inv-1")) + 1,)]
    with pytest.raises(JournalError, match="may not SELECT, INSERT on table linked_calls"):
        async with Journal.open(broker_url, **_keys(tmp_path, "broker")):
            pass  # not granted yet: refused at open, not at its first claim
    for statement in grant_statements("old_broker4"):
        pg.sql(statement, database)
    async with Journal.open(broker_url, **_keys(tmp_path, "broker")) as j:
        with pytest.raises(ImpossibleEvent, match="act_q1 is named by an earlier row"):
            await j.append(query)
        closed = {"query_invocation": "act_q1", "code": "APPROVAL_DENIED", "reason": "read"}
        await j.append(Event(E.RECONCILE_INCONCLUSIVE, "inv-1", closed, EvidenceSource.REMOTE_QUERY,
                             None, None, "o", 2))  # fmt: skip
    assert len(pg.sql("SELECT seq FROM linked_calls", database)) == 2


async def test_a_broker_role_opening_a_schema_5_journal_is_told_the_owner_records_schema_6(
    pg: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """Schema 6 is APPROVAL_REVOKED's rules: a number only, which a broker role may not write
    (``meta``).  It is told the owner's open, and no grant (nothing new to grant); the owner's
    open records the number, and the role then writes on with the grants it had."""
    database = pg_url.rsplit("/", 1)[1]
    async with Journal.open(pg_url, **_keys(tmp_path, "owner")) as j:
        for ev in happy("inv-1"):
            await j.append(ev)
    broker_url = _old_broker(pg, database, 5, "old_broker5")
    message = await _refused(broker_url, tmp_path)
    assert f"has schema 5; this affidavit upgrades it to schema {SCHEMA_VERSION}" in message
    assert "(the rules of APPROVAL_REVOKED (schema 6), the triggers'" in message, message
    assert "GRANT" not in message and "linked_calls" not in message, message
    assert "broker-pw" not in message
    async with Journal.open(pg_url, **_keys(tmp_path, "owner")):
        pass  # the owner's open records the number
    assert pg.sql("SELECT value FROM meta WHERE name = 'schema'", database) == [
        (str(SCHEMA_VERSION),)
    ]
    async with Journal.open(broker_url, **_keys(tmp_path, "broker")) as j:  # no new grant
        for ev in happy("inv-2"):
            await j.append(ev)


async def test_a_journal_of_schema_5_that_lost_linked_calls_is_made_whole_by_its_owner(
    pg: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """``linked_calls`` dropped by whoever owns the tables: the owner's open makes and fills it
    again (every open failed before, the owner's too: 'relation ... does not exist'); a broker
    role, which may not, is told that step and the grant."""
    database = pg_url.rsplit("/", 1)[1]
    claim = {"query_invocation": "act_q1", "code": None, "open": True}
    query = Event(E.RECONCILE_INCONCLUSIVE, "inv-1", claim, EvidenceSource.REMOTE_QUERY, None,
                  None, "o", 1)  # fmt: skip
    async with Journal.open(pg_url, **_keys(tmp_path, "owner")) as j:
        for ev in interrupted("inv-1"):
            await j.append(ev)
        await j.append(query)
    pg.sql("DROP ROLE IF EXISTS broker5")
    pg.sql("CREATE ROLE broker5 LOGIN PASSWORD 'broker-pw'")
    for statement in grant_statements("broker5"):
        pg.sql(statement, database)
    pg.sql("DROP TABLE linked_calls", database)
    broker_url = pg.url(database, user="broker5", password="broker-pw")
    with pytest.raises(JournalError) as refused:
        async with Journal.open(broker_url, **_keys(tmp_path, "broker")):
            pass
    message = str(refused.value)
    assert f"records schema {SCHEMA_VERSION} but has no table linked_calls" in message, message
    assert "open it once as the owner" in message, message
    assert 'GRANT SELECT, INSERT ON linked_calls TO "broker5"' in message, message
    assert "broker-pw" not in message
    async with Journal.open(pg_url, **_keys(tmp_path, "owner")):
        pass  # the owner's open makes and fills it again
    assert pg.sql("SELECT seq FROM linked_calls", database) == [(len(interrupted("inv-1")) + 1,)]
    for statement in grant_statements("broker5"):
        pg.sql(statement, database)
    async with Journal.open(broker_url, **_keys(tmp_path, "broker")) as j:
        with pytest.raises(ImpossibleEvent, match="act_q1 is named by an earlier row"):
            await j.append(query)
    with JournalReader.open(pg_url) as r:
        assert r.verify().ok


async def test_a_broker_role_not_granted_chunk_owners_is_refused_at_open_not_after_a_dispatch(
    pg: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """The owner upgraded the journal to schema 2 but the broker role keeps schema 1's grants:
    it opened without a word and every result's first chunk (and every marker, which takes the
    name out of ``chunk_owners``) was refused -- after the request was sent, so each call ended
    with its result lost.  The writer's open refuses it instead, naming the grant; a reader
    (no write) still opens."""
    database = pg_url.rsplit("/", 1)[1]
    async with Journal.open(pg_url, **_keys(tmp_path, "owner")) as j:
        for ev in happy("inv-0"):
            await j.append(ev)
    pg.sql("DROP ROLE IF EXISTS ungranted_broker")
    pg.sql("CREATE ROLE ungranted_broker LOGIN PASSWORD 'broker-pw'")
    for statement in grant_statements("ungranted_broker"):
        pg.sql(statement.replace(", chunk_owners", ""), database)  # schema 1's grants
    broker_url = pg.url(database, user="ungranted_broker", password="broker-pw")
    with pytest.raises(JournalError) as refused:
        async with Journal.open(broker_url, **_keys(tmp_path, "broker")) as j:
            for ev in until_dispatch("inv-1"):
                await j.append(ev)
            await j.put_result_chunk("inv-1", "body", 0, b"lost")
    message = str(refused.value)
    assert "chunk_owners" in message and "GRANT" in message, message
    assert "broker-pw" not in message
    assert pg.sql("SELECT count(*) FROM events WHERE invocation_id = 'inv-1'", database) == [(0,)]
    with JournalReader.open(broker_url) as r:
        assert r.verify(accept_unsigned=True).ok
    for statement in grant_statements("ungranted_broker"):
        pg.sql(statement, database)
    async with Journal.open(broker_url, **_keys(tmp_path, "broker")) as j:
        for ev in until_dispatch("inv-1"):
            await j.append(ev)
        await j.put_result_chunk("inv-1", "body", 0, b"kept")
