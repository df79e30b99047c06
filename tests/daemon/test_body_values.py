"""A request body holding more than ``MAX_NODES`` values is refused before it is parsed, on every
route that reads JSON, and a large body is parsed off the event loop.

Review of the daemon's boundary: a 15.9 MB action of 5.3M ``[]`` raised the daemon's RSS from 73
to 813 MB before ``check_shape`` refused it PAYLOAD_LIMIT, parsed on the event loop (16 MB of
``[][]...`` stalled every client 2.9 s).  The refusal keeps ``check_shape``'s code, field and
words -- now at the text, as deep nesting is: ``BAD_JSON`` through the socket, the same line as
``affidavit call`` embedded, nothing journaled (``tests/broker/test_action_values.py`` proves
the parser never runs).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.wire import blocking_request
from affidavit.daemon import http
from affidavit.protocols.actions import MAX_NODES
from tests.broker.helpers import TOKEN_ENV
from tests.http.hostile import Reply, scripts

from .kit import action, cli, embedded, in_process, serving

OVER = f"holds more than {MAX_NODES} values"
SMALL = json.dumps(action(body=json.dumps(list(range(MAX_NODES))), extra=[0] * MAX_NODES)).encode()
"""An action of 10 000 + 5 values (its body a string: one value)."""
LISTS = b"[" + b"[]," * (5_300_000 - 1) + b"[]]"
"""The review's 15.9 MB action of 5.3M ``[]``."""


async def _post(socket: Path, path: str, body: bytes) -> tuple[int, str, str, str | None]:
    answer = await trio.to_thread.run_sync(blocking_request, str(socket), "POST", path, body)
    error = answer.error()
    return answer.status, error.code, error.message, error.field


async def test_a_body_holding_more_than_max_nodes_values_is_refused_on_every_json_route(
    tmp_path: Path, token: str
) -> None:
    many = json.dumps({"note": [0] * MAX_NODES}).encode()  # 10 002 values
    async with serving(tmp_path, scripts.serve(Reply(200)), token=token) as (srv, daemon):
        for body in (LISTS, SMALL):
            assert await _post(daemon.socket, "/v1/calls", body) == (
                400,
                "BAD_JSON",
                f"action refused: PAYLOAD_LIMIT at action: {OVER}",
                "action",
            )
        for path in ("/v1/invocations/act_x/reconcile", "/v1/approvals/act_x/approve"):
            refused = await _post(daemon.socket, path, many)
            assert refused == (400, "BAD_JSON", f"the body {OVER}", "body"), path
        through = await cli(daemon, "call", "-", stdin=SMALL)
        listed = await cli(daemon, "actions", "--json")
    local = await embedded("call", "-", "--config", str(daemon.config), stdin=SMALL)
    assert through.returncode == local.returncode == 2, (through.stderr, local.stderr)
    assert (
        through.stderr
        == local.stderr
        == (f"affidavit: action refused: PAYLOAD_LIMIT at action: {OVER}\n".encode())
    )
    assert srv.requests == [] and listed.json() == []  # nothing sent, nothing journaled


async def test_a_body_over_free_body_is_parsed_in_a_worker_thread(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parsing a body of up to the daemon's ``max_body`` takes long enough to stall every
    connection on the event loop: one over ``FREE_BODY`` is parsed in ``parse_threads``."""
    monkeypatch.setenv(TOKEN_ENV, token)
    on_loop: list[tuple[int, bool]] = []
    parse = http.parse_json

    def watched(raw: bytes | bytearray, *args: Any, **kw: Any) -> Any:
        on_loop.append((len(raw), threading.current_thread() is threading.main_thread()))
        return parse(raw, *args, **kw)

    monkeypatch.setattr(http, "parse_json", watched)
    large = json.dumps(action(path="/v1/large", body="x" * http.FREE_BODY)).encode()
    small = json.dumps(action(path="/v1/small")).encode()
    assert threading.current_thread() is threading.main_thread()  # where trio runs the daemon
    async with in_process(tmp_path, scripts.serve(Reply(200))) as (srv, socket):
        for body in (large, small):
            answer = await trio.to_thread.run_sync(
                blocking_request, str(socket), "POST", "/v1/calls", body
            )
            assert answer.status == 200 and "error" not in answer.json(), answer
    assert on_loop == [(len(large), False), (len(small), True)]
    assert len(srv.requests) == 2
