"""Pure classification of complete responses, Retry-After, Proxy-Status and redaction."""

from __future__ import annotations

import email.utils

import pytest

from affidavit.adapters.http import Redactor, classify_response, parse_proxy_status
from affidavit.adapters.http import parse_retry_after as pra
from affidavit.adapters.http.classify import (
    NOT_CONDITIONAL,
    header_value,
    is_conditional,
    is_proxy_answer,
)
from affidavit.statemachine import Code, Outcome

NOW = 1_700_000_000.0


@pytest.mark.parametrize(
    ("status", "outcome", "code"),
    [
        (200, Outcome.COMMITTED, None),
        (202, Outcome.COMMITTED, None),
        # 304 answers only a conditional GET or HEAD (``test_a_304_is_clean_only_...``): to
        # any other request -- this table's -- it is no answer.
        (304, Outcome.COMMITTED, Code.REMOTE_REDIRECTED),
        # Every other 3xx, followed or never (300, 305, 306, unregistered: RFC 9110 §15, "as
        # 300"), asks for further action: no success.
        *(
            (s, Outcome.COMMITTED, Code.REMOTE_REDIRECTED)
            for s in (300, 301, 302, 303, 305, 306, 307, 308, 309, 399)
        ),
        (400, Outcome.REJECTED, Code.REMOTE_REJECTED),
        (401, Outcome.REJECTED, Code.REMOTE_REJECTED),
        (403, Outcome.REJECTED, Code.REMOTE_REJECTED),
        (429, Outcome.REJECTED, Code.REMOTE_THROTTLED),
        (503, Outcome.REJECTED, Code.REMOTE_THROTTLED),
        (500, Outcome.COMMITTED, Code.REMOTE_ERROR),
        (502, Outcome.COMMITTED, Code.REMOTE_ERROR),
        (504, Outcome.COMMITTED, Code.REMOTE_ERROR),
    ],
)
def test_origin_status_table(status: int, outcome: Outcome, code: Code | None) -> None:
    c = classify_response(status, [], via_forward_proxy=False)
    assert (c.hop, c.outcome, c.code) == ("origin", outcome, code)


@pytest.mark.parametrize(
    ("method", "headers", "conditional"),
    [
        ("GET", [("If-None-Match", '"v1"')], True),
        ("GET", [("if-modified-since", "Sun, 06 Nov 1994 08:49:37 GMT")], True),
        ("HEAD", [("IF-NONE-MATCH", "*")], True),
        ("head", [("If-None-Match", '"v1"')], True),
        ("GET", [], False),
        ("GET", [("If-None-Match", "  ")], False),  # empty: no precondition a server evaluates
        ("GET", [("If-Match", '"v1"')], False),  # fails with 412, never 304
        ("GET", [("If-Unmodified-Since", "Sun, 06 Nov 1994 08:49:37 GMT")], False),
        ("GET", [("If-Range", '"v1"')], False),  # 200 or 206
        ("GET", [("If_None_Match", '"v1"')], False),  # not the field as sent
        ("POST", [("If-None-Match", '"v1"')], False),
        ("PUT", [("If-None-Match", "*")], False),  # 412 when it exists, never 304
        ("DELETE", [("If-Modified-Since", "Sun, 06 Nov 1994 08:49:37 GMT")], False),
    ],
)
def test_a_304_is_clean_only_as_the_answer_to_a_conditional_get_or_head(
    method: str, headers: list[tuple[str, str]], conditional: bool
) -> None:
    """RFC 9110 §15.4.5: a 304 says a conditional GET or HEAD "would have resulted in a 200
    (OK) response if it were not for the fact that the condition evaluated to false".  To any
    other request it answers nothing: committed (complete, the origin's) but no success,
    REMOTE_REDIRECTED with the reason -- never a clean result."""
    assert is_conditional(method, headers) is conditional
    c = classify_response(304, [], via_forward_proxy=False, conditional=conditional)
    if conditional:
        assert (c.outcome, c.code, c.reason) == (Outcome.COMMITTED, None, None)
    else:
        assert (c.outcome, c.code, c.reason) == (
            Outcome.COMMITTED,
            Code.REMOTE_REDIRECTED,
            NOT_CONDITIONAL,
        )
    # Only a 304 reads it: another status is classified as it always was.
    for status in (200, 302, 404, 500):
        plain = classify_response(status, [], via_forward_proxy=False)
        assert classify_response(status, [], via_forward_proxy=False, conditional=True) == plain


def test_retry_after_delta_seconds_and_http_date() -> None:
    assert pra("120", now=NOW) == 120.0
    date = email.utils.formatdate(NOW + 30, usegmt=True)
    assert pra(date, now=NOW) == pytest.approx(30.0)
    past = email.utils.formatdate(NOW - 30, usegmt=True)
    assert pra(past, now=NOW) == 0.0
    assert pra("soon", now=NOW) is None
    assert pra("-5", now=NOW) is None
    assert pra(None) is None


