"""The routes the MCP proxy needs beside calls: ``GET /v1/catalog`` (the targets and each
protocol's action schema, exactly ``Broker.catalog``), ``POST /v1/operations/{id}/poll``
(``Broker.poll_operation`` in the daemon) and ``?from_chunk=`` on a stored result, through
``affidavit.Client``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from affidavit.api.client import Client
from affidavit.api.wire import ApiError
from tests.broker.helpers import TOKEN_ENV, open_broker
from tests.http.hostile import HostileServer, Received, Reply, scripts
from tests.journal.helpers import flip_stored_byte

from .kit import serving

JOB = Reply(202, headers=[("Location", "/jobs/j9")], body=b'{"id":"j9"}')


def job_api(req: Received) -> Reply:
    if req.method == "POST":
        return JOB
    return Reply(200, body=json.dumps({"state": "done"}).encode())


async def test_catalog_poll_and_resumed_results_through_the_client(
    tmp_path: Path, token: str
) -> None:
    async with (
        serving(tmp_path, scripts.serve(job_api), token=token) as (srv, daemon),
        Client.open(daemon.socket) as client,
    ):
        catalog = await client.catalog()
        envelope = await client.call(
            {"target": "api", "method": "POST", "path": "/jobs", "body": "{}"}
        )
        iid = envelope["invocation_id"]
        resumed = await client.fetch_result(iid, from_chunk=0)
        # A chunk number in digits int() refuses (a superscript two), or past the journal's
        # integer columns: 400 naming the parameter, not a 500 from deep in the database.
        bad = []
        for raw in ("%C2%B2", "99999999999999999999", "-1", "1e3"):
            with pytest.raises(ApiError) as caught:
                await client._get(f"/v1/invocations/{iid}/result?from_chunk={raw}")
            bad.append((caught.value.status, caught.value.code, str(caught.value)))
        with pytest.raises(ApiError) as refused:
            await client.poll_operation("op_nope")
    async with open_broker(daemon.config) as broker:
        assert catalog == broker.catalog()
    assert [t["name"] for t in catalog["tools"]] == ["http_request"]
    assert TOKEN_ENV not in json.dumps(catalog)  # the credential reference names it
    assert resumed is not None and "resume" in resumed["result"]
    for status, code, message in bad:
        assert (status, code) == (400, "BAD_REQUEST") and "from_chunk: expected" in message
    assert (refused.value.status, refused.value.code) == (422, "OPERATION_ERROR")
    assert len(srv.requests) == 1


async def test_a_stored_chunk_that_fails_verification_is_result_unverified_never_its_bytes(
    tmp_path: Path, token: str
) -> None:
    # Seed: a result is resumed "from the last verified chunk"; the daemon must not hand a
    # corrupt stored chunk over as the result -- whole or resumed: 500 RESULT_UNVERIFIED
    # naming the chunk, no body.
    body = b"secret-free stored body " * 40
    async with (
        serving(tmp_path, scripts.serve(Reply(200, body=body)), token=token) as (_srv, daemon),
        Client.open(daemon.socket) as client,
    ):
        envelope = await client.call({"target": "api", "method": "GET", "path": "/r"})
        iid = envelope["invocation_id"]
        assert envelope["result"]["body"] == body.decode()
        flip_stored_byte(daemon.journal, iid, "body", 0)
        for from_chunk in (None, 0):
            with pytest.raises(ApiError) as caught:
                await client.fetch_result(iid, from_chunk=from_chunk)
            assert (caught.value.status, caught.value.code) == (500, "RESULT_UNVERIFIED")
            assert "chunk 0" in str(caught.value) and "stored body" not in str(caught.value)


@asynccontextmanager
async def _job_posted(
    tmp_path: Path, token: str, operations: dict[str, Any]
) -> AsyncIterator[tuple[HostileServer, Client, str]]:
    """A daemon whose ``api`` target has ``operations``; ``POST /jobs`` called through it: the
    server, the client, and the operation's id."""
    async with (
        serving(
            tmp_path, scripts.serve(job_api), token=token, overrides={"operations": operations}
        ) as (srv, daemon),
        Client.open(daemon.socket) as client,
    ):
        envelope = await client.call(
            {"target": "api", "method": "POST", "path": "/jobs", "body": "{}"}
        )
        yield srv, client, envelope["operation"]["id"]


async def test_an_operation_is_polled_in_the_daemon(tmp_path: Path, token: str) -> None:
    operations = {"status": "json:/state", "succeeded": ["done"], "failed": ["failed"]}
    async with _job_posted(tmp_path, token, operations) as (srv, client, op):
        polled = await client.poll_operation(op)
    assert polled["operation"]["state"] == "succeeded"
    assert polled["poll"]["result"]["status"] == 200
    assert [r.method for r in srv.requests] == ["POST", "GET"]


async def test_a_poll_sooner_than_the_interval_is_429_poll_too_soon_with_retry_after(
    tmp_path: Path, token: str
) -> None:
    # The status resource's answer names no state (``json:/nope``): the job stays pending.
    operations = {"status": "json:/nope", "succeeded": ["done"], "min_poll_interval": "90s"}
    async with _job_posted(tmp_path, token, operations) as (srv, client, op):
        assert (await client.poll_operation(op))["operation"]["state"] == "pending"
        with pytest.raises(ApiError) as soon:
            await client.poll_operation(op)
    refused = soon.value
    assert (refused.status, refused.code, refused.field) == (429, "POLL_TOO_SOON", None)
    assert refused.retry_after is not None and 89 <= refused.retry_after <= 90  # the time left
    assert [r.method for r in srv.requests] == ["POST", "GET"]
