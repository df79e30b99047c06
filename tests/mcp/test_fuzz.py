"""A hostile MCP client, fuzzed: whatever tool it names with whatever arguments, and whatever
lines it writes, every request is answered once, under its id, with a JSON-RPC error or a tool
result whose structured content is an envelope or a refusal naming its field; the process never
dies or prints a traceback; and the canary credential is in no message and no log line (the
remote echoes the ``Authorization`` it got).

One real ``affidavit mcp`` (embedded: it holds the credential) for the module, spoken to in raw
JSON-RPC lines; each read is bounded (``WAIT``), each property by ``max_examples``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import select
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.broker.helpers import TOKEN_ENV, http_target, write_config
from tests.broker.server_process import server_process
from tests.daemon.fuzzkit import CANARY, ECHO_SERVER, fuzz_daemon

from .kit import PYTHON, env_without_secrets

WAIT = 10.0
"""Seconds an answer may take (a call to the local echo remote takes milliseconds)."""
CODE = re.compile(r"[A-Z][A-Z0-9_]*")
TOOLS = [
    "http_request", "ssh_exec", "fetch_result", "get_record", "list_targets", "list_actions",
    "poll_operation", "reconcile_query",
]  # fmt: skip
_IDS = itertools.count(1000)


class Mcp:
    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.proc, self.log = proc, log
        self.buffer = b""

    def send(self, data: bytes | dict[str, Any]) -> None:
        if isinstance(data, dict):
            data = json.dumps(data).encode()
        assert self.proc.stdin is not None
        self.proc.stdin.write(data + b"\n")
        self.proc.stdin.flush()

    def receive(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + WAIT
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            assert left > 0, "no answer in time"
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                data = os.read(fd, 1 << 16)
                assert data, f"the server ended:\n{self.stderr()[-3000:]}"
                self.buffer += data
        line, _, self.buffer = self.buffer.partition(b"\n")
        assert CANARY.encode() not in line
        message: dict[str, Any] = json.loads(line)
        assert message.get("jsonrpc") == "2.0", message
        return message

    def answer(self, request_id: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The answer to ``request_id``, and the answers read before it (to other requests)."""
        before: list[dict[str, Any]] = []
        while True:
            message = self.receive()
            if "method" in message:
                continue  # a notification of the server's (a log message)
            if message.get("id") == request_id:
                return message, before
            before.append(message)

    def stderr(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def clean(self) -> None:
        assert self.proc.poll() is None, self.stderr()[-3000:]
        text = self.stderr()
        assert "Traceback" not in text, text[-3000:]
        assert CANARY not in text


@pytest.fixture(scope="module", params=["embedded", "proxy"])
def mcp(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mcp]:
    """``affidavit mcp`` embedded (it holds the credential), or as the daemon's proxy
    (``--socket``: it holds nothing; the daemon does)."""
    tmp = tmp_path_factory.mktemp("mcpfuzz")
    with contextlib.ExitStack() as stack:
        if request.param == "proxy":
            daemon = stack.enter_context(fuzz_daemon(tmp))
            args, env = ["--socket", str(daemon.socket)], env_without_secrets()
        else:
            url, _ = stack.enter_context(server_process(ECHO_SERVER))
            config = write_config(tmp, {"api": http_target(url)})
            args, env = ["--config", str(config)], env_without_secrets(**{TOKEN_ENV: CANARY})
        yield stack.enter_context(_mcp(tmp, args, env))


@contextlib.contextmanager
def _mcp(tmp: Path, args: list[str], env: dict[str, str]) -> Iterator[Mcp]:
    log = tmp / "mcp.log"
    with log.open("ab") as err:
        proc = subprocess.Popen(
            [PYTHON, "-m", "affidavit", "mcp", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            env=env,
        )
    m = Mcp(proc, log)
    try:
        m.send(
            {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-03-26",
                    "capabilities": {},
                    "clientInfo": {"name": "fuzz", "version": "1"},
                },
            }
        )
        m.answer(0)
        m.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        yield m
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=WAIT)
        if proc.stdout is not None:
            proc.stdout.close()
    text = m.stderr()
    assert "Traceback" not in text, text[-3000:]
    assert CANARY not in text


