"""A claim names a new call (``new_invocation_id``), so the writer refuses one naming a call
any row of the record it serves already names -- not only one with a record of its own
(``statemachine.refuse_reclaiming``, in the writing transaction).  Before 530d267 a claim was
appended on its own, ahead of its call's first rows, so an old journal can hold a call claimed
and closed that never got a record: a new claim naming it passed the own-record check, and the
fold reopened the closed call (a denied query open again).

Both backends; on PostgreSQL also a database whose sessions have ``standard_conforming_strings``
off, where a backslash in a string literal escapes (the check's LIKE once used ``ESCAPE '\\'``:
a literal that never ended there, so every claim on such a shared journal failed)."""

from __future__ import annotations

import re

import pytest
import trio

from affidavit.journal import Journal
from affidavit.statemachine import Event, ImpossibleEvent, open_query

from ..helpers import interrupted, query_claim, query_row
from ..segkit import LIMIT
from .conftest import Place

IID = "act_x1"
# The LIKE pattern's escape and wildcards in a query's id: an unescaped '!' would miss the row.
QUERIES = ("act_q1", "act!q%1_!_")


def _inconclusive(query: str, **attrs: object) -> Event:
    return query_row(IID, query, **attrs)


def _claim(query: str) -> Event:
    return query_claim(IID, query)


def _close(query: str) -> Event:
    return _inconclusive(query, code="APPROVAL_DENIED", reason="the query was not sent")


def _closed(j: Journal) -> bool:
    rec = j.record(IID)
    return open_query(rec.evidence["reconcile_queries"], rec.generation) is None


@pytest.mark.parametrize("query", QUERIES)
@pytest.mark.parametrize("together", [False, True], ids=["stored", "same-transaction"])
def test_a_claim_naming_a_call_an_earlier_row_named_is_refused(
    place: Place, together: bool, query: str
) -> None:
    _refused(place, together, query)
    if place.cluster is not None:  # again where a backslash in a literal escapes
        url = place.cluster.database()
        name = url.rsplit("/", 1)[1]
        place.cluster.sql(f'ALTER DATABASE "{name}" SET standard_conforming_strings = off')
        assert place.cluster.sql("SHOW standard_conforming_strings", name) == [("off",)]
        _refused(
            Place(place.kind, url, place.key_file, place.signing_key, place.cluster),
            together,
            query,
        )


def _refused(place: Place, together: bool, query: str) -> None:
    claim, close = _claim(query), _close(query)
    named = re.escape(f"{query} is named by an earlier row")

    async def write() -> None:
        with trio.fail_after(LIMIT):
            await written()

    async def written() -> None:
        async with place.open() as j:
            for event in interrupted(IID):
                await j.append(event)
            if together:  # the rows naming the query still queued when the claim is checked
                posted = await j.post_many([(claim, None), (close, None), (claim, None)])
                with pytest.raises(ImpossibleEvent, match=named):
                    await posted.wait()
            else:  # claimed alone, then closed: no record of the query's own (before 530d267)
                await j.append(claim)
                await j.append(close)
                with pytest.raises(ImpossibleEvent, match=named):
                    await j.append(claim)
            assert len(j.events(IID)) == len(interrupted(IID)) + 2  # the claim not written
            assert j.events(query) == [] and _closed(j)
        async with place.open() as j:  # as read back
            assert len(j.events(IID)) == len(interrupted(IID)) + 2 and _closed(j)
            await j.append(_inconclusive("act_q2", code=None, open=True))
            assert not _closed(j)  # a claim naming a new query is written

    trio.run(write)