@pytest.mark.parametrize(
    "value",
    [
        "\xb2",
        "\xb9\xb2",
        "\u0664\u0662",
        "9" * 16,
        "9" * 400,
        "1" * 5000,
        "Sun, 06 Nov 99999999999999 08:49:37 GMT",
    ],
)
def test_retry_after_not_ascii_delta_seconds_nor_a_date_is_none(value: str) -> None:
    """delta-seconds is ASCII digits, up to 15 (``str.isdigit``/``int`` took or refused
    others, ``float`` overflowed): never an exception out of a complete response."""
    assert pra(value, now=NOW) is None


def test_retry_after_fifteen_digits_is_read() -> None:
    assert pra("9" * 15, now=NOW) == float("9" * 15)


def test_throttle_carries_retry_after() -> None:
    c = classify_response(429, [("Retry-After", "7")], via_forward_proxy=False)
    assert c.retry_after == 7.0


def test_proxy_status_parses_rfc9209_members() -> None:
    ps = parse_proxy_status(
        'edge; error=connection_refused; details="no route", '
        'origin-side; received-status=502; next-hop="10.0.0.1"'
    )
    assert ps == [
        {"proxy": "edge", "error": "connection_refused", "details": "no route"},
        {"proxy": "origin-side", "received_status": 502, "next_hop": "10.0.0.1"},
    ]
    assert parse_proxy_status(None) is None
    assert parse_proxy_status("edge; error=") == [{"malformed": True}]
    assert parse_proxy_status('"quoted-proxy"; rcode=?1') == [
        {"proxy": "quoted-proxy", "rcode": True}
    ]


@pytest.mark.parametrize(
    ("status", "headers", "via_forward_proxy", "hop"),
    [
        (502, [], True, "proxy"),
        (504, [], True, "proxy"),
        (502, [], False, "origin"),
        (502, [("Proxy-Status", "p; received-status=502")], True, "origin"),
        (502, [("Proxy-Status", "p; received-status=500")], True, "proxy"),
        (503, [("Proxy-Status", "p; error=destination_unavailable")], True, "proxy"),
        (503, [("Proxy-Status", "p; error=destination_unavailable")], False, "proxy"),
        (200, [("Proxy-Status", "p; received-status=200")], True, "origin"),
        (500, [("Proxy-Status", "p; error=")], True, "proxy"),
        # Through a forward proxy any 5xx and a 407 are the proxy's own unless received-status
        # attributes them to the origin (tinyproxy's "500 Unable to connect"; docs/proxies.md).
        (500, [], True, "proxy"),
        (503, [], True, "proxy"),
        (599, [], True, "proxy"),
        (407, [], True, "proxy"),
        (500, [("Proxy-Status", "p; received-status=500")], True, "origin"),
        (503, [("Proxy-Status", "p; received-status=503")], True, "origin"),
        (500, [], False, "origin"),
        (407, [], False, "origin"),
        # So is any 4xx: Squid's 403 denial, Privoxy's 404 for an unknown domain, an egress
        # proxy's 429 -- the broker cannot tell them from the origin's (docs/proxies.md).
        (400, [], True, "proxy"),
        (403, [], True, "proxy"),
        (404, [], True, "proxy"),
        (409, [], True, "proxy"),
        (429, [("Retry-After", "1")], True, "proxy"),
        (404, [("Via", "1.1 squid")], True, "proxy"),
        (404, [("Proxy-Status", "p; received-status=404")], True, "origin"),
        (404, [], False, "origin"),
        (429, [], False, "origin"),
        # A 2xx or 3xx through a forward proxy is relayed as the origin's.
        (200, [], True, "origin"),
        (302, [], True, "origin"),
    ],
)
def test_proxy_generated_errors_are_attributed_to_the_proxy(
    status: int, headers: list[tuple[str, str]], via_forward_proxy: bool, hop: str
) -> None:
    c = classify_response(status, headers, via_forward_proxy=via_forward_proxy)
    assert c.hop == hop
    if hop == "proxy":
        assert c.outcome is None and c.code is None
    # The question a response head is asked before its body gets the same answer.
    assert is_proxy_answer(status, headers, via_forward_proxy=via_forward_proxy) == (hop == "proxy")
    # And so does a caller that parsed the Proxy-Status itself (the driver's result).
    parsed = parse_proxy_status(header_value(headers, "proxy-status"))
    assert (
        classify_response(status, headers, via_forward_proxy=via_forward_proxy, proxy_status=parsed)
        == c
    )


def test_header_value_joins_every_field_of_the_name() -> None:
    headers = [("Via", "a"), ("x-other", "b"), ("via", "c, d"), ("VIA", "")]
    assert header_value(headers, "via") == "a, c, d, "  # RFC 9110 5.3, in order, any case
    assert header_value(headers, "x-other") == "b"
    assert header_value(headers, "proxy-status") is None
    assert header_value([], "via") is None


def test_redactor_scrubs_whole_values_and_bearer_tokens() -> None:
    r = Redactor(["Bearer canary-123456", "abc"])
    assert r.contains("x canary-123456 y")
    assert not r.contains("abc")  # too short to be a meaningful secret match
    assert r.scrub({"a": ["ok", "has canary-123456"], "b": 3}) == {
        "a": ["ok", "[redacted]"],
        "b": 3,
    }
