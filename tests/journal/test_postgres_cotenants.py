"""Other roles on the shared journal's cluster (audit 51c): a role with CREATE on the database
shadowing the journal's tables through the default ``search_path``, a login role granted nothing
holding the chain head's advisory lock, a broker role granted too little, and a role's default
isolation level.  docs/journal.md, "Other roles on the cluster"."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psycopg
import pytest
import trio

from affidavit.journal import Journal, JournalError, JournalReader, SigningKey
from affidavit.journal.errors import HeadHeld
from affidavit.journal.migrate import migrate
from affidavit.journal.postgres import (
    _LOCK,
    FUNCTION_PATH,
    SCHEMA,
    SCHEMA_VERSION,
    grant_statements,
)
from tests.postgres import Cluster

from .helpers import FINGERPRINT, accepted, happy, until_dispatch

LIMIT = 60
_SHADOW = (
    SCHEMA.split("CREATE OR REPLACE FUNCTION")[0]
    + f"INSERT INTO meta VALUES ('schema', '{SCHEMA_VERSION}');"
)
"""The journal's tables without their triggers, recorded at this schema: a broker reading it
would find nothing to refuse."""


def _keys(tmp: Path, name: str) -> dict[str, Path]:
    return {"key_file": tmp / "shared.key", "signing_key": tmp / f"{name}.signing.key"}


def _broker(pg: Cluster, database: str, role: str) -> str:
    """A login ``role`` holding exactly ``grant_statements`` on ``database``: its URL."""
    pg.sql(f"CREATE ROLE {role} LOGIN PASSWORD 'broker-pw'")
    for statement in grant_statements(role):
        pg.sql(statement, database)
    return pg.url(database, user=role, password="broker-pw")


async def _owner_opens(pg_url: str, tmp_path: Path) -> None:
    async with Journal.open(pg_url, **_keys(tmp_path, "owner")) as j:
        for ev in happy("own-1"):
            await j.append(ev, barrier=True)


def _shadow(pg: Cluster, database: str, broker: str, ddl: str) -> str:
    """A co-tenant granted CREATE on the database makes a schema named like the broker's role
    -- first in the server's default ``search_path`` ``"$user", public`` -- runs ``ddl`` there
    and lets the broker role use it: its URL."""
    tenant = f"{database}_tenant"
    pg.sql(f"CREATE ROLE {tenant} LOGIN PASSWORD 'tenant-pw'")
    pg.sql(f'GRANT CREATE ON DATABASE "{database}" TO {tenant}')
    url = pg.url(database, user=tenant, password="tenant-pw")
    with psycopg.connect(url, autocommit=True) as t:
        t.execute(f"CREATE SCHEMA {broker}")
        t.execute(f"SET search_path = {broker}")
        t.execute(ddl)
        t.execute(f"GRANT USAGE ON SCHEMA {broker} TO {broker}")
        t.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA {broker} TO {broker}")
    return url


async def test_a_co_tenant_s_schema_named_like_the_broker_role_does_not_take_its_journal(
    pg: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """audit 51c S1: the same tables, without the append-only triggers, in the co-tenant's
    schema ``<broker role>``: the broker wrote and read there, the tenant deleted its tail and
    ``verify`` as the broker role said ok.  With the search_path pinned the broker writes
    ``public`` and the tenant's tables stay empty."""
    database = pg_url.rsplit("/", 1)[1]
    await _owner_opens(pg_url, tmp_path)
    broker = f"{database}_broker"
    broker_url = _broker(pg, database, broker)
    _shadow(pg, database, broker, _SHADOW)
    with trio.fail_after(LIMIT):
        async with Journal.open(broker_url, **_keys(tmp_path, "broker")) as j:
            for ev in happy("brk-1"):
                await j.append(ev, barrier=True)
    assert pg.sql(f"SELECT count(*) FROM {broker}.events", database) == [(0,)]
    assert pg.sql(f"SELECT count(*) FROM {broker}.meta", database) == [(1,)]  # its own row
    mine = pg.sql("SELECT count(*) FROM public.events WHERE invocation_id = 'brk-1'", database)
    assert mine == [(len(happy("brk-1")),)]
    with JournalReader.open(broker_url) as r:
        report = r.verify()
        assert [e.kind for e in r.events("brk-1")] == [e.kind for e in happy("brk-1")]
    # public's rows, the owner's and the broker's: the shadow's events are none
    assert report.ok and report.count == 2 * len(happy("x")), report


