"""A linked call -- a reconciliation query, an operation's poll -- is a request like any other:
the target's ``approval`` policy covers it (rv45, finding 3).  Before, every linked call was
exempt: under ``approval = {methods = ["GET"]}`` (or ``"always"``) any caller could have the
broker send the configured query with the credential as often as it liked, no operator asked,
no approval recorded.

Seed, "Validation and credential injection finish before dispatch": an approval binds the
request "before approval", and the broker must "re-check it immediately before the write";
nothing the policy covers is sent unapproved.  End to end against the scripted payments API:
what the server received is the proof.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.approvals import OperatorError
from affidavit.reconcile.approved import ASKING, WAITING
from affidavit.statemachine import EventKind
from tests.cancel import cancel_once
from tests.http.hostile import HostileServer, scripts

from .approvalkit import OPS, OPS_UID, PaymentsApi, reconcile_target
from .helpers import event_kinds, http_target, open_broker, write_config
from .http_rows import LIMIT
from .test_operations import JOBS, SUBMIT, job_api

E = EventKind
GETS = {"methods": ["GET"], "wait": "0s"}
"""The query's method needs an operator's yes; the POST it reconciles does not.  ``wait``: how
long the asker waits for the decision (0: it is answered APPROVAL_PENDING at once)."""


@contextlib.asynccontextmanager
async def _payments(
    tmp_path: Path, approval: Any = GETS
) -> AsyncIterator[tuple[HostileServer, Broker, str]]:
    """The payments API, a broker whose target ``api`` declares its query under ``approval``,
    and a charge of it that ended unknown (applied, the connection dropped unanswered)."""
    async with HostileServer.running(PaymentsApi().script) as srv:
        path = write_config(tmp_path, reconcile_target(srv.url, approval=approval))
        with path.open("a") as f:
            f.write(f"[service]\noperator_uids = [{OPS_UID}]\n")
        async with open_broker(path) as broker:
            action = {
                "target": "api",
                "method": "POST",
                "path": "/v1/charges",
                "body": json.dumps({"drop": True}),
                "idempotency_key": "k1",
            }
            with trio.fail_after(LIMIT):
                env = await broker.call(action)
            assert env["error"]["outcome"] == "unknown"
            yield srv, broker, env["invocation_id"]


def _gets(srv: HostileServer) -> int:
    return sum(1 for r in srv.requests if r.method == "GET")


def _pending_queries(broker: Broker, iid: str) -> list[str]:
    """The approval requests on the operator's list that are queries of ``iid``."""
    out = []
    for row in broker.approvals():
        accepted = broker.events(row["invocation_id"])[0]
        if (accepted.attrs.get("link") or {}).get("reconciles") == iid:
            out.append(row["invocation_id"])
    return out


async def _give_up_once_listed(broker: Broker, iid: str) -> None:
    """Ask for ``iid``'s query and give up 0.1 s after the question is on the operator's list:
    in the wait for an operator, whatever the machine's load."""
    with trio.CancelScope() as asker:
        async with trio.open_nursery() as nursery:
            listed = lambda: _pending_queries(broker, iid)  # noqa: E731
            nursery.start_soon(cancel_once, asker, listed, "the query on the list", 0.1)
            await broker.reconcile(iid, query=True)
    assert asker.cancelled_caught, "the query was answered without an operator"


