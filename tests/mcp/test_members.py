"""A message too large to parse is answered from its top-level members alone
(``strictjson.members``, ``transport._too_large``): under its own id, or under null when the
text does not give it exactly one -- never under an id it does not have.

Each row is a line ``prescan`` refuses (300 levels deep, past ``MAX_DEPTH``) and the answer a
client gets for it: (code, id, words the message holds).  The small version of each fault is
answered so by the parser's path (tests/mcp/test_protocol.py's MALFORMED)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
import trio
import trio.testing

from affidavit import strictjson
from affidavit.mcp.transport import (
    ID_TEXT,
    MAX_DEPTH,
    MAX_LINE,
    MAX_NODES,
    StdioTransport,
    _too_large,
)
from affidavit.strictjson import ACTION_NODES

DEEP = "[" * 300 + "]" * 300


def answer(text: str) -> tuple[int, Any, str] | None:
    with pytest.raises(strictjson.TooLarge) as refused:
        strictjson.prescan(text, MAX_DEPTH, MAX_NODES)
    return _too_large(text, refused.value)


def test_a_member_s_value_starts_after_the_whitespace_around_its_colon() -> None:
    text = '{"id" : 5,\n "method":\t"ping"}'
    found = strictjson.members(text)
    assert found.end == "closed"
    assert [(name, text[at]) for name, at in found.found] == [("id", "5"), ("method", '"')]


ROWS: list[tuple[str, tuple[int, Any, str]]] = [
    # Python's json.dumps spacing: the id is the request's (it was answered under null).
    (
        json.dumps({"jsonrpc": "2.0", "id": 5, "method": "ping", "params": {"a": "@"}}).replace(
            '"@"', DEEP
        ),
        (-32602, 5, "nested deeper than 200 levels"),
    ),
    # Outside params: the request's shape is at fault, not the method's parameters.
    ('{"jsonrpc":"2.0","id":6,"method":"ping","x":' + DEEP + "}", (-32600, 6, "nested deeper")),
    # Two ids: neither is its id, as for a message in bounds (it was answered under 1).
    (
        '{"id":1,"id":2,"jsonrpc":"2.0","method":"ping","params":{"a":' + DEEP + "}}",
        (-32600, None, "INVALID_FIELD at message.id: is given twice"),
    ),
    # A second value after the object: no JSON text, as the small one (it was answered under 42).
    ('{"jsonrpc":"2.0","method":"ping","params":{"a":' + DEEP + '}} {"id":42}', (-32700, None, "")),
    # An id the JSON text breaks off after: no JSON text, as the small one (they were answered
    # under 5, the number read before the break, or under null as "an array").
    *(
        (
            '{"jsonrpc":"2.0","id":' + broken + ',"method":"ping","params":{"a":' + DEEP + "}}",
            (-32700, None, "not valid JSON"),
        )
        for broken in ("5x", "5 6", '"a" "b"', "nul", "5,,")
    ),
    ('{"jsonrpc":"2.0","method":"ping","params":{"a":' + DEEP + '},"id":}', (-32700, None, "")),
    # Never closed: no JSON text either.
    ('{"jsonrpc":"2.0","id":7,"method":"ping","params":{"a":' + "[" * 300, (-32700, None, "")),
]


@pytest.mark.parametrize(("text", "expected"), ROWS, ids=range(len(ROWS)))
def test_a_refused_message_is_answered_under_the_id_it_has(
    text: str, expected: tuple[int, Any, str]
) -> None:
    found = answer(text)
    assert found is not None
    code, request_id, words = expected
    assert found[:2] == (code, request_id), found
    assert words in found[2], found


def test_members_stop_at_the_bracket_that_closes_the_object() -> None:
    found = strictjson.members('{"a":[[{}]]} {"id":42}')
    assert (found.found, found.end) == ([("a", 5)], "more")


def test_members_read_until_a_point_leave_the_rest_unread() -> None:
    """``until``: how ``_in_arguments`` reads a tool's params only up to where the bound was
    passed (the rest was read once, for the id)."""
    text = '{"name":"x","arguments":{"a":[[]]},"_meta":{}}'
    until = text.index("[[")
    found = strictjson.members(text, 0, until)
    assert (found.found, found.end) == ([("name", 8), ("arguments", 24)], "cut")
    assert strictjson.members(text).found[-1] == ("_meta", 43)


STRINGS = ",".join(f'"s{i}":1' for i in range(strictjson.MEMBER_STRINGS))


def test_a_request_whose_id_lies_past_the_strings_read_is_answered_under_null() -> None:
    """``members`` stops after ``MEMBER_STRINGS`` strings and says so: a message with "method"
    seen but no "id" yet was taken for a notification and ignored -- the client waited."""
    text = '{"jsonrpc":"2.0","method":"ping",' + STRINGS + ',"x":' + DEEP + ',"id":9}'
    assert strictjson.members(text).end == "cut"
    found = answer(text)
    assert found is not None
    assert found[:2] == (-32600, None), found
    assert "no id in its first" in found[2], found


@pytest.mark.parametrize(
    "text",
    [
        # A second id past the strings read: the short one is answered under null (two ids).
        '{"jsonrpc":"2.0","id":1,"method":"ping",' + STRINGS + ',"x":' + DEEP + ',"id":2}',
        # A second value after the object: the short one is -32700 under null (no JSON text).
        '{"jsonrpc":"2.0","id":1,"method":"ping",' + STRINGS + ',"x":' + DEEP + '} {"id":2}',
    ],
    ids=["second_id", "second_value"],
)
def test_an_id_read_before_the_scan_was_cut_is_not_taken_for_its_id(text: str) -> None:
    """What lies past the strings read is unknown: an id found before it may not be the
    message's only one, nor the message one JSON text -- answered under null (it was under 1)."""
    assert strictjson.members(text).end == "cut"
    found = answer(text)
    assert found is not None
    assert found[:2] == (-32600, None), found
    assert f"read no further than its first {strictjson.MEMBER_STRINGS} strings" in found[2]


