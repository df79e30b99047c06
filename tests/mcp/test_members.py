"""A message too large to parse is answered from its top-level members alone
(``strictjson.members``, ``transport._too_large``): under its own id, or under null when the
text does not give it exactly one -- never under an id it does not have.

Each row is a line ``prescan`` refuses (300 levels deep, past ``MAX_DEPTH``) and the answer a
client gets for it: (code, id, words the message holds).  The small version of each fault is
answered so by the parser's path (tests/mcp/test_protocol.py's MALFORMED)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from affidavit import strictjson
from affidavit.mcp.transport import MAX_DEPTH, MAX_NODES, _too_large

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


def test_a_request_whose_id_lies_past_the_strings_read_is_answered_under_null() -> None:
    """``members`` stops after ``MEMBER_STRINGS`` strings and says so: a message with "method"
    seen but no "id" yet was taken for a notification and ignored -- the client waited."""
    strings = ",".join(f'"s{i}":1' for i in range(strictjson.MEMBER_STRINGS))
    text = '{"jsonrpc":"2.0","method":"ping",' + strings + ',"x":' + DEEP + ',"id":9}'
    assert strictjson.members(text).end == "cut"
    found = answer(text)
    assert found is not None
    assert found[:2] == (-32600, None), found
    assert "no id in its first" in found[2], found


def test_a_notification_too_large_is_not_answered() -> None:
    text = '{"jsonrpc":"2.0","method":"notifications/x","params":{"a":' + DEEP + "}}"
    assert answer(text) is None


CALL = '{"jsonrpc":"2.0","id":8,"method":"%s","params":{"name":"http_request",%s}}'


@pytest.mark.parametrize(
    ("method", "member", "payload_limit"),
    [
        ("tools/call", '"arguments" : {"headers":' + DEEP + "}", True),
        ("tools/call", '"_meta":' + DEEP + ',"arguments":{}', False),
        ("prompts/get", '"arguments":{"a":' + DEEP + "}", False),
    ],
    ids=["arguments", "meta", "another_method"],
)
def test_a_bound_passed_in_a_tool_s_arguments_is_payload_limit_at_action(
    method: str, member: str, payload_limit: bool
) -> None:
    """The code and field an action's own limits get, for the transport's (200 levels, 11,000
    values): only where the fault is inside the tool's arguments."""
    found = answer(CALL % (method, member))
    assert found is not None
    assert found[:2] == (-32602, 8), found
    assert found[2].startswith("PAYLOAD_LIMIT at action: ") is payload_limit, found
    assert "nested deeper than 200 levels" in found[2], found
