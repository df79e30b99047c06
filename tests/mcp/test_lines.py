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
        for chunk in chunks:
            await to_server.send_all(chunk)
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
