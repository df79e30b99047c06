"""``events_page``: a page of an invocation's events from a seq, the rows before it and past
the page never read -- the daemon's ``?from_seq=&limit=`` read it once each page, whole, to
filter it (review of daemonfix50, item 5).  Another invocation's rows between never count.
Both backends."""

from __future__ import annotations

import pytest
import trio

from affidavit.journal import Journal
from affidavit.journal.tables import Tables

from ..helpers import happy
from ..segkit import LIMIT
from .conftest import Place


def test_a_page_is_read_from_its_seq_and_holds_at_most_its_limit(
    place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def write() -> None:
        with trio.fail_after(LIMIT):
            async with place.open() as j:
                for a, b in zip(happy("act_a"), happy("act_b"), strict=True):
                    await j.append(a)
                    await j.append(b)

    trio.run(write)
    read: list[int] = []
    real = Tables.invocation_events_page

    def counted(tables: Tables, iid: str, from_seq: int, limit: int) -> object:
        for row in real(tables, iid, from_seq, limit):
            read.append(row)
            yield row

    monkeypatch.setattr(Tables, "invocation_events_page", counted)
    with place.reader() as r:
        mine = [e.seq for e in r.events("act_a")]
        assert len(mine) >= 6
        page = r.events_page("act_a", mine[2], 3)
        assert [e.seq for e in page] == mine[2:5]
        assert len(read) == 3  # neither the rows before the page nor those after
        assert [e.seq for e in r.events_page("act_a", mine[-1] + 1, 1)] == []
        assert [e.seq for e in r.events_page("act_a", 2**63 - 1, 1)] == []
        assert [e.seq for e in r.events_page("act_a", 0, 10_000)] == mine
        assert all(e.invocation_id == "act_a" for e in r.events_page("act_a", 0, 10_000))


def test_journal_is_a_reader_of_pages_too(place: Place) -> None:
    # The writer's own journal reads pages as its readers do (the daemon reads through either).
    async def body() -> None:
        with trio.fail_after(LIMIT):
            async with place.open() as j:
                for event in happy("act_a"):
                    await j.append(event)
                assert isinstance(j, Journal)
                assert [e.seq for e in j.events_page("act_a", 0, 2)] == [
                    e.seq for e in j.events("act_a")[:2]
                ]

    trio.run(body)
