"""``[service] max_pending_approvals``: one requester uid may have only so many requests
awaiting an operator's decision.  A caller is hostile and a refused call costs it nothing, so
without a bound it could bury a real request among thousands of its own on the operator's list.
One more is refused before anything is asked or sent -- APPROVAL_LIMIT, credential_injection,
not_attempted, retry backoff -- and the slot comes back once one is decided or expires."""

from __future__ import annotations

from pathlib import Path

import trio

from affidavit.statemachine import EventKind
from tests.http.hostile import HostileServer, Reply, scripts

from .approvalkit import OPS, approval_config, verify_ok
from .helpers import assert_error, event_kinds, open_broker

E = EventKind
OK = Reply(200, body=b'{"ok": true}')
CHARGE = {"target": "api", "method": "POST", "path": "/v1/charges", "body": '{"amount": 5}'}
AGENT, OTHER = 5001, 5002


async def test_past_the_bound_a_request_is_refused_before_it_is_asked_or_sent(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(OK)) as srv:
        cfg = approval_config(tmp_path, srv.url, service={"max_pending_approvals": 2})
        async with open_broker(cfg) as b:
            first = await b.call(CHARGE, requester=AGENT)
            second = await b.call(CHARGE, requester=AGENT)
            for env in (first, second):
                assert env["error"]["code"] == "APPROVAL_PENDING", env
            refused = await b.call(CHARGE, requester=AGENT)
            rec = assert_error(
                b,
                refused,
                phase="credential_injection",
                outcome="not_attempted",
                retry="backoff",
                code="APPROVAL_LIMIT",
            )
            assert rec.field == "service.max_pending_approvals"
            assert "2 requests of uid 5001" in refused["error"]["message"]
            kinds = event_kinds(b, refused["invocation_id"])
            assert E.APPROVAL_REQUESTED not in kinds and E.DISPATCH_STARTED not in kinds
            # Another uid has its own bound; the operator's list holds two of the agent's.
            other = await b.call(CHARGE, requester=OTHER)
            assert other["error"]["code"] == "APPROVAL_PENDING", other
            listed = [a["invocation_id"] for a in b.approvals()]
            assert listed == [e["invocation_id"] for e in (first, second, other)]
            # A decision gives the slot back.
            await b.deny(first["invocation_id"], note="no", operator=OPS)
            again = await b.call(CHARGE, requester=AGENT)
            assert again["error"]["code"] == "APPROVAL_PENDING", again
            assert (await b.call(CHARGE, requester=AGENT))["error"]["code"] == "APPROVAL_LIMIT"
            verify_ok(b)
    assert srv.requests == []


async def test_concurrent_requests_of_one_uid_never_pass_the_bound_together(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(OK)) as srv:
        cfg = approval_config(tmp_path, srv.url, service={"max_pending_approvals": 3})
        async with open_broker(cfg) as b:
            codes: list[str] = []

            async def one() -> None:
                codes.append((await b.call(CHARGE, requester=AGENT))["error"]["code"])

            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    for _ in range(12):
                        nursery.start_soon(one)
            assert len(b.approvals()) <= 3
            assert codes.count("APPROVAL_PENDING") == len(b.approvals()) >= 1
            assert codes.count("APPROVAL_LIMIT") == 12 - codes.count("APPROVAL_PENDING")
    assert srv.requests == []


async def test_a_daemon_started_again_counts_the_requests_still_waiting(
    tmp_path: Path, token: str
) -> None:
    """The daemon learns the open approvals at start (``watch_approvals``), with their
    requesters: restarting it does not reset anyone's bound."""
    async with HostileServer.running(scripts.serve(OK)) as srv:
        cfg = approval_config(tmp_path, srv.url, service={"max_pending_approvals": 2})
        async with open_broker(cfg) as b:
            for _ in range(2):
                env = await b.call(CHARGE, requester=AGENT)
                assert env["error"]["code"] == "APPROVAL_PENDING", env
        async with open_broker(cfg) as b:
            b.watch_approvals()
            refused = await b.call(CHARGE, requester=AGENT)
            assert refused["error"]["code"] == "APPROVAL_LIMIT", refused
            other = await b.call(CHARGE, requester=OTHER)
            assert other["error"]["code"] == "APPROVAL_PENDING", other
    assert srv.requests == []


