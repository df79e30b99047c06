"""A reconcile condition's ``json:`` VALUE compares typed where it is a JSON literal
(``affidavit/protocols/http/reconcile.py``, ``Condition.typed``): a number literal only a JSON
integer of that text, ``true``/``false``/``null`` nothing (a boolean or null is not read), any
other VALUE only a non-empty string equal to it, whole.  The rule only ever turns a match of the
former text comparison into none -- never makes one."""

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
    ("true-vs-boolean", "json:/ok=true", {"ok": True}, [], False),
    ("null-vs-string-null", "json:/ok=null", {"ok": "null"}, [], False),
    ("number-vs-integer", "json:/code=404", {"code": 404}, [], True),
    ("number-vs-string", "json:/code=404", {"code": "404"}, [], False),
    ("number-vs-float", "json:/code=404", {"code": 404.0}, [], False),
    ("one-vs-boolean", "json:/n=1", {"n": True}, [], False),
    ("negative-number", "json:/n=-3", {"n": -3}, [], True),
    ("exponent-vs-string", "json:/n=1e2", {"n": "1e2"}, [], False),
    ("string-vs-string", "json:/status=succeeded", {"status": "succeeded"}, [], True),
    ("text-vs-integer", "json:/code=0404", {"code": 404}, [], False),
    ("empty-vs-empty", "json:/x=", {"x": ""}, [], False),
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
def test_a_json_literal_value_compares_typed_and_never_makes_a_new_match(
    condition: str, doc: Any, headers: list[tuple[str, str]], holds: bool
) -> None:
    cond = parse_condition(condition)
    body = json_body(None if doc is None else json.dumps(doc).encode())
    summary = {"status": 200, "headers": headers}
    assert cond.holds(summary, body, {}) is holds
    # The former rule (the value as text, cut at MAX_SCALAR): whatever holds now held then.
    assert cond.selector is not None
    before = scalar(select(cond.selector, headers, body))
    value = condition.partition("=")[2]
    assert not holds or (before is not None and before is not ABSENT and str(before) == value)


@pytest.mark.parametrize(
    ("echo", "holds"), [("404", True), (404, False)], ids=["string", "integer"]
)
def test_a_placeholder_value_compares_as_a_string(echo: object, holds: bool) -> None:
    # A VALUE with a placeholder is the invocation's value, a string: typed by nothing else.
    cond = parse_condition("json:/key={idempotency_key}")
    body = json_body(json.dumps({"key": echo}).encode())
    assert cond.holds({"headers": []}, body, {"idempotency_key": "404"}) is holds
