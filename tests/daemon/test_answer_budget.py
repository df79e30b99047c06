"""What a stored result's answer holds of the daemon's answer budget (``results.held``), and
what a refusal for it records: nothing -- a fetch refused 503 ``ANSWERS_IN_FLIGHT`` before its
first byte is no delivery, failed or made (seed, "Mark RESULT_DELIVERED only after the protocol
has confirmed complete transfer"; a failure is recorded only for an answer attempted)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.client import Client
from tests.broker.helpers import TOKEN_ENV
from tests.http.hostile import Reply, scripts

from .kit import WAIT, ask, in_process


def _servers(monkeypatch: pytest.MonkeyPatch, **knobs: Any) -> list[Any]:
    """The daemon's listeners (``admission.Server``) as it makes them, with ``knobs``."""
    from affidavit.daemon import server as daemon_server
    from affidavit.daemon.admission import Server

    made: list[Any] = []

    def make(*args: Any, **kwargs: Any) -> Server:
        made.append(Server(*args, **{**kwargs, **knobs}))
        return made[-1]

    monkeypatch.setattr(daemon_server, "Server", make)
    return made


async def _approved_and_stored(client: Client) -> str:
    """A call held for approval, approved: its result stored and never delivered (its
    caller's answer was the approval request), state ``stored_committed``."""
    envelope = await client.call({"target": "api", "method": "POST", "path": "/c"})
    iid = str(envelope["invocation_id"])
    await client.approve(iid, note="ok")
    for _ in range(400):
        if (await client.record(iid))["state"] == "stored_committed":
            return iid
        await trio.sleep(0.05)
    raise AssertionError("the approved call's result was never stored")


_GATED = {
    "service": {"operator_uids": [os.geteuid()], "allow_self_approval": True},
    "overrides": {"approval": "always"},
}


async def test_a_fetch_refused_answers_in_flight_records_no_delivery_failure(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A budget that holds a piece but not the envelope's text beside it: the fetch could
    never fit, 413 ``ANSWER_TOO_LARGE`` without ``Retry-After`` (audit 50: it was 503 "try
    again later", for ever).  One that could hold it but is full (another uid's answers):
    503 ``ANSWERS_IN_FLIGHT`` ("nothing was read").  Neither refusal adds to the journal --
    it was journaled RESULT_DELIVERY_FAILED.  Once the budget has room, the next fetch
    delivers it: RESULT_DELIVERED, once."""
    from affidavit.daemon import admission, results

    small = results.PIECE_HOLD + 10
    servers = _servers(monkeypatch, answer_budget=small, answer_per_uid=small)
    monkeypatch.setenv(TOKEN_ENV, token)
    room, other_uid = 3 * results.PIECE_HOLD, os.geteuid() + 1
    async with in_process(tmp_path, scripts.serve(Reply(200, body=b"paid")), **_GATED) as (
        _srv,
        socket,
    ):
        with trio.fail_after(WAIT):
            async with Client.open(socket) as client:
                iid = await _approved_and_stored(client)
                before = [e["kind"] for e in await client.events(iid)]
                never = await ask(socket, "GET", f"/v1/invocations/{iid}/result")
                for server in servers:  # room for it, all of it held by another uid's answers
                    server.answer_shares.budget = server.answer_shares.per_uid = room
                    assert server.hold_answer(room - results.PIECE_HOLD, other_uid, False) is None
                refused = await ask(socket, "GET", f"/v1/invocations/{iid}/result")
                after = [e["kind"] for e in await client.events(iid)]
                state = (await client.record(iid))["state"]
                for server in servers:
                    server.drop_answer(room - results.PIECE_HOLD, other_uid, False)
                    server.answer_shares.budget = server.answer_shares.per_uid = (
                        admission.ANSWER_BUDGET
                    )
                status, _h, payload = await ask(socket, "GET", f"/v1/invocations/{iid}/result")
                delivered = [e["kind"] for e in await client.events(iid)]
    assert (never[0], "retry-after" in never[1]) == (413, False), never
    assert json.loads(never[2])["api_error"]["code"] == "ANSWER_TOO_LARGE"
    assert (refused[0], refused[1].get("retry-after")) == (503, "5"), refused
    assert json.loads(refused[2])["api_error"]["code"] == "ANSWERS_IN_FLIGHT"
    assert after == before and state == "stored_committed"
    assert status == 200 and json.loads(payload)["result"]["body"] == "paid"
    assert delivered == [*before, "RESULT_DELIVERED"]


async def test_an_answer_that_failed_is_not_written_again_beside_its_record(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An answer the engine tried that failed before a byte for a reason not the journal's (a
    bug, injected here: the first write raises) is recorded RESULT_DELIVERY_FAILED -- and
    answered 500 ``INTERNAL``, never written a second time by the route, which handed the
    client the whole result while the journal said it was not delivered."""
    from affidavit.daemon import results

    monkeypatch.setenv(TOKEN_ENV, token)
    real = results.respond_result
    calls: list[int] = []

    async def failing_once(*args: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected")
        await real(*args)

    async with in_process(tmp_path, scripts.serve(Reply(200, body=b"paid")), **_GATED) as (
        _srv,
        socket,
    ):
        with trio.fail_after(WAIT):
            async with Client.open(socket) as client:
                iid = await _approved_and_stored(client)
                monkeypatch.setattr(results, "respond_result", failing_once)
                status, _h, payload = await ask(socket, "GET", f"/v1/invocations/{iid}/result")
                kinds = [e["kind"] for e in await client.events(iid)]
                monkeypatch.setattr(results, "respond_result", real)
                again = await client.fetch_result(iid)
    assert status == 500 and b"paid" not in payload, payload
    assert json.loads(payload)["api_error"]["code"] == "INTERNAL"
    assert iid in json.loads(payload)["api_error"]["message"]
    assert kinds[-1] == "RESULT_DELIVERY_FAILED"
    assert again is not None and again["result"]["body"] == "paid"
