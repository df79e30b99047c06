"""An operation's poll the target's approval covers: one poll at a time, and an approved poll's
answer folded once (rvC finding 3).  Before, every poll asked anew -- five polls put three cards
on the operator's list and the fourth was refused APPROVAL_LIMIT, the per-uid limit that then
refused the agent's real calls; after an approval the next poll asked again, and embedded an
approved poll was never sent.  Now a poll is named on the submission's record before it is
asked (``engine/takeup.py``): the next poll is refused POLL_PENDING while it is undecided, sends
it once approved, or folds the answer the dispatcher got.  What the server receives is the proof.
These run at the real pace (``operations.min_poll_interval``'s default, 1 s), not the test
default (``helpers.POLL_PACE``, 1 us), which hid that a poll asking anew after a denied one is
paced too (mcppoll50c item 7).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.engine import OperationError
from affidavit.engine.operations import ASKING
from affidavit.statemachine import Event, EventKind, EvidenceSource, invocation_of
from tests.http.hostile import HostileServer, scripts

from .approvalkit import OPS, OPS_UID
from .helpers import POLL_PACE, http_target, open_broker, write_config
from .http_rows import LIMIT
from .test_operations import JOBS, SUBMIT, job_api
from .test_reconcile_races import _held

GETS = {"methods": ["GET"], "wait": "0s"}
PACE = 1.0
"""``operations.min_poll_interval``'s default (docs/configuration.md)."""


@contextlib.asynccontextmanager
async def _jobs(
    tmp_path: Path, pace: float = POLL_PACE
) -> AsyncIterator[tuple[HostileServer, Broker, str]]:
    """The jobs API (a 202, then ``done``), a broker whose target covers GET under approval
    (at most 3 pending per uid), and the accepted operation's id; polls paced by ``pace``
    (the tests' default; this file's own tests at the real 1 s, ``PACE``)."""
    async with HostileServer.running(scripts.serve(job_api(["done"]))) as srv:
        ops = {**JOBS["operations"], "min_poll_interval": pace}
        jobs = http_target(srv.url + "/v1", **{**JOBS, "operations": ops}, approval=GETS)
        path = write_config(tmp_path, {"jobs": jobs})
        with path.open("a") as f:
            f.write(f"[service]\noperator_uids = [{OPS_UID}]\nmax_pending_approvals = 3\n")
        async with open_broker(path) as broker:
            with trio.fail_after(LIMIT):
                env = await broker.call(SUBMIT)
            yield srv, broker, env["operation"]["id"]


async def _poll_paced(broker: Broker, op_id: str) -> dict[str, Any]:
    """A poll right after a denied one: refused ``POLL_TOO_SOON`` (nothing asked: a new poll
    is asked, paced -- the denied one closed first, its one row), then let through once its
    ``retry_after`` is past."""
    rows = len(broker.events(_submission(op_id)))
    with pytest.raises(OperationError) as soon:
        await broker.poll_operation(op_id)
    assert len(broker.events(_submission(op_id))) == rows + 1  # the close, no poll
    assert (soon.value.code, soon.value.retry_after) == ("POLL_TOO_SOON", PACE), soon.value
    assert "nothing was asked; the unsent poll was closed." in str(soon.value)  # (its row)
    await trio.sleep(PACE)
    return await broker.poll_operation(op_id)


def _gets(srv: HostileServer) -> int:
    return sum(1 for r in srv.requests if r.method == "GET")


async def test_repeated_polls_put_one_card_on_the_list(tmp_path: Path, token: str) -> None:
    async with _jobs(tmp_path, PACE) as (srv, broker, op_id):
        with trio.fail_after(LIMIT):
            first = await broker.poll_operation(op_id)
            assert first["poll"]["error"]["code"] == "APPROVAL_PENDING"
            for _ in range(4):
                with pytest.raises(OperationError) as refused:
                    await broker.poll_operation(op_id)
                assert (refused.value.code, refused.value.status) == ("POLL_PENDING", 409)
                assert refused.value.field is None
        (card,) = broker.approvals()
        assert card["invocation_id"] == first["poll"]["invocation_id"]
        submission = broker.record(_submission(op_id))
        assert submission is not None and submission.operation is not None
        assert submission.operation["state"] == "pending"
    assert _gets(srv) == 0