async def test_a_query_the_policy_covers_waits_for_an_operator_and_is_sent_once_approved(
    tmp_path: Path, token: str
) -> None:
    async with _payments(tmp_path, {"methods": ["GET"], "wait": "20s"}) as (srv, broker, iid):
        answers: list[dict[str, Any]] = []

        async def agent() -> None:
            answers.append(await broker.reconcile(iid, query=True))

        with trio.fail_after(LIMIT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(agent)
                while not _pending_queries(broker, iid):
                    await trio.sleep(0.02)
                assert _gets(srv) == 0  # asked, not sent
                (query_id,) = _pending_queries(broker, iid)
                await broker.approve(query_id, note="read it", operator=OPS)
        (answer,) = answers
        assert answer["reconciled"] is True
        assert answer["query"]["invocation_id"] == query_id
        assert answer["envelope"]["evidence"]["outcome"] == "committed"
        kinds = event_kinds(broker, query_id)
        assert kinds.index(E.APPROVAL_REQUESTED) < kinds.index(E.APPROVAL_GRANTED)
        assert kinds.index(E.APPROVAL_GRANTED) < kinds.index(E.DISPATCH_STARTED)
        assert _gets(srv) == 1


async def test_an_unapproved_query_is_never_sent_nor_asked_for_twice(
    tmp_path: Path, token: str
) -> None:
    # The rv45 script: three queries, no operator.  Now the first waits on the operator's list
    # (the asker answered APPROVAL_PENDING at once: ``wait = "0s"``); the others are refused
    # QUERY_PENDING -- nothing more asked, nothing sent.
    async with _payments(tmp_path) as (srv, broker, iid):
        with trio.fail_after(LIMIT):
            first = await broker.reconcile(iid, query=True)
            assert first["reconciled"] is False
            assert first["query"]["error"]["code"] == "APPROVAL_PENDING"
            queries = first["envelope"]["evidence"]["reconcile_queries"]
            assert [(q["code"], q["reason"], q.get("open")) for q in queries] == [
                (None, ASKING, True),  # named before it was asked: the one open query
                ("APPROVAL_PENDING", WAITING, True),
            ]
            for _ in range(2):
                with pytest.raises(OperatorError) as refused:
                    await broker.reconcile(iid, query=True)
                assert (refused.value.code, refused.value.status) == ("QUERY_PENDING", 409)
                assert refused.value.field is None  # nothing to correct: wait
        query_id = first["query"]["invocation_id"]
        assert _pending_queries(broker, iid) == [query_id]
        assert E.APPROVAL_REQUESTED in event_kinds(broker, query_id)
        assert _gets(srv) == 0
        assert broker.record(iid).outcome.value == "unknown"  # type: ignore[union-attr]


@pytest.mark.parametrize("sender", ["asker", "dispatcher"])
async def test_a_query_approved_after_its_asker_left_is_sent_once_and_its_answer_read(
    tmp_path: Path, token: str, sender: str
) -> None:
    # Approved once nobody waited: the next query takes it up -- sends it now ("asker"), or
    # reads the answer the daemon's dispatcher got for it ("dispatcher") -- never asks again,
    # never sends it twice.
    async with _payments(tmp_path) as (srv, broker, iid):
        with trio.fail_after(LIMIT):
            first = await broker.reconcile(iid, query=True)
            query_id = first["query"]["invocation_id"]
            await broker.approve(query_id, note="read it", operator=OPS)
            if sender == "dispatcher":
                sent = await broker.dispatch_approved(query_id)
                assert sent is not None and _gets(srv) == 1
            answer = await broker.reconcile(iid, query=True)
        assert answer["reconciled"] is True
        assert answer["query"]["invocation_id"] == query_id
        assert answer["envelope"]["evidence"]["reconciliation"]["query_invocation"] == query_id
        assert _gets(srv) == 1


async def test_a_denied_query_is_not_sent_and_the_next_one_asks_again(
    tmp_path: Path, token: str
) -> None:
    async with _payments(tmp_path) as (srv, broker, iid):
        with trio.fail_after(LIMIT):
            first = await broker.reconcile(iid, query=True)
            query_id = first["query"]["invocation_id"]
            await broker.deny(query_id, note="not now", operator=OPS)
            second = await broker.reconcile(iid, query=True)
        assert second["query"]["invocation_id"] != query_id
        assert second["query"]["error"]["code"] == "APPROVAL_PENDING"
        assert _pending_queries(broker, iid) == [second["query"]["invocation_id"]]
        assert _gets(srv) == 0


async def test_approval_always_covers_the_query(tmp_path: Path, token: str) -> None:
    # ``always``: the charge itself is approved first; its query then asks too.
    async with HostileServer.running(PaymentsApi().script) as srv:
        target = reconcile_target(srv.url, approval={"wait": "20s"})  # no selector: always
        path = write_config(tmp_path, target)
        with path.open("a") as f:
            f.write(f"[service]\noperator_uids = [{OPS_UID}]\n")
        async with open_broker(path) as broker:
            action = {
                "target": "api",
                "method": "POST",
                "path": "/v1/charges",
                "body": json.dumps({"drop": True}),
                "idempotency_key": "k1",
            }
            envs: list[dict[str, Any]] = []

            async def agent() -> None:
                envs.append(await broker.call(action))

            with trio.fail_after(LIMIT):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(agent)
                    while not broker.approvals():
                        await trio.sleep(0.02)
                    await broker.approve(
                        broker.approvals()[0]["invocation_id"], note="ok", operator=OPS
                    )
                iid = envs[0]["invocation_id"]
                # Nobody approves the query: the asker gives up once it is on the list (not
                # 0.5 s after asking: a loaded machine had not always put it there by then).
                await _give_up_once_listed(broker, iid)
            (query_id,) = _pending_queries(broker, iid)
            assert E.DISPATCH_STARTED not in event_kinds(broker, query_id)
    assert [r.method for r in srv.requests] == ["POST"]


async def test_a_poll_the_policy_covers_waits_for_an_operator(tmp_path: Path, token: str) -> None:
    async with HostileServer.running(scripts.serve(job_api(["done"]))) as srv:
        target = http_target(srv.url + "/v1", **JOBS, approval=GETS)
        path = write_config(tmp_path, {"jobs": target})
        with path.open("a") as f:
            f.write(f"[service]\noperator_uids = [{OPS_UID}]\n")
        async with open_broker(path) as broker:
            with trio.fail_after(LIMIT):
                env = await broker.call(SUBMIT)
                polled = await broker.poll_operation(env["operation"]["id"])
            poll = polled["poll"]
            assert poll["error"]["code"] == "APPROVAL_PENDING"
            assert polled["operation"]["state"] == "pending"
            assert E.APPROVAL_REQUESTED in event_kinds(broker, poll["invocation_id"])
    assert [r.method for r in srv.requests] == ["POST"]
