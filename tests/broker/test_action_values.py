"""Action JSON text holding more than ``MAX_NODES`` values is refused before the parser builds
any of them, in ``check_shape``'s code, field and words (``actions._prescan``).

Review of the daemon's boundary: 16 MB of ``[[],[],...]`` was parsed into 5.3M lists (the
daemon's RSS 73 -> 813 MB) before ``check_shape`` refused it PAYLOAD_LIMIT, and 16 MB of
``[][]...`` held the event loop 2.9 s in the nesting scan alone.
"""

from __future__ import annotations

import json
from typing import Any
from unittest import mock

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from affidavit import strictjson
from affidavit.protocols import actions
from affidavit.protocols.actions import (
    MAX_DEPTH,
    MAX_NODES,
    ActionInvalid,
    check_shape,
    load_action_json,
)

BIG = 16 << 20
OVER = f"holds more than {MAX_NODES} values"


def _refusal(data: bytes) -> tuple[str, str, str]:
    with pytest.raises(ActionInvalid) as info:
        load_action_json(data, 2 * BIG)
    return info.value.code.value, info.value.field, info.value.message


@pytest.fixture
def no_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    """``json.loads`` fails the test if it runs at all."""

    def parse(*_args: object, **_kw: object) -> Any:
        raise AssertionError("json.loads ran on text the pre-scan refuses")

    monkeypatch.setattr(json, "loads", parse)


def test_the_refusal_is_check_shapes_own() -> None:
    with pytest.raises(ActionInvalid) as parsed:
        check_shape(list(range(MAX_NODES)))  # the list and its 10 000 numbers
    expected = (parsed.value.code.value, parsed.value.field, parsed.value.message)
    assert expected == ("PAYLOAD_LIMIT", "action", OVER)
    assert _refusal(json.dumps(list(range(MAX_NODES))).encode()) == expected


@pytest.mark.parametrize(
    "data",
    [
        b"[" + b"[]," * (BIG // 3) + b"[]]",  # the review's 16 MB: 5.3M empty lists
        b"[" + b"1," * MAX_NODES + b"1]",
        b'{"target": "api", "body": [' + b'"s",' * MAX_NODES + b'"s"]}',
        # Field names are no values: 10 000 members and the object itself are 10 001.
        json.dumps({f"k{i}": None for i in range(MAX_NODES)}).encode(),
        b"[" * MAX_DEPTH + b"0," * MAX_NODES + b"0" + b"]" * MAX_DEPTH,
    ],
    ids=["16MB-of-lists", "numbers", "strings", "object-members", "deepest"],
)
def test_text_holding_more_values_than_max_nodes_is_never_parsed(
    no_parser: None, data: bytes
) -> None:
    assert _refusal(data) == ("PAYLOAD_LIMIT", "action", OVER)


@pytest.mark.parametrize(
    "value",
    [
        list(range(MAX_NODES - 1)),  # the list and 9 999 numbers: 10 000 values
        {f"k{i}": [] for i in range(MAX_NODES - 1)},
        # Brackets, commas, colons and escaped quotes inside strings count for nothing.
        {"body": '[{"a": 1}, ' * MAX_NODES + '\\"[', "x": '"' * MAX_NODES},
    ],
    ids=["list", "object", "punctuation-in-strings"],
)
def test_text_holding_max_nodes_values_is_parsed(value: object) -> None:
    for text in (json.dumps(value), json.dumps(value, indent=2, separators=(" , ", " :\t"))):
        assert load_action_json(text.encode(), BIG) == value


@pytest.mark.parametrize(
    ("data", "where"),
    [
        (b"[]" * (BIG // 2), "line 1, column 3"),
        (b"]" * BIG, "line 1, column 1"),
        (b'"a":' * (BIG // 4), "line 1, column 4"),
        (b"{" + b'"a":' * (BIG // 4), "line 1, column 9"),
        (b"," * BIG, "line 1, column 1"),
        (b'"abc\\', "line 1, column 1"),
    ],
    ids=["lists-one-after-another", "closing", "names", "names-without-values", "commas", "cut"],
)
def test_text_that_is_no_json_is_left_to_the_parser_at_its_first_fault(
    data: bytes, where: str
) -> None:
    """The scan stops where no JSON text could go on, and the parser refuses it there as before
    (its line and column); never counted on to its end: at most about ``3 * MAX_NODES`` tokens
    whatever the text (``_TOKEN`` matched per token, counted here)."""
    calls = 0
    match = strictjson._TOKEN.match

    def counted(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        return match(*args)

    with mock.patch.object(strictjson, "_TOKEN", mock.Mock(match=counted)):
        code, field, message = _refusal(data)
    assert (code, field) == ("INVALID_FIELD", "action")
    assert message == f"is not valid JSON ({where})"
    assert calls <= 3 * MAX_NODES + 3, calls


def _json_values() -> st.SearchStrategy[Any]:
    # Floats: finite ones (NaN and Infinity are no JSON), written with exponents at their
    # extremes (``1e-05``, ``1.7976931348623157e+308``); text of any code point but surrogates.
    floats = st.floats(allow_nan=False, allow_infinity=False)
    scalars = st.none() | st.booleans() | st.integers() | floats | st.text(max_size=5)
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=3), inner),
        max_leaves=40,
    )


def _depth(value: object) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


_SPACE = st.text(alphabet=" \t\n\r", max_size=3)
"""JSON's whitespace, all four kinds, between any two tokens."""


@given(
    value=_json_values(),
    limit=st.integers(1, 60),
    indent=st.sampled_from([None, 0, 2]),
    ascii_only=st.booleans(),
    space=st.tuples(_SPACE, _SPACE, _SPACE, _SPACE, _SPACE, _SPACE),
)
def test_the_scan_counts_values_as_check_shape_does(
    value: Any,
    limit: int,
    indent: int | None,
    ascii_only: bool,
    space: tuple[str, ...],
) -> None:
    """Whatever the value and however it is written -- floats and exponents, non-ASCII text
    raw or escaped, tabs, line breaks and carriage returns between the tokens -- the text is
    refused for its values exactly when the parsed object would be, at small limits."""
    assume(_depth(value) <= MAX_DEPTH)
    before, after, comma, item, colon, key = space
    text = json.dumps(
        value,
        indent=indent,
        ensure_ascii=ascii_only,
        separators=(f"{comma},{item}", f"{colon}:{key}"),
    )
    text = (before + text + after).encode("utf-8")
    with mock.patch.object(actions, "MAX_NODES", limit):
        try:
            check_shape(value)
            refused = False
        except ActionInvalid:
            refused = True
        try:
            assert load_action_json(text, BIG) == value
            scanned = False
        except ActionInvalid as exc:
            assert exc.message == f"holds more than {limit} values"
            scanned = True
    assert scanned == refused
