"""``affidavit.strictjson.loads_bytes``: JSON text Python's parser reads otherwise than other
readers, or not at all while they do, is refused with its own error -- never taken for "no JSON"
(which a reader of a batch or a reconciliation answer would read as the body's silence)."""

from __future__ import annotations

import json

import pytest

from affidavit.strictjson import DuplicateField, NotJsonNumber, NotText, loads_bytes


@pytest.mark.parametrize(
    ("body", "error", "words"),
    [
        (b'{"n": 1e400}', NotJsonNumber, "beyond a double's range"),
        (b'{"n": [-1E+999]}', NotJsonNumber, "beyond a double's range"),
        (b'{"n": ' + b"9" * 5000 + b"}", NotJsonNumber, "more than 4300 digits"),
        (b'{"n": "\xff"}', NotText, "not text"),
    ],
    ids=["1e400", "minus-1e999", "5000-digits", "invalid-utf8"],
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
