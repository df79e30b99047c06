"""A claim names a new call (``new_invocation_id``), so the writer refuses one naming a call
any row of the record it serves already names -- not only one with a record of its own
(``statemachine.refuse_reclaiming``, in the writing transaction).  Before 530d267 a claim was
appended on its own, ahead of its call's first rows, so an old journal can hold a call claimed
and closed that never got a record: a new claim naming it passed the own-record check, and the
fold reopened the closed call (a denied query open again)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from affidavit.journal import Journal
from affidavit.statemachine import Event, EvidenceSource, ImpossibleEvent, open_query
from affidavit.statemachine import EventKind as E

from .helpers import interrupted
from .segkit import LIMIT

IID = "act_x1"
QUERY = "act_q1"


def _inconclusive(**attrs: object) -> Event:
    return Event(
        E.RECONCILE_INCONCLUSIVE,
        IID,
        {"query_invocation": QUERY, **attrs},
        source=EvidenceSource.REMOTE_QUERY,
        observer="obs",
        observer_seq=1,
    )


CLAIM = _inconclusive(code=None, reason="the query is being asked", open=True)
CLOSE = _inconclusive(code="APPROVAL_DENIED", reason="the query was not sent")


def _closed(j: Journal) -> bool:
    rec = j.record(IID)
    return open_query(rec.evidence["reconcile_queries"], rec.generation) is None


@pytest.mark.parametrize("together", [False, True], ids=["stored", "same-transaction"])
def test_a_claim_naming_a_call_an_earlier_row_named_is_refused(
    tmp_path: Path, together: bool
) -> None:
    async def write() -> None:
        with trio.fail_after(LIMIT):
            await written()

    async def written() -> None:
        async with Journal.open(tmp_path / "j.db") as j:
            for event in interrupted(IID):
                await j.append(event)
            if together:  # the rows naming the query still queued when the claim is checked
                posted = await j.post_many([(CLAIM, None), (CLOSE, None), (CLAIM, None)])
                with pytest.raises(ImpossibleEvent, match=f"{QUERY} is named by an earlier row"):
                    await posted.wait()
            else:  # claimed alone, then closed: no record of the query's own (before 530d267)
                await j.append(CLAIM)
                await j.append(CLOSE)
                with pytest.raises(ImpossibleEvent, match=f"{QUERY} is named by an earlier row"):
                    await j.append(CLAIM)
            assert len(j.events(IID)) == len(interrupted(IID)) + 2  # the claim not written
            assert j.events(QUERY) == [] and _closed(j)
        async with Journal.open(tmp_path / "j.db") as j:  # as read back
            assert len(j.events(IID)) == len(interrupted(IID)) + 2 and _closed(j)
            await j.append(_inconclusive(query_invocation="act_q2", code=None, open=True))
            assert not _closed(j)  # a claim naming a new query is written

    trio.run(write)