@pytest.mark.parametrize("sender", ["poller", "dispatcher"])
async def test_an_approved_poll_is_sent_once_and_folded(
    tmp_path: Path, token: str, sender: str
) -> None:
    # Approved after its asker left: the next poll sends it now ("poller": embedded, nobody
    # else would) or folds the answer the daemon's dispatcher got -- never asks again.
    async with _jobs(tmp_path, PACE) as (srv, broker, op_id):
        with trio.fail_after(LIMIT):
            first = await broker.poll_operation(op_id)
            poll_id = first["poll"]["invocation_id"]
            await broker.approve(poll_id, note="read it", operator=OPS)
            if sender == "dispatcher":
                assert await broker.dispatch_approved(poll_id) is not None
            answer = await broker.poll_operation(op_id)
        assert answer["poll"]["invocation_id"] == poll_id
        assert answer["operation"]["state"] == "succeeded"
        assert answer["operation"]["last_poll"]["invocation_id"] == poll_id
        assert answer["operation"]["polls"] == 1  # one GET, counted once (before: twice)
        assert broker.approvals() == []
    assert _gets(srv) == 1


async def test_a_denied_poll_is_not_sent_and_the_next_one_asks_again(
    tmp_path: Path, token: str
) -> None:
    async with _jobs(tmp_path, PACE) as (srv, broker, op_id):
        with trio.fail_after(LIMIT):
            first = await broker.poll_operation(op_id)
            await broker.deny(first["poll"]["invocation_id"], note="not now", operator=OPS)
            second = await _poll_paced(broker, op_id)
        assert second["poll"]["invocation_id"] != first["poll"]["invocation_id"]
        assert second["poll"]["error"]["code"] == "APPROVAL_PENDING"
        assert [c["invocation_id"] for c in broker.approvals()] == [second["poll"]["invocation_id"]]
    assert _gets(srv) == 0


async def test_a_poll_closed_unsent_is_no_poll_of_the_job(tmp_path: Path, token: str) -> None:
    # Nothing was sent, so no poll of the job is counted: before, deny-then-poll made polls
    # == 3 with no GET sent (the first poll's row, the closing row, the second poll's row),
    # then 2 (the rows of the two polls on the operator's list).
    async with _jobs(tmp_path, PACE) as (srv, broker, op_id):
        with trio.fail_after(LIMIT):
            first = await broker.poll_operation(op_id)
            await broker.deny(first["poll"]["invocation_id"], note="not now", operator=OPS)
            second = await _poll_paced(broker, op_id)
        op = second["operation"]
        assert op["polls"] == 0, op  # two polls asked, neither sent
        assert op["last_poll"]["invocation_id"] == second["poll"]["invocation_id"]
    assert _gets(srv) == 0


