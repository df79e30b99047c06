"""A hostile caller on the daemon's socket, fuzzed: whatever bytes it sends, every answer is a
well-formed HTTP answer -- an envelope, a view, or ``{"api_error": {"code", "message"}}`` with a
stable code -- never a 500, a traceback in the log, a hung connection or a dead daemon; an answer
refusing the request writes nothing to the journal; and the canary credential is in no answer
and no log line (the remote echoes the ``Authorization`` it got, so a call's result holds it
until redaction takes it out).

One real ``affidavit serve`` per journal backend (``fuzzkit.fuzz_daemon``: its own process and
environment, the credential there only), raw bytes over its Unix socket from this process,
parsed back with h11.  Every wait is bounded; the properties by ``max_examples``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .fuzzkit import Daemon, check, exchange, fuzz_daemon


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def daemon(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Daemon]:
    """The daemon on each journal backend (PostgreSQL: a fresh database of the session's
    server; its text holds no NUL, which once made a caller's ``%00`` an unreadable journal)."""
    tmp = tmp_path_factory.mktemp("fuzz")
    if request.param == "sqlite":
        with fuzz_daemon(tmp) as d:
            yield d
        return
    cluster = request.getfixturevalue("pg")
    with fuzz_daemon(tmp, journal_url=cluster.database(), password=cluster.password) as d:
        yield d


_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()  # NaN and Infinity come out as json.dumps' literals
    | st.text(max_size=12)
    | st.sampled_from(["\ud800", "\x00", "a\r\nX-Evil: 1", "../../etc/passwd", "%2e%2e/", "é" * 40])
)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)
_FIELD = _JSON | st.sampled_from(
    [
        "api",
        "ssh",
        "uptime",
        "uptime; cat /etc/shadow",
        "$(id)",
        "GET",
        "POST",
        "PUT",
        "/",
        "/x",
        "//evil/x",
        "/a/../b",
        "/%2e%2e/x",
        "/x?API_KEY=1",
        "http://evil/",
        "x" * 5000,
        "Idempotency-Key",
        "k" * 300,
        "k\u00e9",
        "k ey",
        "k\x7f",
        "\t",
        "0",
        {"X-A": "a\r\nb"},
        {"Host": "evil"},
        {"Authorization": "Bearer x"},
        {"X\r\nY": "1"},
        "aGVsbG8=",
        "!!!",
    ]
)
_KEYS = (
    *("target", "method", "path", "headers", "body", "body_base64", "session"),
    *("idempotency_key", "command", "stdin", "extra", "timeout"),
)
_ACTION = st.fixed_dictionaries({}, optional=dict.fromkeys(_KEYS, _FIELD))

_HTTP = {"target": "api", "method": "POST", "path": "/ok", "idempotency_key": "k1"}
_SSH = {"target": "ssh", "command": "uptime"}
_ONE_WRONG = st.builds(
    lambda base, key, value: {**base, key: value},
    st.sampled_from([_HTTP, _SSH]),
    st.sampled_from(_KEYS),
    _FIELD,
)
"""A valid action with one field made hostile: each field's own check is reached."""


def _dumps(value: Any) -> bytes:
    return json.dumps(value, allow_nan=True).encode("utf-8", "surrogatepass")


