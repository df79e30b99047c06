"""``POST /v1/operations/{id}/poll`` and ``POST /v1/invocations/{id}/reconcile`` (a query)
through the daemon, when the asker's row leaving its call open is superseded: the answer
carries ``refused`` -- ``{code: POLL_SUPERSEDED | QUERY_SUPERSEDED, message}`` -- beside the
call's own envelope (``poll`` / ``query``, APPROVAL_PENDING: it was asked), never a bare 500 nor
a silent APPROVAL_PENDING.  The race (tests/broker/test_poll_superseded.py and
test_query_row_superseded.py force it in-process): A's call P comes back APPROVAL_PENDING;
before A's row lands an operator denies P and B takes P up -- closes it, asks P2."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.client import Client
from affidavit.engine.recorder import Recorder
from affidavit.statemachine import Event
from tests.broker.approvalkit import PaymentsApi
from tests.broker.helpers import TOKEN_ENV
from tests.broker.test_operations import ACCEPTED
from tests.http.hostile import Received, Reply, scripts

from .kit import in_process

GETS = {"methods": ["GET"], "wait": "0s"}
SERVICE = {"operator_uids": [os.getuid()], "allow_self_approval": True}
OPERATIONS = {"status": "json:/state", "succeeded": ["done"], "failed": ["x"]}
RECONCILE = {
    "idempotency": {"header": "Idempotency-Key", "scope": "charges", "retention": "24h"},
    "reconcile": {
        "path": "/v1/charges?idempotency_key={idempotency_key}",
        "committed_if": ["status:200", "json:/key={idempotency_key}"],
        "rejected_if": ["status:404", "json:/key={idempotency_key}"],
        "settle": "0s",
    },
}
WAIT = 30


def _jobs(req: Received) -> Reply:
    if req.method == "POST":
        return ACCEPTED
    return Reply(200, body=json.dumps({"state": "running"}).encode())


@pytest.mark.parametrize("kind", ["poll", "query"])
async def test_a_superseded_answer_through_the_daemon_carries_refused_beside_its_call(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)
    name = f"{kind}_invocation"
    if kind == "poll":
        script, overrides = scripts.serve(_jobs), {"operations": OPERATIONS}
    else:
        script, overrides = PaymentsApi().script, dict(RECONCILE)
    real_append = Recorder.append
    raced: list[str] = []  # P, then P2

    async with (
        in_process(
            tmp_path,
            script,
            overrides={**overrides, "approval": GETS},
            service=SERVICE,
        ) as (srv, socket),
        Client.open(socket) as a,
        Client.open(socket) as b,
    ):
        with trio.fail_after(WAIT):
            if kind == "poll":
                sent = await a.call({"target": "api", "method": "POST", "path": "/v1/jobs"})
                on, ask = sent["invocation_id"], sent["operation"]["id"]
            else:
                body = json.dumps({"drop": True})
                action = {"target": "api", "method": "POST", "path": "/v1/charges", "body": body}
                sent = await a.call({**action, "idempotency_key": "k1"})
                assert sent["error"]["outcome"] == "unknown", sent
                on = ask = sent["invocation_id"]

            async def asked(client: Client) -> dict[str, Any]:
                if kind == "poll":
                    return await client.poll_operation(ask)
                return await client.reconcile(ask, query=True)

            async def append(self: Recorder, event: Event, *args: Any, **kwargs: Any) -> Any:
                code = event.attrs.get("code")
                if not raced and event.invocation_id == on and code == "APPROVAL_PENDING":
                    raced.append(event.attrs[name])  # A's row for P, about to land
                    await b.deny(raced[0], note="not now")
                    other = await asked(b)  # B: takes P up (denied), closes it, asks P2
                    raced.append(other[kind]["invocation_id"])
                return await real_append(self, event, *args, **kwargs)

            monkeypatch.setattr(Recorder, "append", append)
            answer = await asked(a)  # A
    assert len(raced) == 2 and answer[kind]["invocation_id"] == raced[0], (raced, answer)
    assert answer[kind]["error"]["code"] == "APPROVAL_PENDING"  # P was asked
    refused = answer["refused"]
    assert set(refused) == {"code", "message"}, refused
    assert refused["code"] == f"{kind.upper()}_SUPERSEDED", refused
    assert (
        raced[0] in refused["message"]
        and f"another {kind} {raced[1]} is open" in (refused["message"])
    ), refused
    assert "was not recorded" in refused["message"], refused
    assert not any(r.method == "GET" for r in srv.requests)  # nothing sent
