"""SQLite schema 5: ``events_accepted_key`` indexes the chained ACTION_ACCEPTED events by the
idempotency key they name, so a key lookup that finds no binding row also asks the chain
(journal/bindings.py): a deleted binding is refused at the next bind of its key, never bound
anew.  A journal from before schema 5 gains the index when a writer opens it; one that a newer
broker wrote is not opened by an older one (``_refuse_newer``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from affidavit.journal import Journal, JournalError, JournalReader, sqlite_schema
from affidavit.journal.rows import AlteredRow
from affidavit.journal.sqlite import SCHEMA_VERSION, SqliteTables
from affidavit.statemachine import Event
from affidavit.statemachine import EventKind as E

from .helpers import sql

SCOPE = "payments.create"
ODD_KEY = 'k\u00e9"\\\n\x01\u2028\U0001f600'
"""A key as JSON escapes it: SQLite's json_extract must read back the same string."""


def _accepted(iid: str, key: str, fp: str) -> Event:
    idem = {"key": key, "scope": SCOPE, "header": "Idempotency-Key", "retention_s": 3600.0,
            "expires_at": 2e9}  # fmt: skip
    op: dict[str, Any] = {"target": "api", "protocol": "http", "fingerprint": fp, "budget": 3,
                          "idempotent": False, "idempotency": idem}  # fmt: skip
    return Event(E.ACTION_ACCEPTED, iid, {"operation": op, "session": None})


async def _fill(db: Path) -> dict[str, int]:
    """Bound and accepted, as the engine does (bind, then ACTION_ACCEPTED)."""
    seqs = {}
    async with Journal.open(db) as j:
        for iid, key in (("inv-a", "key-a"), ("inv-b", ODD_KEY), ("inv-c", "key-c")):
            await j.bind_idempotency(SCOPE, key, "sha256:" + iid, iid, 2e9)
            seqs[iid] = (await j.append(_accepted(iid, key, "sha256:" + iid), barrier=True)).seq
    return seqs


def _index(db: Path) -> list[tuple[Any, ...]]:
    return sql(db, "SELECT name FROM sqlite_master WHERE name = 'events_accepted_key'")


async def test_a_deleted_binding_is_refused_at_the_next_bind(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    seqs = await _fill(db)
    assert sql(db, "SELECT value FROM meta WHERE name = 'schema'") == [(str(SCHEMA_VERSION),)]
    plan = sql(db, "EXPLAIN QUERY PLAN " + SqliteTables.SQL["accepted_with_key"].replace(
        "?", "'k'"))  # fmt: skip
    assert "USING INDEX events_accepted_key" in " ".join(str(row[3]) for row in plan)
    sql(db, "DELETE FROM idempotency WHERE invocation_id IN ('inv-a', 'inv-b')")
    async with Journal.open(db) as j:
        for iid, key in (("inv-a", "key-a"), ("inv-b", ODD_KEY)):
            with pytest.raises(AlteredRow, match="binding was altered") as exc:
                await j.bind_idempotency(SCOPE, key, "sha256:" + iid, "inv-new", 2e9)
            assert f"ACTION_ACCEPTED at seq {seqs[iid]} names it" in str(exc.value)
            assert key not in str(exc.value)
        # The same key in another scope, and a new key: bound as ever.
        assert (await j.bind_idempotency("other", "key-a", "fp", "inv-o", None)).key == "key-a"
        assert (await j.bind_idempotency(SCOPE, "key-n", "fp", "inv-n", None)).key == "key-n"
        bound = await j.bind_idempotency(SCOPE, "key-c", "sha256:inv-c", "inv-x", 2e9)
        assert bound.invocation_id == "inv-c"  # found: the chain is not asked
    assert sql(db, "SELECT count(*) FROM idempotency WHERE scope = 'payments.create'") == [(2,)]
    with JournalReader.open(db) as r:
        report = r.verify()
    assert (report.ok, report.first_bad_seq) == (False, seqs["inv-a"])
    assert "no binding row" in report.reason


async def test_a_journal_from_before_schema_5_gains_the_index_when_a_writer_opens_it(
    tmp_path: Path,
) -> None:
    """As schema 4 left it: no index.  Read-only, it reads as before; the writer builds the
    index over the events it has -- past an altered row whose attrs are not JSON, which the
    index leaves out (``verify`` reports that row) -- in its opening transaction."""
    db = tmp_path / "old.db"
    seqs = await _fill(db)
    sql(
        db,
        "DROP INDEX events_accepted_key",
        "UPDATE meta SET value = '4' WHERE name = 'schema'",
        "DROP TRIGGER events_no_update",
        f"UPDATE events SET attrs = '{{not json' WHERE seq = {seqs['inv-b']}",
        "DELETE FROM idempotency WHERE key = 'key-a'",
    )
    with JournalReader.open(db) as r:  # read-only: no upgrade
        assert r.record("inv-a") is not None
    assert _index(db) == [] and sql(db, "SELECT value FROM meta WHERE name = 'schema'") == [("4",)]
    async with Journal.open(db) as j:
        assert _index(db) == [("events_accepted_key",)]
        with pytest.raises(AlteredRow, match="binding was altered"):
            await j.bind_idempotency(SCOPE, "key-a", "sha256:inv-a", "inv-new", 2e9)
    assert sql(db, "SELECT value FROM meta WHERE name = 'schema'") == [(str(SCHEMA_VERSION),)]


async def test_a_dropped_index_answers_the_same(tmp_path: Path) -> None:
    """The index is not evidence, only a way to the events: dropped (by someone who can write
    the file), the same query reads the table and finds the same event."""
    db = tmp_path / "j.db"
    seqs = await _fill(db)
    sql(db, "DROP INDEX events_accepted_key", "DELETE FROM idempotency WHERE key = 'key-a'")
    with JournalReader.open(db) as r:
        assert r.tables.accepted_with_key(SCOPE, "key-a") == (seqs["inv-a"], "inv-a")
        assert r.tables.accepted_with_key(SCOPE, ODD_KEY) == (seqs["inv-b"], "inv-b")
        assert r.tables.accepted_with_key("other", "key-a") is None


async def test_an_older_broker_neither_writes_nor_reads_a_schema_5_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A schema-4 broker would bind a deleted key anew: it refuses the file instead."""
    db = tmp_path / "j.db"
    await _fill(db)
    monkeypatch.setattr(sqlite_schema, "SCHEMA_VERSION", 4)
    newer = rf"newer affidavit \(schema {SCHEMA_VERSION}; this one knows schema 4"
    with pytest.raises(JournalError, match=newer):
        JournalReader.open(db)
    with pytest.raises(JournalError, match="newer affidavit"):
        async with Journal.open(db):
            pass
