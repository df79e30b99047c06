"""APPROVAL_REVOKED's rules are a schema of their own (SQLite schema 12, PostgreSQL schema 6),
though no table or column changes: a broker without them, sharing the journal, reads the row as
altered -- tampering, where an operator took a grant back -- and, knowing neither the revoke's
end of the record nor the gate's re-check of the granting operator, would send the revoked
grant's request.  So a broker of the schema before refuses a journal a broker with the rules has
opened ("newer affidavit", not tampering), and a writer with them opening a journal from before
records the new number, its rows read as before.  Both backends (docs/journal.md)."""

from __future__ import annotations

import pytest
import trio

from affidavit.journal import JournalError
from affidavit.journal.postgres import SCHEMA_VERSION as PG_SCHEMA
from affidavit.journal.sqlite import SCHEMA_VERSION as SQLITE_SCHEMA

from ..helpers import happy
from .conftest import Place

BEFORE = {"sqlite": 11, "postgresql": 5}
"""The last schema of each backend without APPROVAL_REVOKED's rules."""


async def _write(place: Place, iid: str) -> None:
    async with place.open() as j:
        for ev in happy(iid):
            await j.append(ev)


def _schema(place: Place) -> list[tuple[str]]:
    return place.rows("SELECT value FROM meta WHERE name = 'schema'")


def test_a_broker_without_the_revoke_s_rules_refuses_the_journal(
    place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    from affidavit.journal import postgres, sqlite_schema

    trio.run(_write, place, "inv-a")
    now = SQLITE_SCHEMA if place.kind == "sqlite" else PG_SCHEMA
    assert _schema(place) == [(str(now),)]
    module = sqlite_schema if place.kind == "sqlite" else postgres
    monkeypatch.setattr(module, "SCHEMA_VERSION", BEFORE[place.kind])
    with pytest.raises(JournalError, match=rf"newer affidavit \(schema {now}; this one knows"):
        trio.run(_write, place, "inv-b")
    with pytest.raises(JournalError, match=rf"newer affidavit \(schema {now};"):
        place.reader()  # nor read: it would read APPROVAL_REVOKED as an altered row


def test_a_journal_from_before_the_revoke_s_rules_is_upgraded_by_a_writer_with_them(
    place: Place,
) -> None:
    trio.run(_write, place, "inv-old")
    old = str(BEFORE[place.kind])
    place.tamper(f"UPDATE meta SET value = '{old}' WHERE name = 'schema'")
    with place.reader() as r:  # read-only: read as it is, not upgraded
        assert r.verify().ok
    assert _schema(place) == [(old,)]
    trio.run(_write, place, "inv-new")
    now = SQLITE_SCHEMA if place.kind == "sqlite" else PG_SCHEMA
    assert now > BEFORE[place.kind]
    assert _schema(place) == [(str(now),)]
    with place.reader() as r:
        assert r.verify().ok
