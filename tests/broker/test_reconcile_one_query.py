"""One reconciliation query at a time, however its askers come: concurrently, cancelled, or
gone before the operator decided (rvC finding 2).  Before, the next query took up only the
query named by the last RECONCILE_INCONCLUSIVE -- written after the asker's wait ended -- so
three concurrent askers put three cards on the operator's list (three GETs once approved, one
answer read), and a cancelled asker's query was never taken up.  Now the query is named on the
record it reconciles before it is asked (``reconcile/approved.py``, ``claim``), a row the
projection refuses while another query is open: what the server receives is the proof."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.approvals import OperatorError
from affidavit.reconcile.approved import ASKING, UNSENT
from affidavit.reconcile.service import CONFIG_SINCE
from affidavit.statemachine import EventKind
from tests.http.hostile import HostileServer, Peer

from .approvalkit import OPS, OPS_UID, PaymentsApi, reconcile_target
from .helpers import open_broker, write_config
from .http_rows import LIMIT
from .test_reconcile_approval import _gets, _give_up_once_listed, _payments, _pending_queries

E = EventKind
SLOW = {"methods": ["GET"], "wait": "2s"}
GETS = {"methods": ["GET"], "wait": "0s"}
STALL = 8.0  # seconds the stalling remote holds a GET unanswered
TAKER_TIMEOUT = 1.5  # the taker's timeout, well inside STALL
CHARGE = {
    "target": "api",
    "method": "POST",
    "path": "/v1/charges",
    "body": '{"drop": true}',
    "idempotency_key": "k1",
}


async def test_concurrent_askers_put_one_question_on_the_list(tmp_path: Path, token: str) -> None:
    async with _payments(tmp_path, SLOW) as (srv, broker, iid):
        answers: list[Any] = []

        async def ask() -> None:
            try:
                answers.append(await broker.reconcile(iid, query=True))
            except OperatorError as exc:
                answers.append(exc.code)

        with trio.fail_after(LIMIT):
            async with trio.open_nursery() as nursery:
                for _ in range(3):
                    nursery.start_soon(ask)
        refused = [a for a in answers if isinstance(a, str)]
        assert refused == ["QUERY_PENDING", "QUERY_PENDING"], answers
        (query_id,) = _pending_queries(broker, iid)
        with trio.fail_after(LIMIT):
            await broker.approve(query_id, note="read it", operator=OPS)
            assert await broker.dispatch_approved(query_id) is not None
            answer = await broker.reconcile(iid, query=True)
        assert answer["reconciled"] is True
        assert answer["query"]["invocation_id"] == query_id
    assert _gets(srv) == 1


async def test_a_cancelled_asker_s_query_is_taken_up(tmp_path: Path, token: str) -> None:
    async with _payments(tmp_path, {"methods": ["GET"], "wait": "20s"}) as (srv, broker, iid):
        with trio.fail_after(LIMIT):
            await _give_up_once_listed(broker, iid)  # no row after its wait
            (query_id,) = _pending_queries(broker, iid)
            with pytest.raises(OperatorError) as refused:
                await broker.reconcile(iid, query=True)
        assert refused.value.code == "QUERY_PENDING"
        assert query_id in refused.value.message
        assert _pending_queries(broker, iid) == [query_id]
        # Approved and sent after its asker left (the daemon's dispatcher): the next query
        # reads that answer, never asks or sends again.
        with trio.fail_after(LIMIT):
            await broker.approve(query_id, note="read it", operator=OPS)
            assert await broker.dispatch_approved(query_id) is not None
            answer = await broker.reconcile(iid, query=True)
        assert answer["reconciled"] is True
        assert answer["query"]["invocation_id"] == query_id
    assert _gets(srv) == 1


async def test_an_asker_stopped_before_asking_leaves_nothing_open(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Stopped before its query's first write (here: the call raises before it records
    # anything): no claim was written -- it heads that write (``takeup``) -- so none is left
    # to refuse every later query, and none had to be closed.
    async with _payments(tmp_path) as (srv, broker, iid):
        engine = broker._engine

        async def stopped(*args: Any, **kwargs: Any) -> dict[str, Any]:
            raise RuntimeError("stopped before the query was accepted")

        with trio.fail_after(LIMIT):
            with monkeypatch.context() as patch:
                patch.setattr(engine, "call", stopped)
                with pytest.raises(RuntimeError):
                    await broker.reconcile(iid, query=True)
            second = await broker.reconcile(iid, query=True)
        assert second["query"]["error"]["code"] == "APPROVAL_PENDING"
        rows = second["envelope"]["evidence"]["reconcile_queries"]
        assert [r["reason"] for r in rows][:1] == [ASKING]  # the second's claim, the first
        assert rows[0]["query_invocation"] == second["query"]["invocation_id"]
        assert UNSENT not in [r["reason"] for r in rows]
        assert _pending_queries(broker, iid) == [second["query"]["invocation_id"]]
    assert _gets(srv) == 0


async def test_a_second_open_query_is_refused_by_the_projection(tmp_path: Path, token: str) -> None:
    # The exclusion holds in the writing transaction, whatever process asks: a row opening
    # another query while one is open is refused, nothing written.
    from affidavit.statemachine import Event, ImpossibleEvent

    async with _payments(tmp_path) as (_srv, broker, iid):
        with trio.fail_after(LIMIT):
            first = await broker.reconcile(iid, query=True)
        generation = broker.record(iid).generation  # type: ignore[union-attr]
        other = Event(
            E.RECONCILE_INCONCLUSIVE,
            iid,
            {"query_invocation": "act_other", "open": True, "generation": generation},
        )
        with pytest.raises(ImpossibleEvent):
            await broker._engine.recorder.append(other, barrier=True)
        assert first["query"]["invocation_id"] in str(_pending_queries(broker, iid))


async def test_an_approved_query_whose_dispatcher_stopped_is_sent_once_its_lease_ran_out(
    tmp_path: Path, token: str
) -> None:
    # A dispatcher took the approved query's lease and stopped (killed) before sending: once
    # the lease ran out, the next query sends it and reads the answer -- never QUERY_PENDING
    # for ever, never a second question.
    from affidavit.engine.approval import claim

    async with _payments(tmp_path) as (srv, broker, iid):
        with trio.fail_after(LIMIT):
            first = await broker.reconcile(iid, query=True)
            query_id = first["query"]["invocation_id"]
            await broker.approve(query_id, note="read it", operator=OPS)
            assert await claim(broker._engine, query_id, 0.05) is not None  # the sender...
            broker._engine.recorder.forget()
            await trio.sleep(0.3)  # ...killed: its lease ran out
            assert not broker.record(query_id).final  # type: ignore[union-attr]
            answer = await broker.reconcile(iid, query=True)
        # The stale attempt closed (nothing was sent under it), the approved query was sent
        # once and read.
        assert answer["reconciled"] is True
        assert answer["query"]["invocation_id"] == query_id
        kinds = [e.kind for e in broker.events(query_id)]
        assert kinds.count(E.DISPATCH_STARTED) == 1
    assert _gets(srv) == 1


async def test_taking_up_an_approved_query_ends_within_the_caller_s_timeout(
    tmp_path: Path, token: str
) -> None:
    # The approved query is sent by the taker, to a remote that never answers its GET: the
    # taker's query ends within the timeout it was given (not the target's own, 30s), its
    # query's outcome unknown and the invocation still unknown.
    async def stalling(peer: Peer) -> None:
        req = await peer.read_request()
        if req is not None and req.method == "GET":
            await trio.sleep(STALL)  # never answers within the taker's timeout

    async with HostileServer.running(stalling) as srv:
        path = write_config(tmp_path, reconcile_target(srv.url, approval=GETS))
        with path.open("a") as f:
            f.write(f"[service]\noperator_uids = [{OPS_UID}]\n")
        async with open_broker(path) as broker:
            with trio.fail_after(LIMIT):
                iid = (await broker.call(CHARGE))["invocation_id"]
                first = await broker.reconcile(iid, query=True)
                await broker.approve(first["query"]["invocation_id"], note="ok", operator=OPS)
            with trio.fail_after(STALL - 1.0):  # bounded: the stall outlasts it
                start = trio.current_time()
                answer = await broker.reconcile(iid, query=True, timeout=TAKER_TIMEOUT)
                took = trio.current_time() - start
        # The timeout, plus recording the answer: nearer it than the stall, on a loaded machine
        # too (+1.0 s once left a loaded commit little room).
        assert took < (TAKER_TIMEOUT + STALL) / 2, took
        assert answer["reconciled"] is False
        assert answer["query"]["invocation_id"] == first["query"]["invocation_id"]
        assert answer["query"]["error"]["outcome"] == "unknown"
    assert [r.method for r in srv.requests] == ["POST", "GET"]


async def test_a_query_asked_under_another_configuration_settles_nothing(
    tmp_path: Path, token: str
) -> None:
    # Approved and sent after its asker left; then the target's reconciliation settings
    # changed (``rejected_if`` now reads 200 as absent).  The answer is not judged by today's
    # rules: inconclusive, the query closed, and the next one asked under today's.
    async with HostileServer.running(PaymentsApi().script) as srv:
        async with _broker(tmp_path, srv, GETS, "status:404") as broker:
            iid, query_id = await _approved_and_sent(broker)
        async with _broker(tmp_path, srv, GETS, "status:410") as broker:
            with trio.fail_after(LIMIT):
                taken = await broker.reconcile(iid, query=True)
                again = await broker.reconcile(iid, query=True)
        assert taken["reconciled"] is False
        assert taken["query"]["invocation_id"] == query_id
        rows = taken["envelope"]["evidence"]["reconcile_queries"]
        assert rows[-1]["reason"] == CONFIG_SINCE and "open" not in rows[-1]
        assert again["query"]["error"]["code"] == "APPROVAL_PENDING"  # asked anew
        assert again["query"]["invocation_id"] != query_id
    assert [r.method for r in srv.requests] == ["POST", "GET"]


async def test_a_query_taken_up_after_its_approval_wait_changed_is_read(
    tmp_path: Path, token: str
) -> None:
    # Only what judges the answer counts (``judging_hash``: the request, committed_if,
    # rejected_if, settle): an approval's ``wait`` edited since does not discard an approved
    # and sent answer -- before, it was CONFIG_SINCE, a second card and a second GET.
    async with HostileServer.running(PaymentsApi().script) as srv:
        async with _broker(tmp_path, srv, GETS, "status:404") as broker:
            iid, query_id = await _approved_and_sent(broker)
        longer = {**GETS, "wait": "5s"}
        async with _broker(tmp_path, srv, longer, "status:404") as broker:
            with trio.fail_after(LIMIT):
                taken = await broker.reconcile(iid, query=True)
            assert broker.approvals() == []
        assert taken["reconciled"] is True, taken
        assert taken["query"]["invocation_id"] == query_id
    assert [r.method for r in srv.requests] == ["POST", "GET"]


@contextlib.asynccontextmanager
async def _broker(
    tmp_path: Path, srv: HostileServer, approval: Any, rejected_if: str
) -> AsyncIterator[Broker]:
    target = reconcile_target(srv.url, approval=approval)
    target["api"]["reconcile"]["rejected_if"] = [rejected_if, "json:/key={idempotency_key}"]
    path = write_config(tmp_path, target)
    with path.open("a") as f:
        f.write(f"[service]\noperator_uids = [{OPS_UID}]\n")
    async with open_broker(path) as broker:
        yield broker


async def _approved_and_sent(broker: Broker) -> tuple[str, str]:
    """A charge left unknown, its query approved and sent after its asker left."""
    with trio.fail_after(LIMIT):
        env = await broker.call(CHARGE)
        iid = env["invocation_id"]
        first = await broker.reconcile(iid, query=True)
        query_id = first["query"]["invocation_id"]
        await broker.approve(query_id, note="read it", operator=OPS)
        assert await broker.dispatch_approved(query_id) is not None
    return iid, query_id


async def test_a_query_its_killed_sender_left_mid_send_is_closed_then_read(
    tmp_path: Path, token: str
) -> None:
    # The open query's record is at DISPATCH_STARTED, its holder dead and its lease run out.
    # The next query closes it by what it proves (recover_stale: unknown) and reads that --
    # never QUERY_PENDING "is being sent" for ever -- and the one after asks anew.
    from affidavit.engine.ids import new_invocation_id
    from affidavit.reconcile.approved import claim
    from affidavit.statemachine import Event

    async with _payments(tmp_path) as (srv, broker, iid):
        engine = broker._engine
        record = broker.record(iid)
        assert record is not None
        query_id = new_invocation_id()
        await engine.journal.append(claim(engine, record, query_id), barrier=True)
        accepted = {
            "operation": {"target": "api", "protocol": "http", "idempotent": False},
            "holder": "dead-broker",
            "lease_expires_at": time.time() - 1.0,
            "link": {"reconciles": iid},
        }
        for kind, attrs in (
            (E.ACTION_ACCEPTED, accepted),
            (E.PREFLIGHT_VALIDATED, {}),
            (E.CREDENTIAL_AUTHORIZED, {}),
            (E.DISPATCH_STARTED, {"generation": 0}),
        ):
            await engine.journal.append(Event(kind, query_id, attrs), barrier=True)
        with trio.fail_after(LIMIT):
            taken = await broker.reconcile(iid, query=True)
            again = await broker.reconcile(iid, query=True)
        assert taken["reconciled"] is False
        assert taken["query"]["invocation_id"] == query_id
        assert taken["query"]["error"]["code"] == "REMOTE_OUTCOME_UNKNOWN"
        # Judged (``_settles``), not set aside as asked under another configuration:
        row = taken["envelope"]["evidence"]["reconcile_queries"][-1]
        assert row["query_invocation"] == query_id and "open" not in row
        assert row["reason"] == "the query has no complete, authoritative result of its own"
        assert again["query"]["invocation_id"] != query_id
        assert again["query"]["error"]["code"] == "APPROVAL_PENDING"
    assert _gets(srv) == 0
