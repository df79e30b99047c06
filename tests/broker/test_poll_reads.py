"""What a poll reads of its submission's record, whose rows pile up with every poll
(docs/journal.md, "A poll reads its submission through the job's acceptance"): the row
checking the target still reaches the job's account is read through the job's
``accepted_seq``, never the polls after it; an open poll's claim through ``linked_calls``.
Counted on the tables (``Tables.invocation_events``, ``Tables.events_naming``), so reading
the whole record again fails these, whatever the machine's speed.  An embedded broker alone
on its journal: ``find`` answers from its own copy of the record (on a journal others write it
still folds the record: not claimed here)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.engine import OperationError
from affidavit.engine.operations import ASKING
from affidavit.journal.tables import Tables
from affidavit.statemachine import Event, EventKind
from tests.http.hostile import HostileServer, scripts

from .helpers import http_target, open_broker, write_config
from .http_rows import LIMIT
from .test_operations import JOBS, SUBMIT, job_api

POLLS = 12


class _Reads:
    """Rows of the submission's record each ``Tables`` read returned, and the calls named."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, iid: str) -> None:
        self.rows: dict[str, int] = {}
        self.named: list[str] = []
        for name in ("invocation_events", "events_naming"):
            monkeypatch.setattr(Tables, name, self._spy(getattr(Tables, name), name, iid))

    def _spy(self, real: Any, name: str, iid: str) -> Any:
        reads = self

        def spy(tables: Tables, of: str, *args: Any) -> Iterator[Any]:
            if name == "events_naming":
                reads.named.append(args[0])
            if of != iid:
                return real(tables, of, *args)
            return reads._counted(real(tables, of, *args), name)

        return spy

    def _counted(self, rows: Iterator[Any], name: str) -> Iterator[Any]:
        for row in rows:
            self.rows[name] = self.rows.get(name, 0) + 1
            yield row


@pytest.fixture
async def polled(tmp_path: Path, token: str) -> Any:
    """(broker, op_id, submission iid, its rows through the acceptance) after POLLS polls."""
    async with HostileServer.running(scripts.serve(job_api(["running"]))) as srv:
        cfg = write_config(tmp_path, {"jobs": http_target(srv.url + "/v1", **JOBS)})
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                env = await broker.call(dict(SUBMIT))
                op_id, iid = env["operation"]["id"], env["invocation_id"]
                for _ in range(POLLS):
                    assert (await broker.poll_operation(op_id))["poll"] is not None
            record = broker.record(iid)
            assert record is not None and record.operation is not None
            accepted = record.operation["accepted_seq"]
            through = [e for e in broker.events(iid) if e.seq <= accepted]
            assert len(broker.events(iid)) >= len(through) + POLLS  # a row a poll at least
            yield broker, op_id, iid, len(through)


async def test_a_poll_after_many_reads_its_submission_through_the_acceptance(
    polled: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker, op_id, iid, through = polled
    reads = _Reads(monkeypatch, iid)
    with trio.fail_after(LIMIT):
        assert (await broker.poll_operation(op_id))["poll"] is not None
    assert 0 < reads.rows.get("invocation_events", 0) <= through, reads.rows


async def test_a_poll_taking_up_an_open_poll_reads_the_rows_naming_it(
    polled: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker, op_id, iid, through = polled
    claim = {"operation_id": op_id, "poll_invocation": "act_claimed", "code": None}
    claim |= {"reason": ASKING, "open": True, "expires_at": time.time() + 3600}
    with trio.fail_after(LIMIT):
        await broker.journal.append(Event(EventKind.OPERATION_POLL_FAILED, iid, claim))
    reads = _Reads(monkeypatch, iid)
    with trio.fail_after(LIMIT), pytest.raises(OperationError) as refused:
        await broker.poll_operation(op_id)
    assert refused.value.code == "POLL_PENDING"
    assert reads.named == ["act_claimed"]
    assert reads.rows.get("events_naming") == 1  # the claim, no other row
    assert reads.rows.get("invocation_events", 0) <= through, reads.rows
