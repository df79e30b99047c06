"""The fence's rules (``statemachine.FENCE_RULES``) are a schema of their own (SQLite schema 10,
PostgreSQL schema 4), though no table or column changes: a broker without them, sharing the
journal, would write its binder's preamble into a record fenced under them -- the projection it
runs refuses nothing there -- and go on to send the charge the fencing call was told was never
sent.  So a broker of the schema before refuses a journal a broker with the rules has opened,
and a writer with them opening a journal from before records the new number, its rows read as
before.  Both backends."""

from __future__ import annotations

import pytest
import trio

from affidavit.statemachine import Event
from affidavit.statemachine import EventKind as E

from . import schemakit
from .conftest import Place

SCOPE = "payments.create"
BEFORE = {"sqlite": 9, "postgresql": 3}
"""The last schema of each backend without the fence's rules."""


def _accepted(iid: str) -> Event:
    op = {"target": "api", "protocol": "http", "fingerprint": "sha256:" + iid, "budget": 3,
          "idempotent": False, "idempotency": {"key": "key-" + iid, "scope": SCOPE}}  # fmt: skip
    return Event(E.ACTION_ACCEPTED, iid, {"operation": op, "session": None})


async def _write(place: Place, iid: str) -> None:
    async with place.open() as j:
        await j.bind_idempotency(SCOPE, "key-" + iid, "sha256:" + iid, iid, None, target="api")
        await j.append(_accepted(iid), barrier=True)


def test_a_broker_without_the_fence_s_rules_refuses_the_journal(
    place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    # nor read: it would read a fenced record by the rules before
    trio.run(_write, place, "inv-a")
    schemakit.refused_by_the_schema_before(
        place, monkeypatch, BEFORE[place.kind], lambda: trio.run(_write, place, "inv-b")
    )
    assert place.rows("SELECT count(*) FROM idempotency") == [(1,)]  # nothing bound by it


def test_a_journal_from_before_the_fence_s_rules_is_upgraded_by_a_writer_with_them(
    place: Place,
) -> None:
    iids = iter(["inv-old", "inv-new"])
    schemakit.upgraded_from_the_schema_before(
        place, BEFORE[place.kind], lambda: trio.run(_write, place, next(iids))
    )
    with place.reader() as r:
        assert r.verify().ok and r.verify().bindings == 2
