"""The console's ``/invocations/{iid}/result.json`` of a record still open (a request waiting
for approval) is 200 with its envelope -- ``APPROVAL_PENDING`` -- and records nothing: the
console reads it from chunk 0, a page, never a whole fetch (the console is not the caller).
Review 53c: a read from chunk 0 made a whole fetch was 500 through the daemon (its peers'
askers named, the console none: ``NoAsker``), and embedded would record an operator's look as
the caller's delivery."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.broker.helpers import http_target, open_broker

from .kit import CHARGE, WAIT, console_world, get, log_in, log_in_to, operator_config, served
from .kit import pending_approval as pending_in


def _envelope(status: int, page: bytes) -> dict[str, Any]:
    assert status == 200, page
    envelope: dict[str, Any] = json.loads(page)
    assert envelope["error"]["code"] == "APPROVAL_PENDING", envelope
    return envelope


async def test_an_open_records_result_downloads_through_the_daemon_recording_nothing(
    tmp_path: Path, token: str
) -> None:
    async with console_world(tmp_path, token, wait="0s") as world:
        action = {k: v for k, v in CHARGE.items() if k != "body"}
        answered = await world.call(action)
        assert answered["error"]["code"] == "APPROVAL_PENDING", answered
        iid = str(answered["invocation_id"])
        before = await world.record(iid)
        cookie, _ = await log_in(world)
        status, _, page = await get(f"{world.origin}/invocations/{iid}/result.json", cookie=cookie)
        after = await world.record(iid)
    assert _envelope(status, page)["invocation_id"] == iid
    assert after == before  # nothing recorded: no delivery, no failure
    assert world.pay.requests == []


async def test_an_open_records_result_downloads_embedded_recording_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A regression guard, not a test of the fix: it passes with the read from chunk 0 made a
    whole fetch too -- an open record has no stored result, so no delivery is recorded either
    way and the answer carries nothing (no ``result.resume``) only a page shows.  It pins what
    the embedded console answers and records; the daemon variant above is the one that met the
    bug (review 53c round 2: 500 ``NoAsker``)."""
    target = http_target("http://127.0.0.1:9", approval={"methods": ["POST"], "wait": "0s"})
    path = operator_config(tmp_path, monkeypatch, {"pay": target})
    with trio.fail_after(WAIT):
        async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
            iid = await pending_in(b)
            before = [e.kind.value for e in b.events(iid)]
            cookie, _ = await log_in_to(console, origin)
            status, _, page = await get(f"{origin}/invocations/{iid}/result.json", cookie=cookie)
            await b.settled()
            after = [e.kind.value for e in b.events(iid)]
    assert _envelope(status, page)["invocation_id"] == iid
    assert after == before, after  # nothing recorded: an operator's look is no delivery