def test_a_notification_too_large_is_not_answered() -> None:
    text = '{"jsonrpc":"2.0","method":"notifications/x","params":{"a":' + DEEP + "}}"
    assert answer(text) is None


CALL = '{"jsonrpc":"2.0","id":8,"method":"%s","params":{"name":"http_request",%s}}'
WIDE = '{"h":[' + "1," * 5_999 + "1]}"
"""6,001 values: over the message's 11,000 twice, within an action's own 10,000 once."""
DEEPER = "more than 11000 values", "nested deeper than 200 levels"
MILLE = "[" + "1," * 999 + "1]"
"""1,001 values."""
OVER = '{"h":[' + "1," * 10_499 + "1]}"
"""10,502 values: within the message's 11,000 alone, over an action's 10,000."""
OWN = f"more than {ACTION_NODES} values"
WIDE_THEN_DEEP = '{"a":' + WIDE + ',"b":' + DEEP + "}"


@pytest.mark.parametrize(
    ("method", "member", "payload_limit", "words"),
    [
        ("tools/call", '"arguments" : {"headers":' + DEEP + "}", True, DEEPER[1]),
        ("tools/call", '"_meta":' + DEEP + ',"arguments":{}', False, DEEPER[1]),
        ("prompts/get", '"arguments":{"a":' + DEEP + "}", False, DEEPER[1]),
        # The message's count passed in the arguments, which hold 6,001 values: the action is
        # within its own bounds -- the message is not (it was PAYLOAD_LIMIT at action).
        ("tools/call", '"_meta":' + WIDE + ',"arguments":' + WIDE, False, DEEPER[0]),
        ("tools/call", '"arguments":' + WIDE + ',"_meta":' + WIDE, False, DEEPER[0]),
        ("tools/call", '"arguments":{"a":' + WIDE + ',"b":' + WIDE + "}", True, OWN),
        ("prompts/get", '"arguments":{"a":' + WIDE + ',"b":' + WIDE + "}", False, DEEPER[0]),
        # The message's count passed in the arguments, which are nested past the bound on their
        # own further on: the action's fault, in its words (it had no prefix).
        ("tools/call", '"_meta":' + WIDE + ',"arguments":' + WIDE_THEN_DEEP, True, DEEPER[1]),
        # Over an action's own 10,000 values alone, not the message's 11,000 (it had no prefix).
        ("tools/call", '"_meta":' + MILLE + ',"arguments":' + OVER, True, OWN),
    ],
    ids=[
        "arguments",
        "meta",
        "another_method",
        "count_meta_then_arguments",
        "count_arguments_then_meta",
        "count_arguments",
        "count_another_method",
        "count_then_arguments_deep",
        "count_arguments_over_their_own",
    ],
)
def test_a_bound_passed_in_a_tool_s_arguments_is_payload_limit_at_action(
    method: str, member: str, payload_limit: bool, words: str
) -> None:
    """The code and field an action's own limits get, for the transport's (200 levels, 11,000
    values): only where the fault is the tool's arguments' own -- nested past the bound inside
    them, or holding more values than the bound on their own."""
    found = answer(CALL % (method, member))
    assert found is not None
    assert found[:2] == (-32602, 8), found
    assert found[2].startswith("PAYLOAD_LIMIT at action: ") is payload_limit, found
    assert words in found[2], found


