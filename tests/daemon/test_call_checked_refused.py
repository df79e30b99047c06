"""``call_checked`` through the daemon: a call refused before anything of it was journaled or
sent -- 429 ``RATE_LIMITED`` (its uid's ``[service] call_rate``), 503 ``OVERLOADED`` -- is made
again after its ``Retry-After``, bounded in tries and in total wait (rv48 #3: nothing retried
a 429, ``Client.call`` raised ``ApiError`` and a batch script stopped at the first busy second).
``OVERLOADED``, and any other ``ApiError`` raised at once: ``tests/broker/test_sdk.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from affidavit.api.client import Client
from affidavit.api.wire import ApiError
from affidavit.sdk import call_checked
from tests.broker.helpers import TOKEN_ENV
from tests.http.hostile import Reply, scripts

from .kit import WAIT, action, in_process

OK = Reply(200, headers=[("Content-Type", "application/json")], body=b'{"ok": 1}')
SERVICE = {"call_rate": 2, "call_burst": 1}
"""One call at once, then one each half second: the next call is 429, ``Retry-After: 1``."""


async def test_a_rate_limited_call_is_made_again_after_retry_after(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)
    async with (
        in_process(tmp_path, scripts.serve(OK), service=SERVICE) as (srv, socket),
        Client.open(socket) as client,
    ):
        with trio.fail_after(WAIT):
            first = await call_checked(client, action())
            with pytest.raises(ApiError) as refused:  # the plain call: the refusal itself
                await client.call(action())
            second = await call_checked(client, action())
    assert (refused.value.status, refused.value.code) == (429, "RATE_LIMITED")
    assert refused.value.retry_after == 1
    assert [json.loads(e["result"]["body"]) for e in (first, second)] == [{"ok": 1}] * 2
    assert first["invocation_id"] != second["invocation_id"]
    assert len(srv.requests) == 2  # the refused one sent nothing


@pytest.mark.parametrize(
    ("bound", "why"),
    [({"refused_retries": 0}, "no tries left"), ({"refused_wait": 0.5}, "Retry-After too long")],
)
async def test_past_its_bound_the_refusal_is_raised_without_waiting(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, bound: dict[str, float], why: str
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)
    async with (
        in_process(tmp_path, scripts.serve(OK), service=SERVICE) as (srv, socket),
        Client.open(socket) as client,
    ):
        with trio.fail_after(WAIT):
            await call_checked(client, action())
            start = trio.current_time()
            with pytest.raises(ApiError) as refused:
                await call_checked(client, action(), **bound)  # type: ignore[arg-type]
            waited = trio.current_time() - start
    assert refused.value.code == "RATE_LIMITED", why
    assert waited < 0.5, why  # raised at once: not a wait of Retry-After (1 s) first
    assert len(srv.requests) == 1
