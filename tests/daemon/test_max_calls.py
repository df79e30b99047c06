"""``[service] max_calls`` caps what is in flight through the daemon's socket: a call, a job's
poll and a reconciliation query -- each reaches the remote -- are refused 503 OVERLOADED past
it, and nothing is sent for them (docs/configuration.md).  A poll and a query used to bypass the
cap (``Calls.linked``): with max_calls = 1, six concurrent queries all reached the remote.  An
operator's attestation sends nothing and is never refused so."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from affidavit.api.client import Client
from affidavit.api.wire import ApiError
from tests.http.hostile import Peer, Reply

from .kit import WAIT, action, serving

OVERRIDES = {
    "idempotency": {"header": "Idempotency-Key", "scope": "caps", "retention": "24h"},
    "reconcile": {"path": "/v1/check?k={idempotency_key}", "committed_if": "status:200"},
    "operations": {"status": "json:/state", "succeeded": ["done"], "failed": ["x"]},
}


async def remote(peer: Peer) -> None:
    """``POST /v1/jobs``: a job (202, its status resource); ``POST /v1/drop``: closed unanswered
    (an unknown outcome); ``GET /v1/held``: answered once the test releases it; else 200."""
    while (req := await peer.read_request()) is not None:
        if req.target == "/v1/jobs":
            await peer.respond(Reply(202, headers=[("Location", "/v1/jobs/j1")], body=b"{}"))
        elif req.target == "/v1/drop":
            await peer.close()
            return
        elif req.target == "/v1/held":
            peer.server.event("held").set()
            await peer.server.event("release").wait()
            await peer.respond(Reply(200, body=b"{}"))
        else:
            await peer.respond(Reply(200, body=b'{"state":"done"}'))


@pytest.mark.parametrize("what", ["poll", "query", "call"])
async def test_past_max_calls_a_poll_a_query_and_a_call_are_refused_and_nothing_is_sent(
    tmp_path: Path, token: str, what: str
) -> None:
    service = {"max_calls": 1, "operator_uids": [os.geteuid()]}
    async with (
        serving(tmp_path, remote, token=token, overrides=OVERRIDES, service=service) as (
            srv,
            daemon,
        ),
        Client.open(daemon.socket) as client,
    ):
        op_id = (await client.call(action("/v1/jobs", "POST")))["operation"]["id"]
        dropped = action("/v1/drop", "POST", body="{}", idempotency_key="K1")
        iid = (await client.call(dropped))["invocation_id"]
        sent = len(srv.requests)
        held: list[dict[str, object]] = []

        async def hold() -> None:
            held.append(await client.call(action("/v1/held")))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(hold)
            with trio.fail_after(WAIT):
                await srv.event("held").wait()
            with pytest.raises(ApiError) as refused:
                if what == "poll":
                    await client.poll_operation(op_id)
                elif what == "query":
                    await client.reconcile(iid, query=True)
                else:
                    await client.call(action("/v1/other"))
            assert (refused.value.status, refused.value.code) == (503, "OVERLOADED")
            assert len(srv.requests) == sent + 1  # the held call's, nothing more
            # An attestation sends nothing: not refused (an operator's, at any load).
            attested = await client.reconcile(iid, attest="rejected", note="checked")
            assert attested["envelope"]["error"]["outcome"] == "rejected", attested
            srv.event("release").set()
        assert "result" in held[0], held
        # The slot is free again: the same request now runs.
        if what == "poll":
            assert (await client.poll_operation(op_id))["poll"] is not None
        assert len(srv.requests) == sent + 1 + (what == "poll")