def per_bracket(text: str, depth: int) -> int | None:
    """Where ``depth`` comes to 0, bracket by bracket (``strictjson._closing`` reads runs)."""
    for i, char in enumerate(text):
        depth += 1 if char in "[{" else -1 if char in "]}" else 0
        if depth == 0:
            return i + 1
    return None


def test_brackets_read_by_runs_close_where_read_one_by_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Runs, groups that close what they open (up to 4 deep, then deeper ones) and windows'
    edges cutting them anywhere (windows of 1 to 8 characters): the same bracket closes."""
    rng = random.Random(3)
    parts = ["[", "]", "{", "}", ",", "1", "[]", "[[]]", "[[[[[]]]]]", "[{}]", "]]]", "[[["]
    for case in range(3000):
        monkeypatch.setattr(strictjson, "SCAN_CHUNK", 1 + case % 8)
        text = "".join(rng.choice(parts) for _ in range(rng.randrange(1, 30)))
        depth = rng.randrange(1, 5)
        expected = per_bracket(text, depth)
        assert strictjson._closing(text, 0, len(text), depth) == expected, (text, depth)


LONG = "\\\\" * (2 * ID_TEXT)
"""A string's JSON text of 4 Mi characters, escapes all (2 Mi backslashes decoded)."""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '{"jsonrpc":"2.0","id":"' + LONG + '","method":"ping","params":{"a":' + DEEP + "}}",
            (-32602, None, "nested deeper than 200 levels"),
        ),
        # Answered under null too when the text breaks off inside it (it cannot tell).
        ('{"jsonrpc":"2.0","id":"' + LONG + '" x,"params":{"a":' + DEEP + "}}", (-32600, None, "")),
        (
            '{"' + LONG + '":1,"jsonrpc":"2.0","id":5,"method":"ping","params":{"a":' + DEEP + "}}",
            (-32602, 5, "nested deeper than 200 levels"),
        ),
        # A method's name is read only to tell ``tools/call`` (``_action_at_fault``).
        (
            '{"jsonrpc":"2.0","id":5,"method":"' + LONG + '","params":{"a":' + DEEP + "}}",
            (-32602, 5, "nested deeper than 200 levels"),
        ),
    ],
    ids=["id", "broken_id", "name", "method"],
)
def test_an_oversized_message_decodes_no_long_id_or_name_whole(
    monkeypatch: pytest.MonkeyPatch, text: str, expected: tuple[int, Any, str]
) -> None:
    """One decoding call holds the GIL throughout (32 Mi characters of escapes: 0.32 s, the
    event loop stalled though the line is read in a thread): an id is decoded from its first
    ``ID_TEXT`` characters only (longer: answered under null), a member's name only when at
    most ``MEMBER_NAME`` (longer: no name read)."""
    decoded: list[int] = []
    raw_decode = json.JSONDecoder.raw_decode

    def counted(self: json.JSONDecoder, s: str, idx: int = 0) -> tuple[Any, int]:
        decoded.append(len(s) - idx)
        return raw_decode(self, s, idx)

    monkeypatch.setattr(json.JSONDecoder, "raw_decode", counted)
    found = answer(text)
    assert found is not None
    code, request_id, words = expected
    assert found[:2] == (code, request_id), found
    assert words in found[2], found
    assert max(decoded) <= ID_TEXT + 1, max(decoded)


