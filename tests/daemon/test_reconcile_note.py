"""A ``note`` goes with an attestation only: sent with a reconciliation query (which records no
note) it is refused 400 INVALID_FIELD at ``note`` and nothing is queried -- it used to be
accepted and silently dropped, as ``_fields`` says a misspelt or ignored field must never be.
The CLI refuses ``--query --note`` likewise (a usage error), through the socket or embedded."""

from __future__ import annotations

import json
from pathlib import Path

import trio

from affidavit.api.client import Client

from .kit import WAIT, action, ask, cli, serving
from .test_max_calls import OVERRIDES, remote


async def test_a_note_with_a_query_is_refused_at_note_and_nothing_is_queried(
    tmp_path: Path, token: str
) -> None:
    async with serving(tmp_path, remote, token=token, overrides=OVERRIDES) as (srv, daemon):
        async with Client.open(daemon.socket) as client:
            dropped = action("/v1/drop", "POST", body="{}", idempotency_key="K1")
            iid = (await client.call(dropped))["invocation_id"]
        sent = len(srv.requests)
        body = json.dumps({"query": True, "note": "checked by hand"}).encode()
        status, _, answer = await ask(
            daemon.socket, "POST", f"/v1/invocations/{iid}/reconcile", body
        )
        error = json.loads(answer)["api_error"]
        assert (status, error["code"], error["field"]) == (400, "INVALID_FIELD", "note"), answer
        done = await cli(daemon, "reconcile", iid, "--query", "--note", "checked by hand")
        assert done.returncode == 2, done
        assert b"INVALID_FIELD" in done.stderr and b"--note" in done.stderr, done.stderr
        assert len(srv.requests) == sent  # no query reached the remote
        async with Client.open(daemon.socket) as client:  # the query alone still runs
            assert (await client.reconcile(iid, query=True))["query"] is not None
        assert len(srv.requests) == sent + 1


async def test_a_note_with_a_query_is_refused_at_note_even_with_max_calls_full(
    tmp_path: Path, token: str
) -> None:
    """The refusal depends only on what was sent: it comes first, so that the same request is
    not answered 503 OVERLOADED with the cap full and then, retried, 400 (it used to be)."""
    service = {"max_calls": 1}
    async with (
        serving(tmp_path, remote, token=token, overrides=OVERRIDES, service=service) as (
            srv,
            daemon,
        ),
        Client.open(daemon.socket) as client,
    ):
        dropped = action("/v1/drop", "POST", body="{}", idempotency_key="K1")
        iid = (await client.call(dropped))["invocation_id"]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.call, action("/v1/held"))  # the one slot, held
            with trio.fail_after(WAIT):
                await srv.event("held").wait()
            body = json.dumps({"query": True, "note": "checked by hand"}).encode()
            status, _, answer = await ask(
                daemon.socket, "POST", f"/v1/invocations/{iid}/reconcile", body
            )
            srv.event("release").set()
    error = json.loads(answer)["api_error"]
    assert (status, error["code"], error["field"]) == (400, "INVALID_FIELD", "note"), answer