_BODY = st.one_of(
    _ACTION.map(_dumps),
    _ONE_WRONG.map(_dumps),
    _ONE_WRONG.map(_dumps),
    _JSON.map(_dumps),
    st.binary(max_size=80),
    st.integers(1, 200_000).map(lambda n: b"[" * n + b"]" * n),
    st.integers(1, 5000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
    st.integers(1, 20_000).map(lambda n: b'{"target":"api","n":' + b"9" * n + b"}"),
    st.sampled_from(
        [
            b'{"target":"api","target":"api","method":"GET","path":"/"}',
            b'{"target":"api","method":"GET","path":"/","headers":{"A":"1","A":"2"}}',
            b'{"target":NaN}',
            b'{"target":Infinity}',
            b'{"target":-Infinity}',
            b"1e999999",
            b'{"target":"\\ud800"}',
            b'{"target":"\xff\xfe"}',
            b'{"target":"api\x00"}',
            b'\xef\xbb\xbf{"target":"api"}',
            b'{"target":"api"',
            b"",
            b"   ",
            b"null",
            b"[]",
            b'{"query":true}',
            b'{"attest":"delivered","note":"\\u0000"}',
            b'{"reason":' * 3,
        ]
    ),
)
_SEGMENT = st.one_of(
    st.binary(min_size=1, max_size=30).map(lambda b: quote(b, safe="")),
    st.sampled_from(
        [
            "..",
            "%2e%2e",
            "x%2Fresult",
            "x%2Freconcile",
            "%00",
            "%FF",
            "a%2F..%2Fb",
            "act_" + "0" * 26,
            "x" * 3000,
            "%",
            "%zz",
            ";",
            "~",
        ]
    ),
)
_ROUTES = [
    "/v1/calls",
    "/v1/catalog",
    "/v1/actions",
    "/v1/sessions",
    "/v1/metrics",
    "/v1/health",
    "/v1/approvals",
    "/v1/console/login",
    "/",
    "/v1",
    "/v1/",
    "//v1/calls",
    "/v1/calls/",
]
_TEMPLATES = [
    "/v1/invocations/{}",
    "/v1/invocations/{}/result",
    "/v1/invocations/{}/reconcile",
    "/v1/operations/{}/poll",
    "/v1/approvals/{}",
    "/v1/approvals/{}/approve",
    "/v1/approvals/{}/deny",
    "/v1/approvals/{}/content/body",
    "/v1/approvals/x/content/{}",
    "/{}",
    "/v1/{}",
]
_PATH = st.one_of(
    st.sampled_from(_ROUTES),
    st.builds(lambda t, s: t.format(s), st.sampled_from(_TEMPLATES), _SEGMENT),
)
_PARAMS = st.sampled_from(
    ["limit", "since", "until", "session", "outcome", "phase", "from_chunk", "timeout", "format"]
)
_VALUE = st.one_of(
    st.text(max_size=20),
    st.sampled_from(
        [
            "-1",
            "0",
            "1e999",
            "nan",
            "inf",
            "9" * 400,
            "1.5",
            "json",
            "\x00",
            "unknown",
            "2026-13-45T99:99:99Z",
            "-1e308",
            "1" + "0" * 30,
        ]
    ),
)
_QUERY = st.dictionaries(_PARAMS, _VALUE, max_size=4).map(
    lambda q: "&".join(
        f"{k}={quote(v.encode('utf-8', 'surrogatepass'), safe='')}" for k, v in q.items()
    )
)
_CONTENT_TYPE = st.sampled_from(
    [
        None,
        "application/json",
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/json; charset=latin-1",
        "",
        "\x7f",
    ]
)
_METHOD = st.sampled_from(
    ["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "TRACE", "G3T"]
)


def _request(
    method: str, path: str, query: str, body: bytes, ctype: str | None, extra: str
) -> bytes:
    target = path + (f"?{query}" if query else "")
    head = f"{method} {target} HTTP/1.1\r\nhost: affidavit\r\nconnection: close\r\n"
    if ctype is not None:
        head += f"content-type: {ctype}\r\n"
    head += extra
    if "transfer-encoding" not in extra:
        head += f"content-length: {len(body)}\r\n"
    return head.encode("latin-1") + b"\r\n" + body


_EXTRA = st.sampled_from(
    [
        "",
        "expect: 100-continue\r\n",
        "x-forwarded-for: 1.2.3.4\r\n",
        "cookie: a=b; a=c\r\n",
        "authorization: Bearer stolen\r\n",
        "transfer-encoding: chunked\r\n",
    ]
)

SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


@SETTINGS
@given(method=_METHOD, path=_PATH, query=_QUERY, body=_BODY, ctype=_CONTENT_TYPE, extra=_EXTRA)
def test_any_request_is_answered_with_an_envelope_or_a_stable_api_error(
    daemon: Daemon, method: str, path: str, query: str, body: bytes, ctype: str | None, extra: str
) -> None:
    if "chunked" in extra:
        body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if body else b"0\r\n\r\n"
    before = daemon.events()
    data = _request(method, path, query, body, ctype, extra)
    answers = exchange(daemon.socket, data, head=method == "HEAD")
    assert len(answers) == 1, answers
    [answer] = answers
    check(answer, path, head=method == "HEAD")
    daemon.holds_no_secret(answer.body)
    if answer.status >= 400 or path != "/v1/calls":
        # Refused, or no call at all: nothing journaled (a poll or a reconcile of no such
        # record is refused too).
        assert daemon.events() == before, (method, path, answer.status, answer.body[:300])
    daemon.alive()
    daemon.log_is_clean()


@SETTINGS
@given(body=_BODY, query=_QUERY, ctype=_CONTENT_TYPE, extra=_EXTRA)
def test_any_action_posted_is_an_envelope_or_a_refusal_never_the_credential(
    daemon: Daemon, body: bytes, query: str, ctype: str | None, extra: str
) -> None:
    """The calls route alone (the property above reaches it rarely): whatever the action, an
    envelope -- a validation refusal naming its field, a call's outcome, the remote's echo of
    the credential redacted -- or a refusal of the request that journals nothing."""
    if "chunked" in extra:
        body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if body else b"0\r\n\r\n"
    before = daemon.events()
    answers = exchange(daemon.socket, _request("POST", "/v1/calls", query, body, ctype, extra))
    assert len(answers) == 1, answers
    [answer] = answers
    value = check(answer, "/v1/calls")
    if answer.status >= 400:
        assert daemon.events() == before, (answer.status, answer.body[:300])
    elif "result" in value:
        assert b"saw [REDACTED]" in answer.body, answer.body[:600]  # the echo, redacted
    daemon.alive()
    daemon.log_is_clean()


@SETTINGS
@given(
    head=st.sampled_from([b"GET /v1/health HTTP/1.1\r\nhost: a\r\n\r\n"]),
    garbage=st.one_of(
        st.binary(max_size=200),
        st.sampled_from(
            [
                b"GET /v1/health HTTP/1.1\r\n\r\n",  # no Host: 400
                b"GET /v1/health HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n",
                b"GET /\x00 HTTP/1.1\r\nhost: a\r\n\r\n",
                b"GET / HTTP/1.1\r\nhost: a\r\nx: a\rb\r\n\r\n",
                b"GET / HTTP/1.1\r\nhost: a\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nabcde",
                b"GET / HTTP/1.1\r\nhost: a\r\ncontent-length: -1\r\n\r\n",
                b"GET / HTTP/1.1\r\nhost: a\r\ncontent-length: 99999999999999999999999\r\n\r\n",
                b"GET / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
                b"GET / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
                b'POST /v1/calls HTTP/1.1\r\nhost: a\r\ncontent-length: 50\r\n\r\n{"target"',
                b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
                b"GET / HTTP/9.9\r\nhost: a\r\n\r\n",
                b"GET " + b"/a" * 9000 + b" HTTP/1.1\r\nhost: a\r\n\r\n",
                b"GET / HTTP/1.1\r\nhost: a\r\n" + b"x: y\r\n" * 3000 + b"\r\n",
                b"\r\n\r\n\r\n",
            ]
        ),
    ),
)
def test_garbage_pipelined_behind_a_request_is_answered_or_closed_never_a_fault(
    daemon: Daemon, head: bytes, garbage: bytes
) -> None:
    before = daemon.events()
    answers = exchange(daemon.socket, head + garbage, half_close=True)
    assert answers, "the first request was not answered"
    assert answers[0].status == 200
    for answer in answers:
        check(answer)
    assert daemon.events() == before
    daemon.alive()
    daemon.log_is_clean()
