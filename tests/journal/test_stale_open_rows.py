"""A stale ``open`` row already in a journal -- one naming a reconciliation query open after a
row closed it, which the writer accepted until 530d267 whenever no other query was open -- is
read as a no-op for the query, never as an altered row: the writer refuses such a row
(``Projector.apply(writing=True)``, in the writing transaction), the fold of a stored one leaves
the query closed.  Before, the fold refused it too, so every reader turned it into AlteredRow:
``record``, ``actions``, ``metrics``, ``sessions`` failed JOURNAL_UNREADABLE (one invocation took
down the whole views), ``Journal.record`` raised, and a later RECONCILED could never be written
-- while ``journal verify`` said intact (rv47h finding 1).  Likewise a poll's: the stale open
row and the ``unsent`` row the next poll wrote after it (that writer's fold had reopened the
poll) are both read as no-ops; a021daf read the ``unsent`` one as altered."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.cli import main as cli_main
from affidavit.journal import Journal, JournalReader
from affidavit.statemachine import (
    Event,
    EvidenceSource,
    ImpossibleEvent,
    Projector,
    open_query,
    project,
)
from affidavit.statemachine import EventKind as E

from .helpers import happy, interrupted

IID = "act_x1"
QUERY = {"query_invocation": "act_q1"}


def _inconclusive(**attrs: object) -> Event:
    return Event(
        E.RECONCILE_INCONCLUSIVE,
        IID,
        {**QUERY, **attrs},
        source=EvidenceSource.REMOTE_QUERY,
        observer="obs",
        observer_seq=1,
    )


STALE = _inconclusive(code="APPROVAL_PENDING", reason="stale", open=True)


async def _write(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with Journal.open(db) as j:
        for event in interrupted(IID):
            await j.append(event)
        await j.append(_inconclusive(code=None, reason="asking", open=True))
        await j.append(_inconclusive(code="APPROVAL_DENIED", reason="unsent"))
        with pytest.raises(ImpossibleEvent, match="act_q1 is not open"):
            await j.append(STALE)  # the writer refuses it now
        # Stored as the writer before 530d267 stored it: the same row, the check off.
        with monkeypatch.context() as m:
            fold = Projector.apply
            m.setattr(Projector, "apply", lambda p, e, writing=False: fold(p, e))
            await j.append(STALE)
        assert j.record(IID).state == "interrupted"


def _read_everywhere(db: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """``record``, ``actions``, ``metrics``, ``sessions`` (--json) and ``journal verify`` of
    the journal holding the one invocation IID: each reads it."""
    journal = ["--journal", str(db)]
    answers = {}
    for command in ("record", "actions", "metrics", "sessions"):
        args = [command, IID] if command == "record" else [command]
        assert cli_main([*args, "--json", *journal]) == 0, command
        answers[command] = json.loads(capsys.readouterr().out)
    assert [rec["invocation_id"] for rec in answers["actions"]] == [IID]
    assert answers["metrics"]["invocations"] == 1
    assert [s["session"] for s in answers["sessions"]] == ["sess-1"]
    assert cli_main(["journal", "verify", *journal]) == 0
    capsys.readouterr()
    return answers


def _queries(evidence: object) -> list[dict[str, object]]:
    assert isinstance(evidence, dict)
    return list(evidence["reconcile_queries"])


def test_a_stored_stale_open_row_is_read_as_written_and_the_query_stays_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "j.db"
    trio.run(_write, db, monkeypatch)
    with JournalReader.open(db) as r:
        rec = r.record(IID)
        assert rec is not None and rec.state == "interrupted"
        items = [dict(i) for i in rec.evidence["reconcile_queries"]]
        assert items[-1]["stale"] is True and "open" not in items[-1]
        assert open_query(items, rec.generation) is None
    answers = _read_everywhere(db, capsys)
    assert _queries(answers["record"]["record"]["evidence"])[-1]["stale"] is True
    assert answers["metrics"]["by_code_outcome"][0]["code"] == "REMOTE_OUTCOME_UNKNOWN"

    async def attest() -> str:
        async with Journal.open(db) as j:
            await j.append(
                Event(
                    E.RECONCILED,
                    IID,
                    {"outcome": "committed", "note": "checked the ledger"},
                    source=EvidenceSource.OPERATOR_ATTESTED,
                    observer="ops",
                    observer_seq=1,
                )
            )
            return j.record(IID).state

    assert trio.run(attest) == "reconciled_committed"
    with JournalReader.open(db) as r:
        rec = r.record(IID)
        assert rec is not None and rec.state == "reconciled_committed"


def test_the_writer_refuses_a_row_for_the_reason_the_fold_would_give(tmp_path: Path) -> None:
    # One decision point: the writer's refusal is the rules', in their order -- a poll's row
    # open with a code on a record with no job is refused as no poll of a job, never as a
    # stale row of a poll "an earlier row closed" (no row ever named it).
    poll = {"operation_id": "op_x", "poll_invocation": "act_p9", "open": True}
    row = Event(E.OPERATION_POLL_FAILED, IID, {**poll, "code": "APPROVAL_PENDING"})

    async def write() -> str:
        async with Journal.open(tmp_path / "j.db") as j:
            for event in interrupted(IID):
                await j.append(event)
            with pytest.raises(ImpossibleEvent) as refused:
                await j.append(row)
            assert len(j.events(IID)) == len(interrupted(IID))  # nothing written
            return refused.value.reason

    reason = trio.run(write)
    with pytest.raises(ImpossibleEvent) as folded:
        project([*interrupted(IID), row], None)
    assert reason == folded.value.reason, reason
    assert "stale" not in reason and "closed" not in reason, reason


# -- a poll's ``unsent`` row after a stale open row (530d267's own interleaving) ---------------

OP_ID = "op_x1"


def _poll(**attrs: object) -> Event:
    base = {"operation_id": OP_ID, "poll_invocation": "act_p1"}
    return Event(E.OPERATION_POLL_FAILED, IID, {**base, **attrs})


async def _write_polls(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A claims P; B takes P up, finds it denied, closes it unsent; A's stale row names P open
    # (APPROVAL_PENDING); C polls, takes up P -- reopened in the fold of a broker from ab1791b
    # to 530d267, which wrote A's row -- finds it denied and closes it unsent again.
    stale = _poll(code="APPROVAL_PENDING", reason="stale", open=True)
    unsent_again = _poll(code="APPROVAL_DENIED", reason="unsent", unsent=True)
    async with Journal.open(db) as j:
        for event in happy(IID):
            await j.append(Event(event.kind, IID, {**event.attrs, "status": 202}, event.source))
        accepted = {"operation_id": OP_ID, "job_id": "j1", "status_url": "http://x/j1"}
        await j.append(Event(E.OPERATION_ACCEPTED, IID, accepted, EvidenceSource.REMOTE_RESPONSE))
        await j.commit_result(Event(E.RESULT_COMMITTED, IID), summary={"status": 202})
        await j.append(_poll(code=None, reason="asking", open=True))
        await j.append(_poll(code="APPROVAL_DENIED", reason="unsent", unsent=True))
        for row in (stale, unsent_again):  # the writer refuses both now
            with pytest.raises(ImpossibleEvent):
                await j.append(row)
        # Stored as that writer stored them: it accepted both (its fold reopened P with A's
        # row; checked with the statemachine of 530d267^).  Today's fold cannot replay that, so
        # the rows go in unchecked -- the same bytes, the same chain.
        with monkeypatch.context() as m:
            m.setattr(Projector, "apply", lambda p, e, writing=False: p.state)
            await j.append(stale)
            await j.append(unsent_again)


def test_a_stored_unsent_row_after_a_stale_open_row_is_read_and_the_poll_stays_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "j.db"
    trio.run(_write_polls, db, monkeypatch)
    with JournalReader.open(db) as r:
        rec = r.record(IID)
        assert rec is not None and rec.events == 13
        op = rec.operation
        assert op is not None and (op["open_poll"], op["polls"]) == (None, 0)
        assert op["last_poll"]["seq"] == 11  # B's close stands: the later rows changed nothing
    answers = _read_everywhere(db, capsys)
    assert answers["record"]["record"]["operation"]["last_poll"]["seq"] == 11

    async def poll_again() -> object:
        async with Journal.open(db) as j:
            assert j.record(IID).operation["open_poll"] is None  # type: ignore[index]
            await j.append(_poll(poll_invocation="act_p2", code=None, reason="asking", open=True))
            return j.record(IID).operation["open_poll"]  # type: ignore[index]

    assert trio.run(poll_again) == "act_p2"