async def test_a_poll_claimed_as_the_job_ends_answers_the_ended_operation(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another broker's poll read the job's end between this poll's read and its claim: the
    # answer is what a read a moment later gives (before: 422 OPERATION_ERROR).
    async with _jobs(tmp_path, PACE) as (srv, broker, op_id):
        iid = _submission(op_id)

        async def ended(b: Broker, iid: str) -> None:
            attrs = {"operation_id": op_id, "poll_invocation": "poll-of-another-broker"}
            read = {**attrs, "state": "succeeded", "remote_status": 200}
            polled = Event(
                EventKind.OPERATION_POLLED, iid, read, source=EvidenceSource.REMOTE_QUERY
            )
            await b.journal.append(polled, barrier=True)

        async with _held(broker, monkeypatch, ASKING, ended, iid):
            answer = await broker.poll_operation(op_id)
        assert answer["poll"] is None
        assert answer["operation"]["state"] == "succeeded"
        assert answer["operation"]["last_poll"]["invocation_id"] == "poll-of-another-broker"
        assert broker.approvals() == []
    assert _gets(srv) == 0


def _submission(op_id: str) -> str:
    iid = invocation_of(op_id)
    assert iid is not None
    return iid


async def test_a_poll_awaiting_approval_at_the_upgrade_is_taken_up(
    tmp_path: Path, token: str
) -> None:
    # A journal written before rows named an open poll recorded one awaiting an operator only
    # by its asker's last OPERATION_POLL_FAILED -- code APPROVAL_PENDING, no ``open``.  It is
    # the open poll now, as a query's is (test_reconcile_legacy): the next poll neither asks
    # again nor puts a second card on the list; once approved, it is sent and folded once.
    from affidavit.engine.contracts import contracts_of

    async with _jobs(tmp_path, PACE) as (srv, broker, op_id):
        iid = _submission(op_id)
        record = broker.record(iid)
        assert record is not None and record.operation is not None
        target = broker.config.targets["jobs"]
        contracts = contracts_of(target)
        assert contracts is not None
        action = dict(contracts.poll(target, record.operation))
        link = {"operation": op_id, "invocation": iid}
        with trio.fail_after(LIMIT):  # the poll as the old code asked it: no claim
            asked = await broker._engine.call(action, link=link)
        assert asked["error"]["code"] == "APPROVAL_PENDING"
        poll_id = asked["invocation_id"]
        legacy = {"operation_id": op_id, "poll_invocation": poll_id, "code": "APPROVAL_PENDING"}
        row = Event(EventKind.OPERATION_POLL_FAILED, iid, {**legacy, "reason": "r"})
        with trio.fail_after(LIMIT):
            await broker.journal.append(row, barrier=True)
        with trio.fail_after(LIMIT), pytest.raises(OperationError) as refused:
            await broker.poll_operation(op_id)
        assert refused.value.code == "POLL_PENDING" and poll_id in str(refused.value)
        assert [c["invocation_id"] for c in broker.approvals()] == [poll_id]  # no second card
        with trio.fail_after(LIMIT):
            await broker.approve(poll_id, note="read it", operator=OPS)
            answer = await broker.poll_operation(op_id)
        assert answer["poll"]["invocation_id"] == poll_id
        assert (answer["operation"]["state"], answer["operation"]["polls"]) == ("succeeded", 1)
    assert _gets(srv) == 1


async def test_an_open_poll_linked_calls_does_not_name_is_found_in_the_record(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The open poll's claim is sought through ``linked_calls`` (derived, not chained); with its
    # row gone from that table (``events_naming`` finds nothing: test_linked_calls has verify
    # report the removal) the claim is read from the record once.  Before, an older broker's
    # claim still being asked (no call written yet, its deadline ahead) was found by nobody,
    # closed as unsent and a second poll asked: a second card, a second query.
    from affidavit.engine.ids import new_invocation_id

    async with _jobs(tmp_path, PACE) as (srv, broker, op_id):
        iid = _submission(op_id)
        poll_id = new_invocation_id()
        attrs = {"operation_id": op_id, "poll_invocation": poll_id, "code": None}
        claim = {**attrs, "reason": ASKING, "open": True, "expires_at": time.time() + 3600}
        with trio.fail_after(LIMIT):
            await broker.journal.append(
                Event(EventKind.OPERATION_POLL_FAILED, iid, claim), barrier=True
            )
        monkeypatch.setattr(broker.journal, "events_naming", lambda iid, call: [])
        with trio.fail_after(LIMIT), pytest.raises(OperationError) as refused:
            await broker.poll_operation(op_id)
        assert refused.value.code == "POLL_PENDING" and poll_id in str(refused.value)
        assert broker.approvals() == []  # nothing asked
        submission = broker.record(iid)
        assert submission is not None and submission.operation is not None
        assert submission.operation["open_poll"] == poll_id
    assert _gets(srv) == 0


async def test_a_broker_of_another_config_leaves_an_approved_poll_on_a_shared_sqlite_file(
    tmp_path: Path, token: str
) -> None:
    # Two embedded brokers may share one SQLite file: only the daemon's lock makes one the only
    # writer (``Journal.exclusive``).  B, whose jobs target is bound to another snapshot (a
    # longer total), cannot send A's approved poll as approved: it leaves it -- nothing
    # written -- and A sends it.  Before, B ended it APPROVAL_STALE though A could send it.
    async with _jobs(tmp_path) as (srv, a, op_id):
        with trio.fail_after(LIMIT):
            first = await a.poll_operation(op_id)
            poll_id = first["poll"]["invocation_id"]
            await a.approve(poll_id, note="read it", operator=OPS)
        other = tmp_path / "b"
        other.mkdir()
        ops = {**JOBS["operations"], "min_poll_interval": PACE}
        longer = {"connect": 2, "total": 6}
        v2 = http_target(
            srv.url + "/v1", **{**JOBS, "operations": ops}, approval=GETS, timeout=longer
        )
        path = write_config(other, {"jobs": v2}, journal={"path": str(tmp_path / "journal.db")})
        with path.open("a") as f:
            f.write(f"[service]\noperator_uids = [{OPS_UID}]\nmax_pending_approvals = 3\n")
        async with open_broker(path) as b:
            assert not b.journal.exclusive
            with trio.fail_after(LIMIT):
                assert await b.dispatch_approved(poll_id) is None
            record = b.record(poll_id)
            assert record is not None and record.state == "approved", record
        with trio.fail_after(LIMIT):
            answer = await a.poll_operation(op_id)
        assert answer["poll"]["invocation_id"] == poll_id
        assert (answer["operation"]["state"], answer["operation"]["polls"]) == ("succeeded", 1)
    assert _gets(srv) == 1