async def test_a_shadow_made_after_the_open_is_not_what_the_broker_reads(
    pg: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """A read outside a write transaction, on a connection made before the co-tenant's schema
    appeared: unpinned, its unqualified names meant the shadow's (empty) tables from then on."""
    database = pg_url.rsplit("/", 1)[1]
    await _owner_opens(pg_url, tmp_path)
    broker = f"{database}_broker"
    broker_url = _broker(pg, database, broker)
    with trio.fail_after(LIMIT):
        async with Journal.open(broker_url, **_keys(tmp_path, "broker")) as j:
            for ev in happy("brk-1"):
                await j.append(ev, barrier=True)
            _shadow(pg, database, broker, _SHADOW)
            assert len(j.events("own-1")) == len(happy("own-1"))
            assert len(j.events("brk-1")) == len(happy("brk-1"))


async def test_a_co_tenant_s_shadow_idempotency_table_does_not_hold_the_broker_s_bindings(
    pg: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """audit 51c S1b: only ``idempotency`` shadowed (events stay in ``public``, the owner's
    verify clean); the tenant deleted the binding and a retry with the same key was bound anew
    -- a second send.  Pinned: the binding is ``public``'s, and the retry finds it."""
    database = pg_url.rsplit("/", 1)[1]
    await _owner_opens(pg_url, tmp_path)
    broker = f"{database}_broker"
    broker_url = _broker(pg, database, broker)
    ddl = next(s for s in SCHEMA.split(";") if "TABLE IF NOT EXISTS idempotency" in s)
    tenant_url = _shadow(pg, database, broker, ddl)

    async def bind(iid: str) -> str:
        async with Journal.open(broker_url, **_keys(tmp_path, "broker")) as j:
            rec = await j.bind_idempotency("scope", "pay-once", FINGERPRINT, iid, None)
            if rec.invocation_id == iid:
                for ev in [accepted(iid, idem=("scope", "pay-once")), *happy(iid)[1:4]]:
                    await j.append(ev, barrier=True)
            return str(rec.invocation_id)

    with trio.fail_after(LIMIT):
        assert await bind("inv-A") == "inv-A"
    with psycopg.connect(tenant_url, autocommit=True) as t:
        assert t.execute(f"SELECT count(*) FROM {broker}.idempotency").fetchone() == (0,)
        t.execute(f"DELETE FROM {broker}.idempotency")
    with trio.fail_after(LIMIT):
        assert await bind("inv-C") == "inv-A"  # bound: no second send
    rows = pg.sql("SELECT invocation_id FROM public.idempotency", database)
    assert rows == [("inv-A",)]
    with JournalReader.open(pg_url) as r:
        assert r.verify().ok


def test_a_role_granted_nothing_holding_the_chain_head_refuses_an_open_after_reconnect(
    pg: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """audit 51c S2: any login role may take the chain head's advisory lock (its key is fixed);
    the open's transaction waited for it without bound -- every broker's start stalled.  It is
    bounded by ``reconnect`` like every write, and the refusal names the holder (pid, role) an
    operator ends.  (The holder lets go after HOLD s: without the bound the open succeeds
    then, and the test fails.)"""
    database = pg_url.rsplit("/", 1)[1]
    trio.run(_owner_opens, pg_url, tmp_path)
    broker_url = _broker(pg, database, f"{database}_broker")
    nobody = f"{database}_nobody"
    pg.sql(f"CREATE ROLE {nobody} LOGIN PASSWORD 'nobody-pw'")
    holder = psycopg.connect(pg.url(database, user=nobody, password="nobody-pw"), autocommit=True)
    hold = 15.0
    release = threading.Timer(hold, holder.close)
    try:
        holder.execute("SELECT pg_advisory_lock(%s, hashtext('public'))", (_LOCK,))
        pid = holder.info.backend_pid
        release.start()

        async def open_broker() -> None:
            async with Journal.open(broker_url, **_keys(tmp_path, "broker"), reconnect_within=1):
                pass

        started = time.monotonic()
        with pytest.raises(HeadHeld) as refused:
            trio.run(open_broker)
        assert time.monotonic() - started < hold
    finally:
        release.cancel()
        holder.close()
    message = str(refused.value)
    assert f"held by pid {pid}, role {nobody}" in message, message
    assert "(1 s)" in message and "pw" not in message, message


_THIN = [
    ("results", "INSERT"),
    ("result_chunks", "INSERT"),
    ("checkpoints", "INSERT"),
    ("idempotency", "INSERT"),
    ("leases", "SELECT"),
    ("leases", "UPDATE"),
    ("leases", "DELETE"),
]


@pytest.mark.parametrize(("table", "privilege"), _THIN, ids=[f"{t}-{p}" for t, p in _THIN])
async def test_a_broker_role_lacking_any_granted_privilege_is_refused_at_open(
    pg: Cluster, pg_url: str, tmp_path: Path, table: str, privilege: str
) -> None:
    """audit 51c S3/S4: open checked only chunk_owners and linked_calls; a role without INSERT
    on results opened, made DISPATCH_STARTED durable and lost the result after the send.  Every
    pair ``grant_statements`` lists is checked at open: refused, naming the grant, before
    anything is written."""
    database = pg_url.rsplit("/", 1)[1]
    await _owner_opens(pg_url, tmp_path)
    role = f"{database}_thin"
    url = _broker(pg, database, role)
    pg.sql(f"REVOKE {privilege} ON {table} FROM {role}", database)
    with trio.fail_after(LIMIT), pytest.raises(JournalError) as refused:
        async with Journal.open(url, **_keys(tmp_path, "broker")) as j:
            for ev in until_dispatch("thin-1"):
                await j.append(ev, barrier=True)
    message = str(refused.value)
    assert f"may not {privilege} on table {table} " in message, message
    assert f"ON {table} TO " in message and "broker-pw" not in message, message
    assert pg.sql("SELECT count(*) FROM events WHERE invocation_id = 'thin-1'", database) == [(0,)]


async def test_two_brokers_write_on_under_a_role_default_of_repeatable_read(
    pg: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """audit 51c S6: ``ALTER ROLE ... SET default_transaction_isolation = 'repeatable read'``
    made the head read after the lock a snapshot's from before another broker's commit: writes
    refused with a duplicate key.  Each write transaction asks for READ COMMITTED."""
    database = pg_url.rsplit("/", 1)[1]
    await _owner_opens(pg_url, tmp_path)
    role = f"{database}_rr"
    url = _broker(pg, database, role)
    pg.sql(f"ALTER ROLE {role} SET default_transaction_isolation = 'repeatable read'")
    errors: list[str] = []

    async def broker(name: str) -> None:
        async with Journal.open(url, **_keys(tmp_path, name)) as j:
            for n in range(10):
                for ev in happy(f"{name}-{n}"):
                    try:
                        await j.append(ev, barrier=True)
                    except JournalError as exc:
                        errors.append(str(exc))
                        break

    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(broker, "a")
            nursery.start_soon(broker, "b")
    assert errors == []
    with JournalReader.open(url) as r:
        report = r.verify()
    assert report.ok and report.count == 21 * len(happy("x")), report


def test_a_session_s_own_events_table_does_not_decide_what_extends_the_chain(
    pg: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """The chain trigger's function read ``events`` by the inserting session's search_path,
    where ``pg_temp`` comes first unless named: a broker role (INSERT on events, TEMP on the
    database by default) made a temporary ``events`` holding a head of its choosing and
    appended a row after it -- a gap in the chain the database accepted.  Schema 7 pins the
    functions' search_path: refused."""
    database = pg_url.rsplit("/", 1)[1]
    trio.run(_owner_opens, pg_url, tmp_path)
    url = _broker(pg, database, f"{database}_broker")
    with psycopg.connect(url, autocommit=True) as b:
        b.execute("CREATE TEMP TABLE events (seq BIGINT, hash TEXT)")
        b.execute("INSERT INTO pg_temp.events VALUES (100, 'forged')")
        with pytest.raises(psycopg.errors.IntegrityConstraintViolation, match="hash chain"):
            b.execute(
                "INSERT INTO public.events (seq, at, invocation_id, kind, source, attrs, "
                "prev_hash, hash) VALUES (101, 0, 'x', 'ACTION_ACCEPTED', 's', '{}', 'forged', "
                "'h')"
            )
    with JournalReader.open(pg_url) as r:
        assert r.verify().ok


async def test_a_broker_role_opening_a_schema_6_journal_is_told_the_owner_pins_the_triggers(
    pg: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """Schema 7 replaces the triggers' functions, which only their owner may: a broker role
    opening a journal of schema 6 is told the owner's open (no grant); the owner's open pins
    both functions' search_path and records 7; the role then writes on."""
    database = pg_url.rsplit("/", 1)[1]
    await _owner_opens(pg_url, tmp_path)
    unpinned = SCHEMA.replace(f"\n  SET search_path = {FUNCTION_PATH} AS $$", " AS $$")
    assert unpinned != SCHEMA
    with psycopg.connect(pg_url, autocommit=True) as owner:
        owner.execute(unpinned)  # the functions as schema 6 made them
    pg.sql("UPDATE meta SET value = '6' WHERE name = 'schema'", database)
    url = _broker(pg, database, f"{database}_broker")
    with pytest.raises(JournalError) as refused:
        async with Journal.open(url, **_keys(tmp_path, "broker")):
            pass
    message = str(refused.value)
    assert "has schema 6; this affidavit upgrades it to schema 7" in message, message
    assert "(the triggers' functions' pinned search_path (schema 7))" in message, message
    assert "GRANT" not in message and "broker-pw" not in message, message
    async with Journal.open(pg_url, **_keys(tmp_path, "owner")):
        pass  # the owner's open upgrades it
    assert pg.sql("SELECT value FROM meta WHERE name = 'schema'", database) == [("7",)]
    paths = pg.sql(
        "SELECT proname, proconfig FROM pg_proc WHERE proname LIKE 'affidavit%%' ORDER BY 1",
        database,
    )
    assert paths == [
        ("affidavit_append_only", [f"search_path={FUNCTION_PATH}"]),
        ("affidavit_extend_chain", [f"search_path={FUNCTION_PATH}"]),
    ], paths
    async with Journal.open(url, **_keys(tmp_path, "broker")) as j:
        for ev in happy("brk-1"):
            await j.append(ev)


def test_a_migrate_into_a_journal_whose_head_is_held_is_refused_after_reconnect(
    pg: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """``journal migrate``'s one transaction on the target waited for the chain head without
    bound, as a broker's open did: a role granted nothing holding the lock stalled it.  Bounded
    by the target's ``reconnect`` (10 s by default), the holder named; nothing copied.  (The
    holder lets go after HOLD s: without the bound the copy succeeds then, and the test
    fails.)"""
    database = pg_url.rsplit("/", 1)[1]
    db = tmp_path / "j.db"

    async def source() -> None:
        async with Journal.open(db) as j:
            for ev in happy("inv-1"):
                await j.append(ev)

    trio.run(source)
    public = SigningKey.load(f"{db}.signing.key").public_raw
    nobody = f"{database}_nobody"
    pg.sql(f"CREATE ROLE {nobody} LOGIN PASSWORD 'nobody-pw'")
    holder = psycopg.connect(pg.url(database, user=nobody, password="nobody-pw"), autocommit=True)
    hold = 25.0
    release = threading.Timer(hold, holder.close)
    try:
        holder.execute("SELECT pg_advisory_lock(%s, hashtext('public'))", (_LOCK,))
        release.start()
        started = time.monotonic()
        with pytest.raises(HeadHeld, match=f"held by pid {holder.info.backend_pid}, role {nobody}"):
            migrate(db, pg_url, public_keys=[public])
        assert time.monotonic() - started < hold
    finally:
        release.cancel()
        holder.close()
    assert pg.sql("SELECT pg_catalog.to_regclass('events') IS NULL", database) == [(True,)]
