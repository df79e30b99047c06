"""``affidavit.strictjson.loads_bytes``: JSON text Python's parser reads otherwise than other
readers, or not at all while they do, is refused with its own error -- never taken for "no JSON"
(which a reader of a batch or a reconciliation answer would read as the body's silence)."""

from __future__ import annotations

import json
import sys

import pytest

from affidavit.strictjson import (
    BODY_DEPTH,
    DuplicateField,
    NotJsonNumber,
    NotText,
    TooDeep,
    loads_bytes,
)


@pytest.mark.parametrize(
    ("body", "error", "words"),
    [
        (b'{"n": 1e400}', NotJsonNumber, "beyond a double's range"),
        (b'{"n": [-1E+999]}', NotJsonNumber, "beyond a double's range"),
        (b'{"n": ' + b"9" * 5000 + b"}", NotJsonNumber, "more than 4300 digits"),
        (b'{"n": "\xff"}', NotText, "not text"),
        (b'{"n": "\xed\xa0\x80"}', NotText, "not text"),  # json.loads passes it
    ],
    ids=["1e400", "minus-1e999", "5000-digits", "invalid-utf8", "encoded-surrogate"],
)
def test_json_other_readers_read_is_refused_not_taken_for_no_json(
    body: bytes, error: type[ValueError], words: str
) -> None:
    with pytest.raises(error) as caught:
        loads_bytes(body)
    assert words in str(caught.value)


@pytest.mark.parametrize("body", [b"\xff\xfe", b"<html>\xff</html>", b'{"n": "\xff"'])
def test_a_body_that_is_no_json_text_stays_the_parsers_fault(body: bytes) -> None:
    with pytest.raises(json.JSONDecodeError):
        loads_bytes(body)


def test_a_duplicates_path_is_found_only_when_asked() -> None:
    body = b'{"items": [{"id": 1, "id": 2}]}'
    with pytest.raises(DuplicateField) as caught:
        loads_bytes(body, "body_base64")
    assert caught.value.path == "body_base64.items[0].id"
    with pytest.raises(DuplicateField) as caught:
        loads_bytes(body, None)  # no second parse
    assert caught.value.path == ""
    assert loads_bytes(b'{"n": 1e300, "s": "\xc3\xa9"}') == {"n": 1e300, "s": "é"}


def _down(frames: int, body: bytes) -> object:
    return loads_bytes(body) if frames == 0 else _down(frames - 1, body)


@pytest.mark.parametrize("frames", [0, 20, 60, 300])
def test_how_deep_a_body_may_nest_does_not_depend_on_the_call_stack(frames: int) -> None:
    # 960 levels parsed directly and 20 frames down, and raised 60 frames down: one bound now.
    for body in (b"[" * 960 + b"]" * 960, b'{"a": ' * 501 + b"1" + b"}" * 501):
        with pytest.raises(TooDeep):
            _down(frames, body)
    assert _down(frames, b"[" * BODY_DEPTH + b"]" * BODY_DEPTH) is not None


@pytest.mark.parametrize("bound", [0, 10_000, 640])
def test_the_integer_bound_is_the_projects_whatever_the_process_sets(bound: int) -> None:
    # PYTHONINTMAXSTRDIGITS=0 made a 5000-digit integer load.
    before = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(bound)
    try:
        with pytest.raises(NotJsonNumber):
            loads_bytes(b'{"n": ' + b"9" * 5000 + b"}")
        with pytest.raises(NotJsonNumber):
            loads_bytes(b'{"n": -' + b"9" * 4301 + b"}")
        if bound == 0 or bound >= 4300:
            assert loads_bytes(b"[-" + b"9" * 4300 + b"]") == [-int("9" * 4300)]
    finally:
        sys.set_int_max_str_digits(before)
