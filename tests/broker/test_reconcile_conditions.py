"""A reconcile condition's ``json:`` VALUE compares typed where it is a JSON literal
(``affidavit/protocols/http/reconcile.py``, ``Condition.typed``): an integer literal only a
JSON integer of that text, ``true``/``false``/``null`` only that JSON literal, a quoted VALUE
(``"true"``) only the string it spells, any other VALUE only a non-empty string equal to it,
whole.  A VALUE that could never match is refused when the config is read."""

from __future__ import annotations

import json
from typing import Any

import pytest

from affidavit.protocols.http.reconcile import parse_condition
from affidavit.protocols.http.selectors import ABSENT, json_body, scalar, select

LONG = "a" * 256

CASES: list[tuple[str, str, Any, list[tuple[str, str]], bool]] = [
    # (id, condition, JSON body (None: none), headers, holds)
    ("true-vs-string-true", "json:/ok=true", {"ok": "true"}, [], False),
    ("true-vs-boolean", "json:/ok=true", {"ok": True}, [], True),
    ("true-vs-false", "json:/ok=true", {"ok": False}, [], False),
    ("true-vs-one", "json:/ok=true", {"ok": 1}, [], False),
    ("false-vs-boolean", "json:/ok=false", {"ok": False}, [], True),
    ("false-vs-zero", "json:/ok=false", {"ok": 0}, [], False),
    ("false-vs-absent", "json:/ok=false", {}, [], False),
    ("null-vs-null", "json:/ok=null", {"ok": None}, [], True),
    ("null-vs-absent", "json:/ok=null", {}, [], False),
    ("null-vs-no-body", "json:/ok=null", None, [], False),
    ("null-vs-string-null", "json:/ok=null", {"ok": "null"}, [], False),
    ("quoted-true-vs-string", 'json:/ok="true"', {"ok": "true"}, [], True),
    ("quoted-true-vs-boolean", 'json:/ok="true"', {"ok": True}, [], False),
    ("quoted-number-vs-integer", 'json:/code="404"', {"code": 404}, [], False),
    ("quoted-number-vs-string", 'json:/code="404"', {"code": "404"}, [], True),
    ("quoted-empty-vs-empty", 'json:/x=""', {"x": ""}, [], True),
    ("quoted-escape", 'json:/x="a\\"b"', {"x": 'a"b'}, [], True),
    ("number-vs-integer", "json:/code=404", {"code": 404}, [], True),
    ("number-vs-string", "json:/code=404", {"code": "404"}, [], False),
    ("number-vs-float", "json:/code=404", {"code": 404.0}, [], False),
    ("one-vs-boolean", "json:/n=1", {"n": True}, [], False),
    ("negative-number", "json:/n=-3", {"n": -3}, [], True),
    ("string-vs-string", "json:/status=succeeded", {"status": "succeeded"}, [], True),
    ("text-vs-integer", "json:/code=0404", {"code": 404}, [], False),
    ("prefix-of-a-long-string", f"json:/s={LONG}", {"s": LONG + "-and-more"}, [], False),
    ("whole-long-string", f"json:/s={LONG}", {"s": LONG}, [], True),
    ("header-number-is-text", "header:X-Code=404", None, [("X-Code", "404")], True),
    ("header-prefix", f"header:X-Long={LONG}", None, [("X-Long", LONG + "z")], False),
]


@pytest.mark.parametrize(
    ("condition", "doc", "headers", "holds"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_a_json_literal_value_compares_typed(
    condition: str, doc: Any, headers: list[tuple[str, str]], holds: bool
) -> None:
    cond = parse_condition(condition)
    body = json_body(None if doc is None else json.dumps(doc).encode())
    summary = {"status": 200, "headers": headers}
    assert cond.holds(summary, body, {}) is holds
    # The former rule (the value as text, cut at MAX_SCALAR), which results() reports beside.
    assert cond.selector is not None
    before = scalar(select(cond.selector, headers, body))
    value = condition.partition("=")[2]
    was = before is not None and before is not ABSENT and str(before) == value
    assert cond.results(summary, body, {}) == (holds, was)
    if cond.typed in ("number", "string"):
        assert not holds or was  # whatever holds now held then


NEVER = [
    ("empty", "json:/x=", "is empty"),
    ("header-empty", "header:X-Code=", "is empty"),
    ("fraction", "json:/n=1.5", "no integer"),
    ("exponent", "json:/n=1e2", "no integer"),
    ("minus-zero", "json:/n=-0", "no integer"),
    ("quoted-placeholder", 'json:/k="{idempotency_key}"', "takes no placeholder"),
    ("quoted-not-json", 'json:/k="a"b"', "one JSON string"),
]


@pytest.mark.parametrize(
    ("condition", "says"), [case[1:] for case in NEVER], ids=[case[0] for case in NEVER]
)
def test_a_value_that_could_never_match_is_refused(condition: str, says: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_condition(condition)
    assert str(info.value).startswith("VALUE ") and says in str(info.value)


@pytest.mark.parametrize(
    ("echo", "holds"), [("404", True), (404, False)], ids=["string", "integer"]
)
def test_a_placeholder_value_compares_as_a_string(echo: object, holds: bool) -> None:
    # A VALUE with a placeholder is the invocation's value, a string: typed by nothing else.
    cond = parse_condition("json:/key={idempotency_key}")
    body = json_body(json.dumps({"key": echo}).encode())
    assert cond.holds({"headers": []}, body, {"idempotency_key": "404"}) is holds