def check_tool_answer(answer: dict[str, Any]) -> None:
    """A tools/call answer: a JSON-RPC error, or a result whose structured content is an
    envelope, a read's answer, or a refusal naming its field; ``isError`` exactly when it
    carries an error."""
    if "error" in answer:
        assert isinstance(answer["error"]["code"], int), answer
        assert isinstance(answer["error"]["message"], str), answer
        return
    result = answer["result"]
    content = result.get("structuredContent")
    assert isinstance(content, dict), result
    has_error = "error" in content or "api_error" in content
    assert result.get("isError", False) is has_error, result
    if "error" in content:
        err = content["error"]
        assert CODE.fullmatch(err["code"]), content
        if err["phase"] == "validation":
            assert isinstance(err.get("field"), str) and err["field"], content
    if "api_error" in content:
        assert CODE.fullmatch(content["api_error"]["code"]), content


_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(
        ["\ud800", "\x00", "a\r\nX-Evil: 1", "../../etc/passwd", "9" * 5000, "é" * 300]
    )
)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)
_FIELD = _JSON | st.sampled_from(
    [
        "api",
        "GET",
        "POST",
        "/",
        "/ok",
        "//evil/x",
        "/a/../b",
        "/%2e%2e/x",
        "x" * 5000,
        "act_" + "0" * 26,
        {"X-A": "a\r\nb"},
        {"Authorization": "x"},
        -1,
        2**64,
        1e308,
    ]
)
_OPTIONAL = st.fixed_dictionaries(
    {},
    optional={
        k: _FIELD
        for k in (
            "target",
            "method",
            "path",
            "headers",
            "body",
            "body_base64",
            "session",
            "idempotency_key",
            "command",
            "stdin",
            "invocation_id",
            "operation_id",
            "from_chunk",
            "limit",
            "outcome",
            "extra",
        )
    },
)
_ARGS = st.one_of(
    _OPTIONAL,
    _OPTIONAL.map(lambda a: {"target": "api", "method": "GET", "path": "/ok", **a}),
    _JSON,
)


def _encode(value: Any) -> bytes:
    return json.dumps(value, allow_nan=True).encode("utf-8", "surrogatepass")


SETTINGS = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@SETTINGS
@given(name=st.sampled_from(TOOLS) | st.text(max_size=20), arguments=_ARGS)
def test_any_tool_call_is_answered_once_with_an_envelope_or_an_error(
    mcp: Mcp, name: str, arguments: Any
) -> None:
    request_id = next(_IDS)
    params = {"name": name, "arguments": arguments}
    mcp.send(
        _encode({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params})
    )
    answer, before = mcp.answer(request_id)
    assert not before, before
    check_tool_answer(answer)
    content = answer.get("result", {}).get("structuredContent") or {}
    if name == "http_request" and "result" in content:
        assert content["result"]["body"] == "saw [REDACTED]", content  # the echo, redacted
    mcp.clean()


_LINES = st.one_of(
    st.binary(max_size=100).filter(lambda b: b"\n" not in b),
    _JSON.map(_encode),
    st.builds(
        lambda method, params: _encode(
            {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        ),
        st.sampled_from(["tools/list", "ping", "initialize", "resources/list", "x"]),
        _JSON,
    ),
    st.integers(1, 100_000).map(lambda n: b"[" * n + b"]" * n),
    st.sampled_from(
        [
            b'{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}',
            b'{"jsonrpc":"2.0","id":NaN,"method":"ping"}',
            b'{"jsonrpc":"2.0","id":1e400,"method":"ping"}',
            b'{"jsonrpc":"2.0","id":"\xff","method":"ping"}',
            b'{"jsonrpc":"2.0","id":' + b"9" * 10000 + b',"method":"ping"}',
            b'{"jsonrpc":"1.0","id":1,"method":"ping"}',
            b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":null}',
            b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"\\ud800"}}',
            b'\xef\xbb\xbf{"jsonrpc":"2.0","id":1,"method":"ping"}',
            b"\r",
            b"",
            b"\x00" * 10,
        ]
    ),
)


@SETTINGS
@given(line=_LINES)
def test_any_line_is_answered_or_ignored_and_the_session_goes_on(mcp: Mcp, line: bytes) -> None:
    mcp.send(line)
    after = next(_IDS)
    mcp.send({"jsonrpc": "2.0", "id": after, "method": "ping"})
    answer, before = mcp.answer(after)
    assert answer == {"jsonrpc": "2.0", "id": after, "result": {}}, answer
    assert len(before) <= 1, before  # one line, at most one answer
    for other in before:
        assert "error" in other or "result" in other, other
        if "error" in other:
            assert isinstance(other["error"]["code"], int) and other["error"]["message"], other
    mcp.clean()