# -- the event loop while a hostile line is read --------------------------------------------------

TICK = 0.005
STALL = 1.0
"""The loop's largest gap allowed while a 64 MiB line is read: generous (a busy machine, a
worker thread taking the GIL in turns); the scan on the loop held it for tens of seconds."""


STALLING = [
    # Finding its id walks every bracket (seconds): answered under its id, with its fault.
    (
        CALL
        % ("tools/call", '"arguments":{"headers":[' + "[]," * ((MAX_LINE - 200) // 3) + "[]]}"),
        (8, -32602, f"PAYLOAD_LIMIT at action: {OWN}"),
    ),
    # In bounds, parsed (2.8 s of the loop): passed to the server.
    (CALL % ("tools/call", '"arguments":{"a":"' + "\\u0041" * ((MAX_LINE - 200) // 6) + '"}'), 8),
    # An id of 32 Mi characters of escapes (decoded whole: 0.32 s in one call, the GIL held):
    # decoded no further than ``ID_TEXT`` characters, answered under null.
    (
        '{"jsonrpc":"2.0","id":"' + "\\\\" * (MAX_LINE // 4) + '","method":"tools/call",'
        '"params":{"name":"x","arguments":{"h":' + DEEP + "}}}",
        (None, -32602, "PAYLOAD_LIMIT at action: nested deeper than 200 levels"),
    ),
    # A member's name as long (decoded whole: 0.12 s): no name read, the id still is.
    (
        '{"' + "\\\\" * (MAX_LINE // 4) + '":1,"jsonrpc":"2.0","id":8,"method":"tools/call",'
        '"params":{"name":"x","arguments":{"h":' + DEEP + "}}}",
        (8, -32602, "PAYLOAD_LIMIT at action: nested deeper than 200 levels"),
    ),
]


@pytest.mark.parametrize(
    ("text", "expected"), STALLING, ids=["brackets", "string", "huge_id", "huge_name"]
)
async def test_a_64_mib_line_never_stalls_the_event_loop(text: str, expected: Any) -> None:
    """A line just under ``MAX_LINE`` is read, bounded and parsed off the loop (``OFF_LOOP``),
    and no call there holds the GIL long: a ticker task's largest gap stays small.  Each is
    answered here (its id, code and words) or passed to the server (its id)."""
    assert len(text) < MAX_LINE
    to_server, server_in = trio.testing.memory_stream_one_way_pair()
    server_out, from_server = trio.testing.memory_stream_one_way_pair()
    transport = StdioTransport(server_in, server_out)
    gaps: list[float] = []

    async def ticker() -> None:
        last = trio.current_time()
        while True:
            await trio.sleep(TICK)
            now = trio.current_time()
            gaps.append(now - last)
            last = now

    async with transport.streams() as (read, write), read, write, trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        await to_server.send_all(text.encode() + b"\n")
        with trio.fail_after(120):
            if isinstance(expected, tuple):
                data = b""
                while not data.endswith(b"\n"):
                    data += await from_server.receive_some(65536)
                found = json.loads(data)
                got = (found["id"], found["error"]["code"], found["error"]["message"])
            else:
                got = (await read.receive()).message.id  # type: ignore[union-attr]
        nursery.cancel_scope.cancel()
    assert got == expected, got
    assert len(gaps) > 10 and max(gaps) < STALL, max(gaps)
    print(f"largest gap {max(gaps):.3f} s")
