"""How the transport cuts its input into lines: each byte searched for the newline once,
whatever the line's length -- searched again per 64 KiB read, a 64 MiB line took 1,024 searches
of the whole buffer (2.95 s of the event loop), and a client that never sends a newline took as
long per ``max_line`` it sent."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.testing

from affidavit.mcp import transport
from affidavit.mcp.transport import MAX_LINE, StdioTransport

READ = 65536
"""What the transport reads at a time (``receive_some``)."""


async def answers(chunks: list[bytes], max_line: int, count: int) -> list[dict[str, Any]]:
    """The first ``count`` answers the transport writes for ``chunks`` sent in turn."""
    to_server, server_in = trio.testing.memory_stream_one_way_pair()
    server_out, from_server = trio.testing.memory_stream_one_way_pair()
    stdio = StdioTransport(server_in, server_out)
    stdio.max_line = max_line
    data = b""
    async with stdio.streams() as (read, write), read, write:
        for chunk in chunks:  # each read whole before the next is sent: the split is kept
            await to_server.send_all(chunk)
            await trio.testing.wait_all_tasks_blocked()
        with trio.fail_after(60):
            while data.count(b"\n") < count:
                data += await from_server.receive_some(READ)
    return [json.loads(line) for line in data.splitlines()]


@pytest.mark.parametrize(
    ("chunks", "max_line", "codes"),
    [
        # One line just under the bound: a JSON string, no message (answered -32600).
        ([b'"' + b"a" * (MAX_LINE - 3) + b'"\n'], MAX_LINE, [-32600]),
        # 64 MiB with no newline past a 4 MiB bound: dropped, then the next line is read.
        ([b"a" * MAX_LINE, b'\n"b"\n'], 4 * 1024 * 1024, [-32600, -32600]),
    ],
    ids=["line", "dropped"],
)
async def test_each_byte_is_searched_for_the_newline_once(
    monkeypatch: pytest.MonkeyPatch, chunks: list[bytes], max_line: int, codes: list[int]
) -> None:
    searched = [0, 0]  # calls, bytes
    find = transport._newline

    def counted(buffer: bytearray, start: int) -> int:
        searched[0] += 1
        end = find(buffer, start)
        searched[1] += (len(buffer) if end < 0 else end + 1) - start
        return end

    monkeypatch.setattr(transport, "_newline", counted)
    found = await answers(chunks, max_line, len(codes))
    assert [(a["id"], a["error"]["code"]) for a in found] == [(None, c) for c in codes], found
    sent = sum(len(chunk) for chunk in chunks)
    assert searched[1] <= sent, searched  # once each (it was 32 GiB for the 64 MiB line)
    assert searched[0] <= sent // READ + 2 * len(codes) + 2, searched  # one per read, per line


OVER = b'{"jsonrpc":"2.0","id":5,"method":7,"params":{"a":"' + b"a" * 140_000 + b'"}}\n'
"""A line over a 100,000-byte bound: its method no string, so parsed it would be answered under
its id 5 -- as it was when its newline came in the read that took it past the bound."""


@pytest.mark.parametrize(
    "split", [len(OVER), 90_000, 100_000, 100_001, len(OVER) - 1], ids=lambda n: f"at{n}"
)
async def test_a_line_over_the_bound_is_refused_however_its_reads_split_it(split: int) -> None:
    chunks = [OVER[:split], OVER[split:] + b'"next"\n']
    found = await answers([c for c in chunks if c], 100_000, 2)
    assert [(a["id"], a["error"]["code"]) for a in found] == [(None, -32600)] * 2, found
    assert found[0]["error"]["message"] == "a message over 100000 bytes: dropped unread", found
    assert "not a JSON-RPC message" in found[1]["error"]["message"], found  # read on after it


FILLER = "a" * (2 * transport.OFF_LOOP)


@pytest.mark.parametrize(
    ("line", "parser", "off_loop"),
    [
        # A request in bounds: read again strictly (``_ambiguous``) -- 2.8 s of the loop for 64
        # MiB of escapes, with pydantic's parse; now in the thread the bounds' scan has.
        ({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"a": FILLER}}, "_ambiguous", 1),
        # One the SDK's parser refuses: diagnosed (``_diagnose``) there too.
        ({"jsonrpc": "2.0", "id": 1, "method": 7, "params": {"a": FILLER}}, "_diagnose", 1),
        # A short one stays on the loop: no thread's hop for the common message.
        ({"jsonrpc": "2.0", "id": 1, "method": 7}, "_diagnose", 0),
    ],
    ids=["request", "malformed", "short"],
)
async def test_a_long_line_is_parsed_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch, line: dict[str, Any], parser: str, off_loop: int
) -> None:
    threads: list[bool] = []
    parse = getattr(transport, parser)

    def watched(data: bytes) -> Any:
        threads.append(trio.lowlevel.in_trio_task())
        return parse(data)

    monkeypatch.setattr(transport, parser, watched)
    to_server, server_in = trio.testing.memory_stream_one_way_pair()
    server_out, from_server = trio.testing.memory_stream_one_way_pair()
    async with StdioTransport(server_in, server_out).streams() as (read, write), read, write:
        await to_server.send_all(json.dumps(line).encode() + b"\n")
        with trio.fail_after(60):
            if parser == "_ambiguous":
                assert (await read.receive()).message.id == 1  # type: ignore[union-attr]
            else:
                assert json.loads(await from_server.receive_some(READ))["id"] == 1
    assert threads == [not off_loop], threads  # in the loop's own task, or a worker's


def test_a_line_is_copied_out_of_the_buffer_once() -> None:
    """A line cut from the read buffer costs its own size at the peak, not twice it (64 MiB
    more for a 64 MiB line, not 128)."""
    import tracemalloc

    buffer = bytearray(b"x" * (8 * 1024 * 1024 + 2))
    tracemalloc.start()
    try:
        line = transport._cut(buffer, 1, len(buffer) - 1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert line == bytes(buffer[1:-1])
    assert peak < 1.1 * len(line), peak  # it was 2x: a bytearray slice, then its bytes
