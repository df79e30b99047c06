"""Rules that are a schema of their own though no table changes: a broker of the schema before
refuses a journal a broker with them has opened ("newer affidavit", not tampering), and a writer
with them opening a journal from before records the new number.  The two checks every such
schema step makes, on both backends; ``write`` opens ``place`` and appends under the rules."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from affidavit.journal import JournalError
from affidavit.journal.postgres import SCHEMA_VERSION as PG_SCHEMA
from affidavit.journal.sqlite import SCHEMA_VERSION as SQLITE_SCHEMA

from .conftest import Place


def schema(place: Place) -> list[tuple[str]]:
    return place.rows("SELECT value FROM meta WHERE name = 'schema'")


def current(place: Place) -> int:
    return SQLITE_SCHEMA if place.kind == "sqlite" else PG_SCHEMA


def refused_by_the_schema_before(
    place: Place, monkeypatch: pytest.MonkeyPatch, before: int, write: Callable[[], object]
) -> None:
    """With a journal already written under the rules, a broker knowing only ``before`` can
    neither write (``write()``) nor read it."""
    from affidavit.journal import postgres, sqlite_schema

    now = current(place)
    assert schema(place) == [(str(now),)]
    module = sqlite_schema if place.kind == "sqlite" else postgres
    monkeypatch.setattr(module, "SCHEMA_VERSION", before)
    with pytest.raises(JournalError, match=rf"newer affidavit \(schema {now}; this one knows"):
        write()
    with pytest.raises(JournalError, match=rf"newer affidavit \(schema {now};"):
        place.reader()


def upgraded_from_the_schema_before(place: Place, before: int, write: Callable[[], object]) -> None:
    """A journal written by ``write()`` then marked ``before`` reads as it is read-only, and
    the next ``write()`` records the current number."""
    write()
    place.tamper(f"UPDATE meta SET value = '{before}' WHERE name = 'schema'")
    with place.reader() as r:  # read-only: read as it is, not upgraded
        assert r.verify().ok
    assert schema(place) == [(str(before),)]
    write()
    assert schema(place) == [(str(current(place)),)]