async def test_a_refused_keyed_request_asks_again_with_the_same_key_after_the_backoff(
    tmp_path: Path, token: str
) -> None:
    """APPROVAL_LIMIT hints ``backoff``, and following it with the same key works: the key
    stays bound to the refused invocation (never bound twice), and a same-key call once a slot
    is free retries that invocation -- it asks the operator, counted like any other request
    (while the uid is still at the bound, the retry is refused again).  Refused retries give
    their budget back, so waiting for a slot never spends it."""
    async with HostileServer.running(scripts.serve(OK)) as srv:
        idem = {"header": "Idempotency-Key", "scope": "charges", "retention": "24h"}
        cfg = approval_config(
            tmp_path, srv.url, service={"max_pending_approvals": 1}, idempotency=idem
        )
        async with open_broker(cfg) as b:
            first = await b.call(CHARGE, requester=AGENT)
            keyed = {**CHARGE, "idempotency_key": "charge-7"}
            refused = await b.call(keyed, requester=AGENT)
            assert_error(b, refused, phase="credential_injection", outcome="not_attempted",
                         retry="backoff", code="APPROVAL_LIMIT")  # fmt: skip
            iid = refused["invocation_id"]
            # Still at the bound: the same key retries and is refused again, nothing asked.
            for _ in range(4):  # more than the budget (3): refusals give it back
                still = await b.call(keyed, requester=AGENT)
                assert still["invocation_id"] == iid
                assert_error(b, still, phase="credential_injection", outcome="not_attempted",
                             retry="backoff", code="APPROVAL_LIMIT")  # fmt: skip
            assert E.APPROVAL_REQUESTED not in event_kinds(b, iid)
            # A slot is free: the same key asks the operator, for the same invocation.
            await b.deny(first["invocation_id"], note="no", operator=OPS)
            again = await b.call(keyed, requester=AGENT)
            assert again["invocation_id"] == iid
            assert again["error"]["code"] == "APPROVAL_PENDING", again
            assert [a["invocation_id"] for a in b.approvals()] == [iid]
            # The retry counts toward the bound like any request.
            other = await b.call({**CHARGE, "idempotency_key": "charge-8"}, requester=AGENT)
            assert other["error"]["code"] == "APPROVAL_LIMIT", other
            # Approved, it is sent once, with its key.
            await b.approve(iid, operator=OPS)
            with trio.fail_after(15):
                done = await b.call(keyed, requester=AGENT)
            assert done["invocation_id"] == iid and "error" not in done, done
            verify_ok(b)
    assert [r.header("Idempotency-Key") for r in srv.requests] == [
        refused["evidence"]["idempotency"]["key"]
    ]


async def test_an_unkeyed_refused_request_asks_again_as_a_new_call_after_the_backoff(
    tmp_path: Path, token: str
) -> None:
    """Without a key, following ``backoff`` is a new call: a new invocation that asks."""
    async with HostileServer.running(scripts.serve(OK)) as srv:
        cfg = approval_config(tmp_path, srv.url, service={"max_pending_approvals": 1})
        async with open_broker(cfg) as b:
            first = await b.call(CHARGE, requester=AGENT)
            refused = await b.call(CHARGE, requester=AGENT)
            assert_error(b, refused, phase="credential_injection", outcome="not_attempted",
                         retry="backoff", code="APPROVAL_LIMIT")  # fmt: skip
            await b.deny(first["invocation_id"], note="no", operator=OPS)
            again = await b.call(CHARGE, requester=AGENT)
            assert again["invocation_id"] != refused["invocation_id"]
            assert again["error"]["code"] == "APPROVAL_PENDING", again
    assert srv.requests == []


async def test_with_a_budget_of_one_a_refused_keyed_request_still_says_backoff_and_retries(
    tmp_path: Path, token: str
) -> None:
    """The refusal was no attempt (nothing asked, nothing sent), so it spends none of a budget
    of one: the hint stays ``backoff`` -- there is nothing to correct, the caller waits for a
    slot --, and following it with the same key asks the operator and, approved, sends once."""
    async with HostileServer.running(scripts.serve(OK)) as srv:
        idem = {"header": "Idempotency-Key", "scope": "charges", "retention": "24h"}
        cfg = approval_config(
            tmp_path, srv.url, service={"max_pending_approvals": 1}, idempotency=idem, budget=1
        )
        async with open_broker(cfg) as b:
            first = await b.call(CHARGE, requester=AGENT)
            keyed = {**CHARGE, "idempotency_key": "charge-1"}
            refused = await b.call(keyed, requester=AGENT)
            rec = assert_error(b, refused, phase="credential_injection", outcome="not_attempted",
                               retry="backoff", code="APPROVAL_LIMIT")  # fmt: skip
            assert (rec.budget.total, rec.budget.left) == (1, 1)
            iid = refused["invocation_id"]
            await b.deny(first["invocation_id"], note="no", operator=OPS)
            again = await b.call(keyed, requester=AGENT)
            assert again["invocation_id"] == iid
            assert again["error"]["code"] == "APPROVAL_PENDING", again
            await b.approve(iid, operator=OPS)
            with trio.fail_after(15):
                done = await b.call(keyed, requester=AGENT)
            assert done["invocation_id"] == iid and "error" not in done, done
            verify_ok(b)
    assert len(srv.requests) == 1
