"""JSON-RPC as a client may really send it -- raw lines on ``affidavit mcp``'s stdin, no SDK
client to keep them well-formed -- and the transport's bookkeeping of which answer was written.

* A request id still in flight is refused (-32600) and nothing runs for the second request; the
  first keeps its own record, so the journal never claims a delivery that did not happen, and
  the process still leaves when its input ends.
* A request the SDK settles unanswered (cancelled after its answer was handed over) is not
  written, even if the client then reuses its id.
* A malformed message is answered with a JSON-RPC error naming the fault, never quoting the
  message, and the log says so in a bounded number of lines.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import mcp_types as types
import trio
import trio.testing
from mcp.shared.message import ServerMessageMetadata, SessionMessage

from affidavit.mcp.transport import FAULT_LOG_EVERY, BoundedLog, StdioTransport

from .conftest import Remotes, wait_for
from .kit import PYTHON, WAIT, connected, env_without_secrets, structured
from .test_delivery import the_call

INIT = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"},
    },
}
HELD = {"target": "holds", "method": "POST", "path": "/h", "body": "{}"}
FAST = {"target": "ok", "method": "GET", "path": "/a"}


def call(request_id: Any, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    params = {"name": name, "arguments": arguments}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


class Raw:
    """One ``affidavit mcp`` process spoken to in raw JSON-RPC lines."""

    def __init__(self, proc: trio.Process, log: Path) -> None:
        self.proc = proc
        self.log = log
        self._buffer = b""

    async def send(self, message: dict[str, Any] | bytes) -> None:
        data = message if isinstance(message, bytes) else json.dumps(message).encode() + b"\n"
        assert self.proc.stdin is not None
        await self.proc.stdin.send_all(data)

    async def receive(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        with trio.fail_after(WAIT):
            while b"\n" not in self._buffer:
                data = await self.proc.stdout.receive_some(65536)
                assert data, f"the server ended early:\n{self.stderr()}"
                self._buffer += data
        line, _, self._buffer = self._buffer.partition(b"\n")
        found: dict[str, Any] = json.loads(line)
        return found

    async def answer(self, request_id: Any) -> dict[str, Any]:
        """The next answer to ``request_id`` (other messages are read past)."""
        while True:
            found = await self.receive()
            if "method" not in found and found.get("id") == request_id:
                return found

    async def exits(self) -> int:
        with trio.fail_after(WAIT):
            return await self.proc.wait()

    def stderr(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")


@asynccontextmanager
async def raw_server(
    tmp: Path, remotes: Remotes, token: str, socket: Path | None = None, service: str = ""
) -> AsyncIterator[Raw]:
    """``affidavit mcp`` embedded (``service``: its config's ``[service]`` lines), or
    (``socket``) the proxy to the daemon listening there."""
    log = tmp / "raw.log"
    if socket is None:
        cfg = remotes.config(tmp)
        if service:
            cfg.write_text(f"{cfg.read_text(encoding='utf-8')}\n[service]\n{service}\n")
        args, env = ["--config", str(cfg)], remotes.env(token)
    else:
        args, env = ["--socket", str(socket)], env_without_secrets()
    with log.open("ab") as errlog:
        proc = await trio.lowlevel.open_process(
            [PYTHON, "-m", "affidavit", "mcp", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errlog,
            env=env,
        )
    raw = Raw(proc, log)
    try:
        await raw.send(INIT)
        await raw.answer(0)
        await raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        yield raw
    finally:
        if proc.returncode is None:
            proc.kill()
        with trio.move_on_after(WAIT, shield=True):
            await proc.wait()


async def session_of(raw: Raw) -> str:
    await raw.send(call("s", "list_targets", {}))
    session: str = (await raw.answer("s"))["result"]["structuredContent"]["session"]
    return session


# -- duplicate request ids ------------------------------------------------------------------------


async def _duplicate_while_held(raw: Raw, remotes: Remotes) -> str:
    """Start a session, a call with id 7 that the remote holds, and -- once it is held -- a
    second request with the same id; return the session."""
    session = await session_of(raw)
    await raw.send(call(7, "http_request", HELD))
    await wait_for(remotes.holds.event("received"))
    await raw.send(call(7, "http_request", FAST))
    return session


async def test_a_request_id_already_in_flight_is_refused_and_nothing_runs_for_it(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    async with raw_server(tmp_path, remotes, token) as raw:
        session = await _duplicate_while_held(raw, remotes)
        refused = await raw.answer(7)
        assert refused["error"]["code"] == -32600, refused
        said = refused["error"]["message"]
        assert "7" in said and "in flight" in said and "the first one runs on" in said, said
        await raw.send(call("7", "http_request", FAST))  # the SDK's "7" is 7: the same id
        assert (await raw.answer("7"))["error"]["code"] == -32600
        # A malformed request under the same id is refused alike: its error must not read as
        # the first request's failure.
        await raw.send({"jsonrpc": "2.0", "id": 7, "method": 5})
        malformed = (await raw.answer(7))["error"]
        assert malformed["code"] == -32600, malformed
        said = malformed["message"]
        assert "in flight" in said and "the first one runs on" in said, said
        assert "its method is not a string" in said, said
        remotes.holds.event("release").set()
        held = await raw.answer(7)
        assert held["result"]["structuredContent"]["result"]["body"] == "late and done"
        # Settled: the id is free again.
        await raw.send(call(7, "http_request", FAST))
        assert (await raw.answer(7))["result"]["isError"] is False
        await raw.proc.stdin.aclose()  # type: ignore[union-attr]
        assert await raw.exits() == 0

    async with connected(
        ["--config", str(tmp_path / "affidavit.toml")], remotes.env(token), tmp_path / "mcp.log"
    ) as mcp:
        rows = structured(await mcp.call("list_actions", {"session": session}))["actions"]
        assert len(rows) == 2, rows  # the held call and the one after it: no refused one
    assert len(remotes.holds.requests) == 1
    assert len(remotes.ok.requests) == 1
    assert "already in flight" in raw.stderr()


async def test_a_duplicate_id_cannot_make_the_journal_claim_an_unwritten_answer(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    """The review's attack: a second request with the id of one in flight, answered first,
    used to mark the first's answer written.  Now it is refused; the client stops reading, and
    the held call's answer -- never written -- is RESULT_DELIVERY_FAILED; once the input ends
    the process leaves (it used to wait for ever, holding the journal)."""
    async with raw_server(tmp_path, remotes, token) as raw:
        session = await _duplicate_while_held(raw, remotes)
        first = await raw.answer(7)
        await raw.proc.stdout.aclose()  # type: ignore[union-attr]  # the answer cannot be written
        remotes.holds.event("release").set()
        await raw.proc.stdin.aclose()  # type: ignore[union-attr]
        assert await raw.exits() == 0
        assert first["error"]["code"] == -32600

    async with connected(
        ["--config", str(tmp_path / "affidavit.toml")], remotes.env(token), tmp_path / "mcp.log"
    ) as mcp:
        record = await the_call(mcp, session)
        assert record["outcome"] == "committed"
        assert record["kinds"][-1] == "RESULT_DELIVERY_FAILED"
        assert "RESULT_DELIVERED" not in record["kinds"]
    assert not remotes.ok.requests


async def test_input_ending_with_a_call_still_running_the_process_leaves_and_claims_nothing(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    """The held call is never released: the process leaves once its target's timeout ends it
    (the calls of a session that ended run to their end), and its record claims no delivery."""
    async with raw_server(tmp_path, remotes, token) as raw:
        session = await _duplicate_while_held(raw, remotes)
        first = await raw.answer(7)
        await raw.proc.stdin.aclose()  # type: ignore[union-attr]
        assert await raw.exits() == 0
        assert first["error"]["code"] == -32600
        assert "the session ended; 1 call(s) still running" in raw.stderr()

    async with connected(
        ["--config", str(tmp_path / "affidavit.toml")], remotes.env(token), tmp_path / "mcp.log"
    ) as mcp:
        record = await the_call(mcp, session)
        assert "RESULT_DELIVERED" not in record["kinds"], record
        assert "DISPATCH_STARTED" in record["kinds"]


# -- the transport's bookkeeping, in process ------------------------------------------------------


@asynccontextmanager
async def transport_on_memory() -> AsyncIterator[tuple[Any, Any, Any, Any, StdioTransport]]:
    """A transport on in-memory pipes: (client's sender, client's receiver, the server's read
    stream, the server's write stream, the transport)."""
    to_server, server_in = trio.testing.memory_stream_one_way_pair()
    server_out, from_server = trio.testing.memory_stream_one_way_pair()
    transport = StdioTransport(server_in, server_out)
    async with transport.streams() as (read, write), read, write:
        yield to_server, from_server, read, write, transport


def line(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode() + b"\n"


async def next_line(stream: Any) -> dict[str, Any]:
    data = b""
    with trio.fail_after(WAIT):
        while not data.endswith(b"\n"):
            data += await stream.receive_some(65536)
    found: dict[str, Any] = json.loads(data)
    return found


def response(request_id: Any) -> SessionMessage:
    return SessionMessage(types.JSONRPCResponse(jsonrpc="2.0", id=request_id, result={}))


async def test_a_request_settled_unanswered_is_not_written_even_when_its_id_is_reused() -> None:
    """The client cancels after the answer was handed over: the SDK writes nothing and settles
    the request unanswered.  The transport hears it (``on_request_unanswered``): the answer is
    not written -- and the answer to a later request reusing the id is not taken for it."""
    async with transport_on_memory() as (client, client_reads, read, write, transport):
        await client.send_all(line(call(7, "http_request", FAST)))
        with trio.fail_after(WAIT):
            first = await read.receive()
        outcome = transport.expect(7)
        assert isinstance(first.metadata, ServerMessageMetadata)
        assert first.metadata.on_request_unanswered is not None
        await first.metadata.on_request_unanswered()  # as the SDK settles a cancelled request
        assert outcome.settled and outcome.written is False

        await client.send_all(line({"jsonrpc": "2.0", "id": 7, "method": "tools/list"}))
        with trio.fail_after(WAIT):
            second = await read.receive()  # the id is free again: not refused
        assert second.message.id == 7
        await write.send(response(7))
        assert (await next_line(client_reads))["id"] == 7
        assert outcome.written is False


async def test_a_duplicate_leaves_the_first_request_s_bookkeeping_alone() -> None:
    async with transport_on_memory() as (client, client_reads, read, write, transport):
        await client.send_all(line(call(7, "http_request", FAST)))
        with trio.fail_after(WAIT):
            await read.receive()
        outcome = transport.expect(7)
        await client.send_all(line(call("7", "http_request", FAST)))
        refused = await next_line(client_reads)
        assert (refused["id"], refused["error"]["code"]) == ("7", -32600)
        assert not outcome.settled
        await write.send(response(7))
        assert (await next_line(client_reads))["id"] == 7
        assert outcome.settled and outcome.written is True


# -- malformed messages ---------------------------------------------------------------------------

CANARY = "secret-canary-4f1d"
ID = re.compile(rb'"id"\s*:\s*(\d+|"\w+")')
MALFORMED: list[tuple[bytes, int, str]] = [
    (
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"http_request",'
        b'"arguments":{"target":"ok","method":"GET","path":"/\\ud800' + CANARY.encode() + b'"}}}',
        -32602,
        "lone surrogate",
    ),
    (
        b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"http_request",'
        b'"arguments":{"target":"ok","method":"GET","path":"/","session":"\\ud800"}}}',
        -32602,
        "lone surrogate",
    ),
    (
        b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"http_request",'
        b'"arguments":{"target":"ok","method":"GET","path":"/","headers":{"X-\\ud800":"v"}}}}',
        -32602,
        "lone surrogate",
    ),
    (
        b'{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"\\ud800",'
        b'"arguments":{}}}',
        -32602,
        "lone surrogate",
    ),
    (
        b'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"http_request",'
        b'"arguments":{"target":"ok","method":"POST","path":"/","body":"\xff\xfe'
        + CANARY.encode()
        + b'"}}}',
        -32602,
        "not valid UTF-8",
    ),
    (
        b'{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"http_request",'
        b'"arguments":{"target":"ok","method":"GET","path":"/","headers":'
        + b'{"a":' * 300
        + b"1"
        + b"}" * 300
        + b"}}}",
        -32602,
        "nested deeper than 200 levels",
    ),
    (
        b'{"jsonrpc":"2.0","id":"n","method":"tools/call","params":{"name":"http_request",'
        b'"arguments":{"target":"ok","method":"GET","path":"/","n":' + b"9" * 5000 + b"}}}",
        -32602,
        "a number longer than 4300 digits",
    ),
    (b'{"jsonrpc":"2.0","id":8,"method":"tools/call","params":5}', -32600, "not a valid"),
    # The SDK's parser keeps the last of two same-named fields and reads NaN: a proxy reading
    # the first would see another action than the broker runs (refused, as the daemon does).
    (
        b'{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"http_request",'
        b'"arguments":{"target":"nope","target":"ok","method":"GET","path":"/"}}}',
        -32602,
        "INVALID_FIELD at action.target: is given twice",
    ),
    (
        b'{"jsonrpc":"2.0","id":12,"method":"tools/call","params":{"name":"http_request",'
        b'"arguments":{"target":"ok","method":"GET","path":"/","headers":{"X":"a","X":"b"}}}}',
        -32602,
        "INVALID_FIELD at action.headers.X: is given twice",
    ),
    (
        b'{"jsonrpc":"2.0","id":13,"method":"tools/call","params":{"name":"http_request",'
        b'"arguments":{"target":"ok","method":"GET","path":"/","n":NaN}}}',
        -32600,  # where it is, the parser does not say: the message is not strictly JSON
        "INVALID_FIELD at message: holds NaN, which is not a JSON number",
    ),
    # 1e400 (read as infinity) is refused at its own field, embedded and through the daemon
    # alike: tests/mcp/test_backend_agreement.py's inf_* rows.
    # Named twice ~150 levels down under long keys: its path is KBs, told by its start, its
    # length and a hash (it used to be quoted whole: ~13 KB per answer and log line).
    (
        b'{"jsonrpc":"2.0","id":15,"method":"tools/call","params":{"name":"http_request",'
        b'"arguments":{"target":"ok","method":"GET","path":"/","headers":'
        + b'{"'
        + b"k" * 60
        + b'":' * 1
        + (b'{"' + b"k" * 60 + b'":') * 149
        + b'{"X":1,"X":2}'
        + b"}" * 150
        + b"}}}",
        -32602,
        "INVALID_FIELD at action.headers.kkkk",
    ),
    (
        b'{"jsonrpc":"2.0","id":14,"method":"tools/list","method":"tools/call","params":'
        b'{"name":"http_request","arguments":{"target":"ok","method":"GET","path":"/"}}}',
        -32600,
        "INVALID_FIELD at message.method: is given twice",
    ),
    # Past ~1000 levels Python's parser recursed out: answered -32700 under id null, though
    # the id was readable -- the client waited for ever.  Scanned, never parsed, at any depth.
    *(
        (
            b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"http_request",'
            b'"arguments":{"headers":' % depth + b"[" * depth + b"]" * depth + b"}}}",
            -32602,
            "nested deeper than 200 levels",
        )
        for depth in (5_000, 100_000)
    ),
    (  # the id after the deep part: read from the top-level members alone
        b'{"jsonrpc":"2.0","method":"ping","params":{"a":'
        + b"[" * 100_000
        + b"]" * 100_000
        + b'},"id":"after"}',
        -32602,
        "nested deeper than 200 levels",
    ),
    (  # Python's json.dumps spacing: the id after ": " (it was answered under null)
        b'{"jsonrpc": "2.0", "id": 15, "method": "ping", "params": {"a": '
        + b"[" * 300
        + b"]" * 300
        + b"}}",
        -32602,
        "nested deeper than 200 levels",
    ),
    (
        b'{"jsonrpc" :"2.0" , "id"\t:\t"spaced" , "method" : "tools/call" , "params" : '
        b'{"name" : "http_request" , "arguments" : {"headers" : '
        + b"[" * 300
        + b"]" * 300
        + b"}}}",
        -32602,
        "nested deeper than 200 levels",
    ),
    (  # counted before any parser builds it (1.2 s of the loop's time, parsed twice)
        b'{"jsonrpc":"2.0","id":"wide","method":"tools/call","params":{"name":"http_request",'
        b'"arguments":{"headers":[' + b"{}," * 500_000 + b"{}]}}}",
        -32602,
        "more than 10000 values",
    ),
]


async def test_a_malformed_message_is_answered_with_an_error_naming_the_fault(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    async with raw_server(tmp_path, remotes, token) as raw:
        for data, code, fault in MALFORMED:
            request_id = json.loads(ID.search(data).group(1))  # type: ignore[union-attr]
            await raw.send(data + b"\n")
            answer = await raw.answer(request_id)
            assert answer["error"]["code"] == code, (data[:80], answer)
            assert fault in answer["error"]["message"], answer
            assert len(answer["error"]["message"]) < 1024, answer  # a path told, not quoted
            assert CANARY not in json.dumps(answer)

        # No id to read: a parse error, id null.
        await raw.send(b'{"jsonrpc":"2.0","id":9,"method":' + CANARY.encode() + b"\n")
        unreadable = await raw.receive()
        assert (unreadable["id"], unreadable["error"]["code"]) == (None, -32700)
        # Two ids: neither is its id (the SDK's parser kept the last one), answered under null.
        await raw.send(b'{"jsonrpc":"2.0","id":20,"id":21,"method":"ping"}\n')
        twice = await raw.receive()
        assert (twice["id"], twice["error"]["code"]) == (None, -32600), twice
        assert "INVALID_FIELD at message.id: is given twice" in twice["error"]["message"]
        # A malformed notification is not answered: the next answer is the next request's.
        await raw.send(b'{"jsonrpc":"2.0","method":"notifications/x","params":"\\ud800"}\n')
        await raw.send(call(10, "list_targets", {}))
        assert (await raw.receive())["id"] == 10
    assert not remotes.ok.requests
    log = raw.stderr()
    assert CANARY not in log
    assert "protocol fault" in log and "Traceback" not in log


def ping(request_id: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "ping"}


async def answered_once(raw: Raw, data: bytes, after: int) -> dict[str, Any]:
    """Send ``data`` and a ping with id ``after``: the first line back is an error answering
    ``data`` (not the ping's answer: ``data`` was answered, and first), the next is the ping's --
    one answer, no more, and the session goes on."""
    await raw.send(data + b"\n")
    await raw.send(ping(after))
    first = await raw.receive()
    assert "error" in first, (data[:80], first)
    assert (await raw.receive()) == {"jsonrpc": "2.0", "id": after, "result": {}}, data[:80]
    return first


def with_id(request_id: bytes, rest: bytes = b'"method":"ping"') -> bytes:
    return b'{"jsonrpc":"2.0","id":' + request_id + b"," + rest + b"}"


C = CANARY.encode()
TOOLS = b'"method":"tools/call","params":{"name":"list_targets","arguments":{"x":"' + C + b'"}}'
INVALID_IDS: list[tuple[bytes, str]] = [
    (with_id(b"true", b'"method":"tools/list"'), "its id is a boolean"),
    (with_id(b"false", TOOLS), "its id is a boolean"),
    (with_id(b"1.5", b'"method":"tools/list"'), "its id is a number with a fraction"),
    (with_id(b"1e3"), "its id is a number with a fraction"),
    (with_id(b'{"a":"' + C + b'"}'), "its id is an object"),
    (with_id(b"[1]", b'"method":"tools/list"'), "its id is an array"),
    (with_id(b"null", b'"method":"tools/list"'), "its id is null"),
    (with_id(b"null", TOOLS), "its id is null"),
    (with_id(b"9" * 5000), "longer than 4300 digits"),
    (with_id(b'"\xff\xfe' + C + b'"'), "not valid UTF-8"),
    (with_id(b'"\\ud800"'), "lone surrogate"),
    # An id makes it a request, whatever its method says: answered too.
    (
        with_id(b"true", b'"method":"notifications/cancelled","params":{"requestId":1}'),
        "its id is a boolean",
    ),
    (b'{"jsonrpc":"2.0","\\u0069d":true,"method":"tools/list"}', "its id is a boolean"),
]


async def test_a_request_whose_id_cannot_be_taken_is_answered_once_with_id_null(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    async with raw_server(tmp_path, remotes, token) as raw:
        for n, (data, fault) in enumerate(INVALID_IDS):
            answer = await answered_once(raw, data, 1000 + n)
            assert answer["jsonrpc"] == "2.0" and answer["id"] is None, (data[:80], answer)
            assert answer["error"]["code"] == -32600, (data[:80], answer)
            assert fault in answer["error"]["message"], (data[:80], answer)
            assert CANARY not in json.dumps(answer)
        # A notification has no id, and is not answered, whatever its params hold (the SDK's
        # parser takes NaN there).
        await raw.send(b'{"jsonrpc":"2.0","method":"notifications/x","params":{"a":NaN}}\n')
        await raw.send(ping("after"))
        assert (await raw.receive())["id"] == "after"
        # An integer the parser can read is an id, however long: answered under it, exactly.
        huge = int("9" * 40)
        await raw.send(b'{"jsonrpc":"2.0","id":%d,"method":"ping"}\n' % huge)
        assert (await raw.receive()) == {"jsonrpc": "2.0", "id": huge, "result": {}}
    assert not remotes.ok.requests
    log = raw.stderr()
    assert CANARY not in log and "Traceback" not in log


BAD_SHAPES: list[tuple[bytes, str]] = [
    (with_id(b"1", b'"method":5'), "its method is not a string"),
    (with_id(b"2", b'"method":null'), "its method is not a string"),
    (with_id(b"3", b'"method":["' + C + b'"]'), "its method is not a string"),
    (b'{"jsonrpc":"2.0","id":4}', "it has no method"),
    (
        with_id(b"5", b'"method":"tools/list","params":["' + C + b'"]'),
        "params member is not a JSON object",
    ),
    (
        with_id(b"6", b'"method":"tools/call","params":"' + C + b'"'),
        "params member is not a JSON object",
    ),
    (b'{"jsonrpc":"1.0","id":7,"method":"ping"}', 'jsonrpc is not "2.0"'),
    (b'{"id":8,"method":"ping"}', 'jsonrpc is not "2.0"'),
    (b'{"jsonrpc":2.0,"id":"nine","method":"ping"}', 'jsonrpc is not "2.0"'),
]


async def test_a_request_of_the_wrong_shape_is_answered_under_its_id_naming_the_fault(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    async with raw_server(tmp_path, remotes, token) as raw:
        for n, (data, fault) in enumerate(BAD_SHAPES):
            request_id = json.loads(ID.search(data).group(1))  # type: ignore[union-attr]
            answer = await answered_once(raw, data, 1000 + n)
            assert answer["jsonrpc"] == "2.0" and answer["id"] == request_id, (data, answer)
            assert answer["error"]["code"] == -32600, (data, answer)
            assert answer["error"]["message"].startswith("not a valid JSON-RPC 2.0 request: ")
            assert fault in answer["error"]["message"], (data, answer)
            assert CANARY not in json.dumps(answer)
    log = raw.stderr()
    assert CANARY not in log and "Traceback" not in log


async def test_a_flood_of_malformed_messages_is_answered_but_logged_in_few_lines(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    async with raw_server(tmp_path, remotes, token) as raw:
        flood = FAULT_LOG_EVERY + 10
        await raw.send(b"not json\n" * flood)
        for _ in range(flood):
            assert (await raw.receive())["error"]["code"] == -32700
        await raw.send(call(1, "list_targets", {}))
        assert (await raw.answer(1))["result"]["isError"] is False
    lines = [x for x in raw.stderr().splitlines() if "protocol fault" in x]
    assert 3 <= len(lines) <= 10, lines
    assert any(f"{FAULT_LOG_EVERY} protocol faults so far" in x for x in lines)


# Each holds NaN/Infinity beside another fault the SDK's parser refuses: its id is still read.
NOT_NUMBERS_AND_MORE: list[tuple[bytes, int, str]] = [
    (  # found by tests/mcp/test_fuzz.py: answered under id null, the client waited for ever
        b'{"jsonrpc":"2.0","id":31,"method":"tools/call","params":{"name":"http_request",'
        b'"arguments":[Infinity,"\\ud800"]}}',
        -32602,
        "lone surrogate",
    ),
    (
        b'{"jsonrpc":"2.0","id":32,"method":"tools/call","params":{"a":NaN,"b":'
        + b"[" * 300
        + b"]" * 300
        + b"}}",
        -32602,
        "nested deeper than",
    ),
    (
        b'{"jsonrpc":"2.0","id":"x33","method":"ping","n":-Infinity,"m":' + b"9" * 5000 + b"}",
        -32600,
        "number",
    ),
    (b'{"jsonrpc":"2.0","id":34,"method":"ping","params":{"a":"\xff","b":NaN}}', -32600, "UTF-8"),
]


async def test_a_request_holding_nan_and_another_fault_is_answered_under_its_id(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    async with raw_server(tmp_path, remotes, token) as raw:
        for n, (data, code, fault) in enumerate(NOT_NUMBERS_AND_MORE):
            request_id = json.loads(ID.search(data).group(1))  # type: ignore[union-attr]
            answer = await answered_once(raw, data, 2000 + n)
            assert (answer["id"], answer["error"]["code"]) == (request_id, code), (n, answer)
            assert fault in answer["error"]["message"], (n, answer)
        # An id that is NaN is no id: answered under null, naming it.
        answer = await answered_once(raw, b'{"jsonrpc":"2.0","id":NaN,"method":"ping"}', 2100)
        assert answer["id"] is None and "NaN" in answer["error"]["message"], answer
    log = raw.stderr()
    assert CANARY not in log and "Traceback" not in log


HOSTILE = "x\n2026-01-01 00:00:00,000 affidavit mcp[1] ERROR forged\x1b[2J\u202e"
LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} affidavit mcp\[\d+\] [A-Z]+ ")


async def test_no_caller_chosen_text_forges_or_colours_a_log_line(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    """A line feed or an ESC in an id, a method, a tool's name or arguments, a duplicated
    field's name or a notification reaches stderr escaped, if at all: every line is one of the
    server's own."""
    async with raw_server(tmp_path, remotes, token) as raw:
        for message in [
            call(HOSTILE, "list_targets", {}),
            call(1, HOSTILE, {}),
            {"jsonrpc": "2.0", "id": 2, "method": HOSTILE},
            call(3, "get_record", {"invocation_id": HOSTILE}),
            call(4, "list_actions", {"session": HOSTILE}),
            call(5, "list_targets", {HOSTILE: 1}),
        ]:
            await raw.send(message)
            await raw.answer(message["id"])
        dup = json.dumps(HOSTILE)
        line = '{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"call",'
        await raw.send(f'{line}"arguments":{{{dup}:1,{dup}:2}}}}}}\n'.encode())
        await raw.answer(6)
        await raw.send({"jsonrpc": "2.0", "method": HOSTILE, "params": {"x": HOSTILE}})
        await raw.send(b'{"jsonrpc":"2.0","id":' + json.dumps(HOSTILE).encode() + b",}\n")
        await raw.send(call(7, "list_targets", {}))
        await raw.answer(7)
    log = raw.stderr()
    assert "protocol fault" in log  # the duplicated field and the broken line were logged
    assert "\x1b" not in log and "\u202e" not in log
    assert all(LOG_LINE.match(x) for x in log.splitlines()), log


async def test_a_huge_request_id_cancelled_is_logged_by_its_length_and_hash(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    """A client chooses its ids (any string up to the message limit): one cancelled while its
    call runs on is logged once the call's answer cannot be written -- by its length and a
    short hash, never whole (a 1 MB id used to write 1 MB of log per cancelled request)."""
    big = "I" * 1_000_000
    async with raw_server(tmp_path, remotes, token) as raw:
        await raw.send(call(big, "http_request", HELD))
        await wait_for(remotes.holds.event("received"))
        cancel = {"requestId": big, "reason": "test"}
        await raw.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": cancel})
        # Lines are handed over strictly in order: once the ping after it is answered, the SDK
        # has the cancel (parsed off the loop, > OFF_LOOP) -- else the call could end first.
        await raw.send({"jsonrpc": "2.0", "id": "after-cancel", "method": "ping"})
        await raw.answer("after-cancel")
        remotes.holds.event("release").set()
        with trio.fail_after(WAIT):  # the held call ends, its answer unwritten, and is logged
            while "was not written" not in raw.stderr():
                await trio.sleep(0.05)
        await raw.send(call(8, "list_targets", {}))
        assert "result" in await raw.answer(8)  # the session is still open
        log = raw.stderr()
    assert len(log) < 4096, len(log)
    assert "the answer to request <an id of 1000002 characters, sha256 " in log


def test_an_sdk_log_record_quoting_a_huge_id_is_bounded() -> None:
    """The SDK logs a client's request id whole (``%r``: "shutdown error response for request
    ..." at WARNING); ``affidavit mcp`` bounds each of its records on its handler
    (``BoundedLog``): the start, the length and a hash, never a 1 MB line.  Others pass as
    they are."""
    import io
    import logging

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(BoundedLog())
    sdk, ours = logging.getLogger("mcp.shared.jsonrpc_dispatcher"), logging.getLogger("t.mcp")
    for logger in (sdk, ours):
        logger.addHandler(handler)
    try:
        describe = f"shutdown error response for request {'I' * 1_000_000!r}"
        sdk.warning("%s gave up: transport write blocked", describe)
        ours.warning("%s", "x" * 3000)
    finally:
        for logger in (sdk, ours):
            logger.removeHandler(handler)
    first, second = stream.getvalue().splitlines()
    assert first.startswith("shutdown error response for request 'IIII"), first[:80]
    assert len(first) < 400 and "<a message of 1000071 characters, sha256 " in first, first
    assert second == "x" * 3000
