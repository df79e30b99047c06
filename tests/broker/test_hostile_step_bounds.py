"""What a hostile HTTP peer can make the broker hold and journal is bounded by more than the
body's bytes: the number of interim (1xx) responses, their heads' bytes and the steps of the
protocol summary (PROTOCOL_OBSERVED, the record's ``evidence.http``) are bounded too
(adapters/http/machine.py ``MAX_INFORMATIONAL``; affidavit/engine/steps.py).

Before: a 3 s flood of ``102 Processing`` against ``max_result = 1024`` made one 3.5 MB
PROTOCOL_OBSERVED row, and a 200 KB body sent as 1-byte chunks a 1.4 MB one.  Loopback peers
only; the flood stops after ``FLOOD_SECONDS`` or when the broker hangs up, every wait bounded.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.adapters.http.machine import MAX_INFORMATIONAL
from affidavit.statemachine import EventKind
from tests.http.hostile import HostileServer, Peer

from .helpers import TOKEN_ENV, assert_error, assert_ok, http_target, open_broker, write_config

POST = {"target": "api", "method": "POST", "path": "/charge", "body": "{}"}
GET = {"target": "api", "method": "GET", "path": "/thing"}
WAIT = 15
FLOOD_SECONDS = 3.0
ROW_BOUND = 8 * 1024
"""The protocol summary's bound here, as JSON: a few hundred bytes for these calls, far below
what the peers made of it before (megabytes)."""


@pytest.fixture(autouse=True)
def _token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "tok-hostile-step-bounds")


async def _call(
    tmp_path: Path, script: Any, action: dict[str, Any], expect: Callable[[Any, Any], Any]
) -> dict[str, Any]:
    """One call against ``script`` (``max_result`` = 1 MiB), its envelope checked by
    ``expect(broker, env)`` (``assert_ok`` or an ``assert_error``): the attrs of its one
    PROTOCOL_OBSERVED row."""
    async with HostileServer.running(script) as srv:
        target = http_target(srv.url, max_result=1 << 20, timeout={"connect": 2, "total": 10})
        async with open_broker(write_config(tmp_path, {"api": target})) as broker:
            with trio.fail_after(WAIT):
                env = await broker.call(action)
            expect(broker, env)
            events = list(broker.events(env["invocation_id"]))
            [observed] = [e.attrs for e in events if e.kind is EventKind.PROTOCOL_OBSERVED]
            return dict(observed)


async def test_an_endless_flood_of_interim_responses_ends_unknown_with_bounded_evidence(
    tmp_path: Path,
) -> None:
    """After ``MAX_INFORMATIONAL`` interim answers the next one makes the exchange malformed:
    the request was dispatched, no final response came, so ``unknown`` /
    REMOTE_OUTCOME_UNKNOWN -- with every interim status the evidence keeps, and a row of a
    bounded size however long the peer goes on."""
    head = b"HTTP/1.1 102 Processing\r\n\r\n"
    flooded: list[int] = []

    async def script(peer: Peer) -> None:
        if await peer.read_request() is None:
            return
        sent, until = 0, time.monotonic() + FLOOD_SECONDS
        try:
            while time.monotonic() < until:
                await peer.stream.send_all(head * 64)
                sent += 64
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        flooded.append(sent)

    unknown = functools.partial(assert_error, phase="remote_execution", outcome="unknown",
                                retry="reconcile", code="REMOTE_OUTCOME_UNKNOWN")  # fmt: skip
    observed = await _call(tmp_path, script, POST, unknown)
    facts = observed["facts"]
    assert facts["informational"] == [102] * MAX_INFORMATIONAL
    assert facts["final_response_started"] is False
    assert facts["path"][-3:] == ["body_sent", "informational", "closed_early"]
    assert [facts["path"][i] for i, _ in facts["path_repeats"]] == ["informational"]
    assert facts["path_repeats"][0][1] == MAX_INFORMATIONAL
    assert len(json.dumps(observed)) < ROW_BOUND
    assert flooded and flooded[0] > MAX_INFORMATIONAL  # the peer did flood


async def test_a_body_in_one_byte_chunks_is_committed_with_bounded_evidence(
    tmp_path: Path,
) -> None:
    """Every body piece is a step: 100 KB as 1-byte chunks is 100,000 of them.  The result is
    whole and committed; the summary lists ``body`` once with its count, not once per byte."""
    size = 100_000
    body = bytes(97 + i % 26 for i in range(size))

    async def script(peer: Peer) -> None:
        if await peer.read_request() is None:
            return
        wire = b"".join(b"1\r\n%c\r\n" % c for c in body)
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        await peer.send_raw(head + wire + b"0\r\n\r\n")
        await peer.read_request()

    observed = await _call(tmp_path, script, GET, assert_ok)
    facts = observed["facts"]
    i = facts["path"].index("body")
    assert facts["path"][i:] == ["body", "framing_complete"]
    assert facts["path_repeats"] == [[i, size]]
    assert facts["body_bytes"] == size
    assert len(json.dumps(observed)) < ROW_BOUND
