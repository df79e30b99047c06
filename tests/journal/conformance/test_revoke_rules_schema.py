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

from ..helpers import happy
from . import schemakit
from .conftest import Place

BEFORE = {"sqlite": 11, "postgresql": 5}
"""The last schema of each backend without APPROVAL_REVOKED's rules."""


async def _write(place: Place, iid: str) -> None:
    async with place.open() as j:
        for ev in happy(iid):
            await j.append(ev)


def test_a_broker_without_the_revoke_s_rules_refuses_the_journal(
    place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    # nor read: it would read APPROVAL_REVOKED as an altered row
    trio.run(_write, place, "inv-a")
    schemakit.refused_by_the_schema_before(
        place, monkeypatch, BEFORE[place.kind], lambda: trio.run(_write, place, "inv-b")
    )


def test_a_journal_from_before_the_revoke_s_rules_is_upgraded_by_a_writer_with_them(
    place: Place,
) -> None:
    iids = iter(["inv-old", "inv-new"])
    schemakit.upgraded_from_the_schema_before(
        place, BEFORE[place.kind], lambda: trio.run(_write, place, next(iids))
    )
    assert schemakit.current(place) > BEFORE[place.kind]
    with place.reader() as r:
        assert r.verify().ok
