"""``idempotency.send_by`` and ``idempotency.target`` (SQLite schema 9, PostgreSQL schema 3):
the binder's own send deadline, bound with the key in the clock leases are judged by
(``IdempotencyRecord.send_by``; ``engine/binder.py`` waits it out while nothing is recorded
under the key), and its target (which a fence names).  A journal from before the columns gains
them when a writer opens it, its rows holding NULL (judged as before); a read-only reader of
such a journal reads its bindings with NULL there (on PostgreSQL decided by the schema it
records: a failed read would abort its transaction).  Both backends."""

from __future__ import annotations

import time

import pytest
import trio

from affidavit.journal.postgres import SCHEMA_VERSION as PG_SCHEMA
from affidavit.journal.rows import AlteredRow
from affidavit.journal.sqlite import SCHEMA_VERSION as SQLITE_SCHEMA
from affidavit.statemachine import Event
from affidavit.statemachine import EventKind as E

from .conftest import Place

SCOPE = "payments.create"


def _accepted(iid: str, key: str) -> Event:
    op = {"target": "api", "protocol": "http", "fingerprint": "sha256:" + iid, "budget": 3,
          "idempotent": False, "idempotency": {"key": key, "scope": SCOPE}}  # fmt: skip
    return Event(E.ACTION_ACCEPTED, iid, {"operation": op, "session": None})


async def _bind(place: Place, iid: str, key: str, send_by: float | None) -> object:
    target = None if send_by is None else "api"  # bound as a broker of its schema binds
    async with place.open() as j:
        bound = await j.bind_idempotency(
            SCOPE, key, "sha256:" + iid, iid, None, send_by=send_by, target=target
        )
        await j.append(_accepted(iid, key), barrier=True)
    return bound


def _schema(place: Place) -> str:
    return str(SQLITE_SCHEMA if place.kind == "sqlite" else PG_SCHEMA)


def test_the_binder_s_deadline_is_bound_with_the_key(place: Place) -> None:
    deadline = time.time() + 30.0
    bound = trio.run(_bind, place, "inv-a", "key-a", deadline)
    (stored,) = place.rows("SELECT send_by, target FROM idempotency")
    assert bound.send_by == stored[0]  # type: ignore[attr-defined]
    assert bound.target == stored[1] == "api"  # type: ignore[attr-defined]
    # In the lease clock: the writer's own on SQLite, the database's (moved by their offset,
    # a moment on one host) on PostgreSQL.
    assert abs(stored[0] - deadline) < (0.0 if place.kind == "sqlite" else 5.0) + 1e-9
    with place.reader() as r:
        assert r.verify().ok
    if place.kind != "sqlite":
        return  # (PostgreSQL keeps the column's type: only SQLite's affinity stores text there)
    place.tamper("UPDATE idempotency SET send_by = 'soon'")

    async def again() -> None:
        async with place.open() as j:
            await j.bind_idempotency(SCOPE, "key-a", "sha256:inv-a", "inv-b", None)

    with pytest.raises(AlteredRow, match="a column is not of its type"):
        trio.run(again)


def test_a_journal_from_before_the_column_gains_it(place: Place) -> None:
    """As the previous schema left it: no columns.  A writer's opening transaction adds them;
    the binding made before reads NULL there, one made after holds its deadline and target."""
    trio.run(_bind, place, "inv-old", "key-old", None)
    old = "8" if place.kind == "sqlite" else "2"
    place.tamper(
        "ALTER TABLE idempotency DROP COLUMN send_by",
        "ALTER TABLE idempotency DROP COLUMN target",
        f"UPDATE meta SET value = '{old}' WHERE name = 'schema'",
    )
    # Read-only (an auditor's ``journal verify`` before any writer of the new version opened
    # it), no upgrade: its bindings read with NULL there -- on PostgreSQL too, where the reads
    # named the missing columns (column "send_by" does not exist).
    with place.reader() as r:
        found = r.find_idempotency(SCOPE, "key-old")
        assert found is not None and found.send_by is found.target is None, found
        assert r.verify().ok  # (every binding row against its ACTION_ACCEPTED)
    assert place.rows("SELECT value FROM meta WHERE name = 'schema'") == [(old,)]
    deadline = time.time() + 30.0
    trio.run(_bind, place, "inv-new", "key-new", deadline)
    rows = place.rows("SELECT key, send_by, target FROM idempotency ORDER BY key")
    assert rows[0][0] == "key-new" and rows[0][1] is not None and rows[0][2] == "api"
    assert rows[1] == ("key-old", None, None)
    assert place.rows("SELECT value FROM meta WHERE name = 'schema'") == [(_schema(place),)]


def test_a_broker_from_before_the_column_refuses_the_journal(
    place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It would bind without a deadline and judge another broker's binding by its own window."""
    from affidavit.journal import JournalError, postgres, sqlite_schema

    trio.run(_bind, place, "inv-a", "key-a", time.time() + 30.0)
    if place.kind == "sqlite":
        monkeypatch.setattr(sqlite_schema, "SCHEMA_VERSION", 8)  # the last without it
    else:
        monkeypatch.setattr(postgres, "SCHEMA_VERSION", 2)
    with pytest.raises(JournalError, match=rf"newer affidavit \(schema {_schema(place)};"):
        trio.run(_bind, place, "inv-b", "key-b", None)
