"""The MCP transport's loop time per incoming line, before and after the pre-scan, side by side
in one run.

    .venv/bin/python tests/benchmarks/mcp_lines.py [--repeat R]

``before``: what ``StdioTransport._take`` did with a line the SDK's parser takes -- pydantic's
``validate_json``, then ``_ambiguous``'s strict re-parse.  ``after``: ``strictjson.prescan``
first (a message over the bounds is refused there, unparsed), then the same two parses for one
within them.  Lines: ``wide`` (7 MiB of ``[{},{},...]`` in a tool's arguments: refused after),
``body`` (a 6 MiB string body: within the bounds, so ``after`` adds the scan to both parses).
Also the line splitter: 20,000 lines of 512 bytes in one buffer, split by slicing off the rest
per line (before) and by offset (after).  And reading an oversized message for its id
(``transport._over_bounds``: ``prescan``, then ``strictjson.members``), once each, before: the
brackets between strings walked one by one, and a tool's ``params`` read again to their end --
after: by runs, and ``params`` read only up to the fault.  Lines: ``nest16`` (``[``*N ``]``*N in
params), ``pairs16`` (``[[],[],...]`` in params), ``args64`` (``[``*N ``]``*N in a tool's
arguments, 64 MiB).  A script, not a test: it prints figures and asserts nothing about time.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import mcp_types as types

from affidavit import strictjson
from affidavit.mcp import transport
from affidavit.mcp.transport import MAX_DEPTH, MAX_NODES, _ambiguous


def message(arguments: bytes) -> bytes:
    return (
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"http_request",'
        b'"arguments":' + arguments + b"}}"
    )


LINES = {
    "wide": message(b'{"target":"ok","headers":[' + b"{}," * ((7 << 20) // 3) + b"{}]}"),
    "body": message(
        b'{"target":"ok","method":"POST","path":"/","body":"' + b"x" * (6 << 20) + b'"}'
    ),
}


def before(line: bytes) -> None:
    types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    _ambiguous(line)


def after(line: bytes) -> None:
    try:
        strictjson.prescan(line.decode("utf-8", "surrogateescape"), MAX_DEPTH, MAX_NODES)
    except strictjson.TooLarge:
        return
    before(line)


PING = '{"jsonrpc":"2.0","id":1,"method":"ping","params":%s}'
HALF = 8 << 20
OVERSIZED = {
    "nest16": PING % ("[" * HALF + "]" * HALF),
    "pairs16": PING % ("[" + "[]," * (2 * HALF // 3) + "[]]"),
    "args64": message(b'{"h":' + b"[" * (4 * HALF - 64) + b"]" * (4 * HALF - 64) + b"}").decode(),
}


BRACKET = re.compile(r"[\[\]{}]")


def per_bracket(text: str, pos: int, end: int, depth: int) -> int | None:
    """``strictjson._closing`` before: every bracket one step."""
    for m in BRACKET.finditer(text, pos, end):
        depth += 1 if m.group() in "[{" else -1
        if depth == 0:
            return m.end()
    return None


def ids_before(text: str) -> object:
    members, closing = strictjson.members, strictjson._closing

    def whole(text: str, pos: int = 0, until: int | None = None) -> strictjson.Members:
        return members(text, pos)  # ``until`` unknown: params read to their end

    strictjson._closing, strictjson.members = per_bracket, whole  # type: ignore[assignment]
    try:
        return transport._over_bounds(text)
    finally:
        strictjson._closing, strictjson.members = closing, members


def split_slicing(buffer: bytearray) -> int:
    n = 0
    while (end := buffer.find(b"\n")) >= 0:
        _line, buffer = bytes(buffer[:end]), buffer[end + 1 :]
        n += 1
    return n


def split_offset(buffer: bytearray) -> int:
    n = start = 0
    while (end := buffer.find(b"\n", start)) >= 0:
        _line, start = bytes(buffer[start:end]), end + 1
        n += 1
    del buffer[:start]
    return n


def best(work: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        work()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    repeat = parser.parse_args().repeat
    print(f"{'line':<10} {'MiB':>5} {'before s':>9} {'after s':>9} {'before/after':>13}")
    for name, line in LINES.items():
        old = best(lambda line=line: before(line), repeat)
        new = best(lambda line=line: after(line), repeat)
        print(f"{name:<10} {len(line) / 2**20:5.1f} {old:9.3f} {new:9.3f} {old / new:12.1f}x")
    lines = bytearray((b"x" * 511 + b"\n") * 20_000)
    old = best(lambda: split_slicing(bytearray(lines)), repeat)
    new = best(lambda: split_offset(bytearray(lines)), repeat)
    mib = len(lines) / 2**20
    print(f"{'split':<10} {mib:5.1f} {old:9.3f} {new:9.3f} {old / new:12.1f}x")
    for name, text in OVERSIZED.items():
        t = time.perf_counter()
        answer = ids_before(text)
        old, t = time.perf_counter() - t, time.perf_counter()
        assert transport._over_bounds(text) == answer, name  # the same answer, sooner
        new = time.perf_counter() - t
        print(f"{name:<10} {len(text) / 2**20:5.1f} {old:9.3f} {new:9.3f} {old / new:12.1f}x")


if __name__ == "__main__":
    main()
