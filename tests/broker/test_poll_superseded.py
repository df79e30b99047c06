"""The row an asker writes once its poll returned (``open``: the poll awaits an operator) is
refused while another poll of the operation is open, or was and has closed since the refusal.
The poll was asked -- its record stays, linked, and the answer shows it under ``poll`` -- so
the answer says so beside it: ``refused`` ``POLL_SUPERSEDED``, naming the row that closed the
poll (what it says stands) and saying only that this answer was not recorded.  Before, the
refusal was swallowed: ``{operation, poll: APPROVAL_PENDING}`` with no sign of it.

The interleaving, forced: A's poll P comes back APPROVAL_PENDING; before A's row lands an
operator denies P and B takes P up -- closes it unsent, asks P2; A's row is refused (P2 open).
Either P2 is still open when A reads the record (named), or it was closed (unsent, as an older
broker would) by then -- or before A's row landed: no poll is open then, and A's row is refused
all the same, for naming a poll a row already closed (before, it reopened P, denied, and put
its stale APPROVAL_PENDING in ``last_poll``)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.cli import main as cli_main
from affidavit.cli import operations as cli_operations
from affidavit.cli.operations import poll_exit
from affidavit.engine import operations as ops
from affidavit.engine.recorder import Recorder
from affidavit.statemachine import Event, EventKind, EvidenceSource, ImpossibleEvent, invocation_of
from tests.http.hostile import HostileServer, scripts

from .approvalkit import OPS
from .helpers import http_target, open_broker, write_config
from .http_rows import LIMIT
from .test_operations import JOBS, SUBMIT, job_api
from .test_poll_approval import _gets, _jobs

E = EventKind


async def _close_unsent(broker: Broker, iid: str, op_id: str, poll_id: str) -> None:
    attrs = {"operation_id": op_id, "poll_invocation": poll_id, "code": None}
    row = Event(E.OPERATION_POLL_FAILED, iid, {**attrs, "reason": ops.UNSENT, "unsent": True})
    await broker.journal.append(row, barrier=True)


@pytest.mark.parametrize("p2_closed", ["open", "since", "before"], ids=lambda w: f"p2-{w}")
async def test_a_returned_poll_whose_row_is_refused_by_another_poll_is_superseded(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, p2_closed: str
) -> None:
    async with _jobs(tmp_path) as (srv, broker, op_id):
        iid = invocation_of(op_id)
        assert iid is not None
        recorder = broker._engine.recorder
        real_append, real_record = recorder.append, recorder.record
        raced: list[str] = []  # P, then P2
        refused = trio.Event()

        async def b_polls() -> None:
            answer = await broker.poll_operation(op_id)
            assert answer["poll"]["error"]["code"] == "APPROVAL_PENDING"
            assert "refused" not in answer
            raced.append(answer["poll"]["invocation_id"])

        async def append(event: Event, *args: Any, **kwargs: Any) -> Any:
            if not raced and event.invocation_id == iid and event.attrs.get("open") is True:
                raced.append(event.attrs["poll_invocation"])  # A's row for P, about to land
                await broker.deny(raced[0], note="not now", operator=OPS)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(b_polls)  # B: takes P up (denied), closes it, asks P2
                if p2_closed == "before":
                    await _close_unsent(broker, iid, op_id, raced.pop())  # before A's row
                try:
                    return await real_append(event, *args, **kwargs)
                except ImpossibleEvent:
                    refused.set()
                    raise
            return await real_append(event, *args, **kwargs)

        async def record(invocation_id: str, *args: Any, **kwargs: Any) -> Any:
            if (
                p2_closed == "since"
                and refused.is_set()
                and len(raced) == 2
                and invocation_id == iid
            ):
                await _close_unsent(broker, iid, op_id, raced.pop())  # before A reads
            return await real_record(invocation_id, *args, **kwargs)

        monkeypatch.setattr(recorder, "append", append)
        monkeypatch.setattr(recorder, "record", record)
        with trio.fail_after(LIMIT):
            answer = await broker.poll_operation(op_id)  # A
        assert refused.is_set() and raced and raced[0] == answer["poll"]["invocation_id"]
        assert answer["poll"]["error"]["code"] == "APPROVAL_PENDING"  # P was asked
        assert answer["operation"]["state"] == "pending"
        code, message = answer["refused"]["code"], answer["refused"]["message"]
        assert code == "POLL_SUPERSEDED", message
        assert "nothing" not in message and raced[0] in message, message
        closer = [
            e
            for e in broker.events(iid)
            if e.attrs.get("poll_invocation") == raced[0] and "open" not in e.attrs
        ]
        assert len(closer) == 1, closer  # B's, closing P unsent
        assert f"closed since by seq {closer[0].seq}: " in message, message
        assert ops.UNSENT in message, message
        assert "this answer of it (APPROVAL_PENDING) was not recorded" in message, message
        assert poll_exit(answer) == 1  # ``affidavit operation poll``'s exit status
        assert broker.events(raced[0])  # P's record stays
        after = broker.record(iid)
        assert after is not None and after.operation is not None
        assert after.operation["last_poll"]["invocation_id"] != raced[0]  # A's answer is not it
        if p2_closed != "open":
            assert after.operation["open_poll"] is None and "has closed since" in message
        else:
            now = after.operation["open_poll"]
            assert now is not None and now != raced[0], now
            assert f"another poll {now} is open" in message, message
    assert _gets(srv) == 0  # nothing sent


async def test_a_returned_poll_whose_row_is_refused_after_another_ended_the_job_is_superseded(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A's poll P comes back APPROVAL_PENDING; before A's row lands P is denied, B closes it,
    # asks P2, P2 is approved, sent and reads "done": A's row is refused (the job succeeded).
    # A's answer is not recorded, and says so -- before, {operation: succeeded, poll:
    # APPROVAL_PENDING} with nothing saying it (the query path answers NOT_UNKNOWN here).
    async with _jobs(tmp_path) as (srv, broker, op_id):
        iid = invocation_of(op_id)
        assert iid is not None
        recorder = broker._engine.recorder
        real_append = recorder.append
        raced: list[str] = []  # P, then P2
        refused = trio.Event()

        async def append(event: Event, *args: Any, **kwargs: Any) -> Any:
            if not raced and event.invocation_id == iid and event.attrs.get("open") is True:
                raced.append(event.attrs["poll_invocation"])  # A's row for P, about to land
                await broker.deny(raced[0], note="not now", operator=OPS)
                asked = await broker.poll_operation(op_id)  # B: closes P, asks P2
                raced.append(asked["poll"]["invocation_id"])
                await broker.approve(raced[1], note="read it", operator=OPS)
                done = await broker.poll_operation(op_id)  # B: sends P2, reads "done"
                assert done["operation"]["state"] == "succeeded", done
                try:
                    return await real_append(event, *args, **kwargs)
                except ImpossibleEvent:
                    refused.set()
                    raise
            return await real_append(event, *args, **kwargs)

        monkeypatch.setattr(recorder, "append", append)
        with trio.fail_after(LIMIT):
            answer = await broker.poll_operation(op_id)  # A
        assert refused.is_set() and raced[0] == answer["poll"]["invocation_id"]
        assert answer["poll"]["error"]["code"] == "APPROVAL_PENDING"  # P was asked
        assert answer["operation"]["state"] == "succeeded"
        code, message = answer["refused"]["code"], answer["refused"]["message"]
        assert code == "POLL_SUPERSEDED", message
        events = broker.events(iid)
        (closer,) = [
            e
            for e in events
            if e.attrs.get("poll_invocation") == raced[0] and "open" not in e.attrs
        ]
        (ended,) = [e for e in events if e.kind is E.OPERATION_POLLED]
        assert closer.attrs.get("unsent") is True and ended.attrs["poll_invocation"] == raced[1]
        assert f"closed since by seq {closer.seq}: " in message, message
        assert f"seq {ended.seq}: OPERATION_POLLED (state succeeded" in message, message
        assert "this answer of it (APPROVAL_PENDING) was not recorded" in message, message
        # ``affidavit operation poll`` exits 1, though the operation's last poll read a state.
        assert "state" in answer["operation"]["last_poll"] and poll_exit(answer) == 1
    assert _gets(srv) == 1  # P2 only


async def test_a_poll_whose_row_is_refused_because_another_ended_the_job_answers_the_end(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Polls the approval does not cover run side by side: both read "done", and the later row
    # is refused (the table has no move out of succeeded).  The journal holds the answer that
    # counted and the operation shows it: nothing to disown, no ``refused``, never a 500.
    async with HostileServer.running(scripts.serve(job_api(["done"]))) as srv:
        cfg = write_config(tmp_path, {"jobs": http_target(srv.url + "/v1", **JOBS)})
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                op_id = (await broker.call(SUBMIT))["operation"]["id"]
            recorder = broker._engine.recorder
            real_append = recorder.append
            others: list[dict[str, Any]] = []

            async def append(event: Event, *args: Any, **kwargs: Any) -> Any:
                if not others and event.kind is E.OPERATION_POLLED:
                    others.append({})
                    others[0] = await broker.poll_operation(op_id)  # B ends the job first
                return await real_append(event, *args, **kwargs)

            monkeypatch.setattr(recorder, "append", append)
            with trio.fail_after(LIMIT):
                answer = await broker.poll_operation(op_id)  # A
            assert others[0]["operation"]["state"] == "succeeded"
            assert answer["operation"]["state"] == "succeeded" and "refused" not in answer
            assert (
                answer["operation"]["last_poll"]["invocation_id"]
                == (others[0]["poll"]["invocation_id"])
            )
    assert _gets(srv) == 2


def test_the_cli_exits_1_when_its_poll_answer_carries_refused(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``affidavit operation poll`` through its real entry (``cli.main``: the broker it opens,
    the answer it prints, its exit status) on a prepared journal -- a job accepted, pending,
    polls under approval -- its poll's row refused because another asker read the job's state
    with that poll before the row landed: the answer carries ``refused`` POLL_SUPERSEDED, and
    the exit status is 1, though the operation's last poll read a state.

    In-process, not a subprocess: ``refused`` needs another writer to close the poll between
    its claim and its row, and an embedded journal is one process's (``JournalLocked``) --
    no second process can write it meanwhile; a subprocess would need that close injected
    into it, and a shared PostgreSQL journal would race an approval's wait against the clock.
    The close is written here, by the CLI's own recorder, just before the row."""

    async def prepare() -> str:
        with trio.fail_after(LIMIT):
            async with _jobs(tmp_path) as (_, _, op_id):
                return op_id

    op_id = trio.run(prepare)
    iid = invocation_of(op_id)
    real_append = Recorder.append
    closed: list[str] = []

    async def append(self: Recorder, event: Event, *args: Any, **kwargs: Any) -> Any:
        attrs = event.attrs
        if not closed and event.invocation_id == iid and attrs.get("code") == "APPROVAL_PENDING":
            # Another asker took the poll up and read the job's state first: the operation's
            # last poll then read a state, which this answer did not.
            closed.append(attrs["poll_invocation"])
            read = {"operation_id": op_id, "poll_invocation": closed[0], "state": "pending"}
            await real_append(
                self,
                Event(
                    E.OPERATION_POLLED,
                    event.invocation_id,
                    {**read, "remote_status": "busy"},
                    source=EvidenceSource.REMOTE_QUERY,
                ),
            )
        return await real_append(self, event, *args, **kwargs)

    monkeypatch.setattr(Recorder, "append", append)
    config = str(tmp_path / "affidavit.toml")
    # The CLI runs trio itself, in the main thread (its SIGTERM receiver): its run is bounded
    # from inside, through the entry it goes through (``run_journal``), by LIMIT.
    run_journal = cli_operations.run_journal

    def bounded(main: Callable[[], Awaitable[Any]]) -> Any:
        async def within() -> Any:
            with trio.fail_after(LIMIT):
                return await main()

        return run_journal(within)

    monkeypatch.setattr(cli_operations, "run_journal", bounded)
    assert cli_main(["operation", "poll", op_id, "--config", config]) == 1
    answer = json.loads(capsys.readouterr().out)
    assert closed and answer["poll"]["invocation_id"] == closed[0]
    assert answer["poll"]["error"]["code"] == "APPROVAL_PENDING"
    assert answer["refused"]["code"] == "POLL_SUPERSEDED", answer["refused"]
    assert answer["operation"]["last_poll"]["state"] == "pending"  # another's poll read it
