"""The same bad action gets the same code and field from either backend.

Embedded, the broker parses a tool's arguments; through the daemon (``affidavit mcp
--socket``), the daemon reads them as a ``POST /v1/calls`` body and refuses what does not parse
before journaling it (400 ``BAD_JSON``, carrying the broker's own code as ``action_code``).
The agent sees one contract either way: the validation ``error`` with the broker's code and the
field to fix -- never ``BAD_JSON``, never an ``Infinity`` it did not send, never "unknown field"
for a number out of range.  Sent as raw lines: ``1e400`` is a JSON number no client library
writes from a float.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.daemon.kit import running_daemon

from .conftest import Remotes
from .test_protocol import Raw, raw_server


def deep(levels: int) -> object:
    value: object = 0
    for _ in range(levels):
        value = [value]
    return value


ACTION = '{"target":"ok","method":"GET","path":"/"%s}'
PATH = '{"target":"ok","method":"GET","path":"%s"}'
CASES: list[tuple[str, str, str, str]] = [
    # (name, arguments, code, field)
    ("deep", ACTION % f',"headers":{{"X-A":{json.dumps(deep(20))}}}', "PAYLOAD_LIMIT", "action"),
    (
        "wide",
        ACTION % f',"headers":{{"X-A":{json.dumps(list(range(10_050)))}}}',
        "PAYLOAD_LIMIT",
        "action",
    ),
    ("inf_body", ACTION % ',"body":1e400', "INVALID_FIELD", "body"),
    ("inf_timeout", ACTION % ',"timeout":1e400', "INVALID_FIELD", "timeout"),
    ("inf_header", ACTION % ',"headers":{"X-A":-1e400}', "INVALID_FIELD", "headers.X-A"),
    # ways out of the base path (audit48 #6): the broker's one check, whichever backend
    ("dots_padded", PATH % "/a/..%20/x", "INVALID_FIELD", "path"),
    ("dots_twice", PATH % "/a/%252e%252e/x", "INVALID_FIELD", "path"),
    ("dots_overlong", PATH % "/a/%c0%ae%c0%ae/x", "INVALID_FIELD", "path"),
    ("dots_full_width", PATH % "/a/%ef%bc%8e%ef%bc%8e/x", "INVALID_FIELD", "path"),
]


@contextlib.asynccontextmanager
async def raw_in(mode: str, tmp: Path, remotes: Remotes, token: str) -> AsyncIterator[Raw]:
    if mode == "embedded":
        async with raw_server(tmp, remotes, token) as raw:
            yield raw
        return
    async with (
        running_daemon(tmp, remotes.targets(), token=token) as daemon,
        raw_server(tmp, remotes, token, daemon.socket) as raw,
    ):
        yield raw


@pytest.mark.parametrize("mode", ["embedded", "daemon"])
async def test_a_bad_action_gets_the_same_code_and_field_from_either_backend(
    tmp_path: Path, remotes: Remotes, token: str, mode: str
) -> None:
    async with raw_in(mode, tmp_path, remotes, token) as raw:
        for n, (name, arguments, code, field) in enumerate(CASES):
            params = f'{{"name":"http_request","arguments":{arguments}}}'
            line = f'{{"jsonrpc":"2.0","id":{n},"method":"tools/call","params":{params}}}\n'
            await raw.send(line.encode())
            result = (await raw.answer(n))["result"]
            assert result["isError"] is True, (name, result)
            error = result["structuredContent"]["error"]
            assert (error["code"], error["field"]) == (code, field), (name, error)
            assert (error["phase"], error["outcome"]) == ("validation", "not_attempted"), error
            assert "Infinity" not in error["message"] and "unknown field" not in error["message"]
    assert not remotes.ok.requests
