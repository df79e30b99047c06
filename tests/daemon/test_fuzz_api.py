"""A hostile caller on the daemon's socket, fuzzed: whatever bytes it sends, every answer is a
well-formed HTTP answer -- an envelope, a view, or ``{"api_error": {"code", "message"}}`` with a
stable code -- never a 500, a traceback in the log, a hung connection or a dead daemon; an answer
refusing the request writes nothing to the journal; and the canary credential is in no answer
and no log line (the remote echoes the ``Authorization`` it got, so a call's result holds it
until redaction takes it out).

One real ``affidavit serve`` for the module (its own process and environment: the credential is
there only), raw bytes over its Unix socket from this process, parsed back with h11.  Every wait
is bounded (``WAIT``); the properties are bounded by ``max_examples``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import h11
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.broker.helpers import TOKEN_ENV
from tests.broker.server_process import server_process

from .kit import PYTHON, WAIT, api_target, daemon_env, write_daemon_config

CANARY = "canary-fuzz-" + "Q7x" * 8

ECHO_SERVER = r"""
import sys, trio
from tests.http.hostile import HostileServer, Reply, scripts

def reply(req):
    seen = req.header("authorization") or ""
    return Reply(200, headers=[("Content-Type", "text/plain")], body=f"saw {seen}".encode())

async def main():
    async with HostileServer.running(scripts.serve(reply)) as srv:
        print(srv.url, flush=True)
        await trio.to_thread.run_sync(sys.stdin.read)

trio.run(main)
"""

CODE = re.compile(r"[A-Z][A-Z0-9_]*")
IDEMPOTENCY = {"header": "Idempotency-Key", "scope": "fuzz", "retention": "24h"}
"""The target ``api`` honours a key: a caller's idempotency_key becomes a header."""
READ_WAIT = 15.0
"""Seconds an answer may take (a call to the local echo remote takes milliseconds)."""


@dataclass
class Daemon:
    socket: Path
    journal: Path
    log: Path
    proc: subprocess.Popen[bytes]
    journal_url: str | None = None
    """A PostgreSQL journal's URL (its password a canary too), else the SQLite ``journal``."""
    secrets: tuple[str, ...] = (CANARY,)
    _pg: Any = None
    """One autocommit connection for ``events`` (a connection per count costs more than the
    request it checks)."""

    def alive(self) -> None:
        assert self.proc.poll() is None, self.log.read_text(errors="replace")[-3000:]

    def log_is_clean(self) -> None:
        text = self.log.read_text(encoding="utf-8", errors="replace")
        assert "Traceback" not in text, text[-3000:]
        assert not any(secret in text for secret in self.secrets)
        assert "failed inside the daemon" not in text, text[-3000:]

    def events(self) -> int:
        """How many events the journal holds (read beside the daemon: WAL) -- but a delivery's:
        that one is recorded *after* its answer was written, so an earlier call's may land
        while a later request is being checked."""
        query = (
            "SELECT count(*) FROM events"
            " WHERE kind NOT IN ('RESULT_DELIVERED', 'RESULT_DELIVERY_FAILED')"
        )
        if self.journal_url is not None:
            import psycopg

            if self._pg is None:
                self._pg = psycopg.connect(self.journal_url, autocommit=True)
            row = self._pg.execute(query).fetchone()
            assert row is not None
            return int(row[0])
        if not self.journal.exists():
            return 0
        with sqlite3.connect(f"file:{self.journal}?mode=ro", uri=True, timeout=WAIT) as db:
            (n,) = db.execute(query).fetchone()
        return int(n)

    def holds_no_secret(self, data: bytes) -> None:
        for secret in self.secrets:
            assert secret.encode() not in data


def _ssh_target() -> dict[str, Any]:
    """An SSH target nobody listens for (connections are refused): its actions are checked, and
    the canary is its password."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    pin = (
        Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH)
    )
    return {
        "kind": "ssh",
        "host": "127.0.0.1",
        "port": 9,
        "user": "fuzz",
        "host_key": pin.decode(),
        "auth": "password",
        "credential": f"env:{TOKEN_ENV}",
        "idempotent_commands": ["uptime"],
        "timeout": {"connect": 2, "total": 5},
    }


@contextlib.contextmanager
def fuzz_daemon(
    tmp: Path, *, journal_url: str | None = None, password: str = "", **service: Any
) -> Iterator[Daemon]:
    """``affidavit serve`` with the canary credential, its target ``api`` the echo remote, this
    uid an operator (more ``[service]`` settings: ``service``); its journal a SQLite file, or
    the PostgreSQL database at ``journal_url`` (whose ``password`` is a canary too); its log
    checked clean once it stopped."""
    journal = None
    if journal_url is not None:
        keys = {"key_file": str(tmp / "shared.key"), "signing_key": str(tmp / "signing.key")}
        journal = {"url": journal_url, **keys}
    with server_process(ECHO_SERVER) as (url, _):
        sock = tmp / "s.sock"
        config = write_daemon_config(
            tmp,
            {**api_target(url, idempotency=IDEMPOTENCY), "ssh": _ssh_target()},
            socket=sock,
            service={"operator_uids": [os.geteuid()], **service},
            journal=journal,
        )
        log = tmp / "daemon.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [PYTHON, "-m", "affidavit", "serve", "--config", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env=daemon_env(CANARY),
            )
        secrets = (CANARY, password) if password else (CANARY,)
        d = Daemon(sock, tmp / "journal.db", log, proc, journal_url, secrets)
        try:
            deadline = time.monotonic() + WAIT
            while not _answers(sock):
                d.alive()
                assert time.monotonic() < deadline, "the daemon did not answer in time"
                time.sleep(0.05)
            yield d
        finally:
            if d._pg is not None:
                d._pg.close()
            proc.terminate()
            try:
                proc.wait(timeout=WAIT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=WAIT)
    d.log_is_clean()


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


def _answers(sock: Path) -> bool:
    try:
        exchange(sock, b"GET /v1/health HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n")
    except OSError:
        return False
    return True


@dataclass
class Answer:
    status: int
    headers: dict[bytes, bytes]
    body: bytes


def exchange(
    sock: Path, data: bytes, *, half_close: bool = False, head: bool = False
) -> list[Answer]:
    """Send ``data``, read until the daemon closes (bounded by ``READ_WAIT``): every answer.
    A connection still open after that is a hung one -- a failure."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(READ_WAIT)
    raw = bytearray()
    try:
        s.connect(str(sock))
        try:
            s.sendall(data)
            if half_close:
                s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # answered and closed before all of it was read: allowed
        deadline = time.monotonic() + READ_WAIT
        while True:
            try:
                chunk = s.recv(1 << 16)
            except ConnectionResetError:
                break
            except TimeoutError:
                raise AssertionError(f"hung: no close within {READ_WAIT} s") from None
            if not chunk:
                break
            raw += chunk
            assert time.monotonic() < deadline, "hung: the answer never ended"
    finally:
        s.close()
    return parse_answers(bytes(raw), head=head)


def parse_answers(raw: bytes, *, head: bool = False) -> list[Answer]:
    """The answers in ``raw``; ``head``: the first answers a HEAD (no body follows)."""
    conn = h11.Connection(h11.CLIENT)
    answers: list[Answer] = []
    conn.receive_data(raw)
    conn.receive_data(b"")
    while True:
        # The client's side of h11 wants a request sent for each answer it parses.
        if answers and not conn.trailing_data[0]:
            return answers  # nothing more came
        if conn.our_state is h11.IDLE:
            method = "HEAD" if head and not answers else "GET"
            conn.send(h11.Request(method=method, target="/", headers=[("host", "a")]))
            conn.send(h11.EndOfMessage())
        head = conn.next_event()
        if head is h11.PAUSED or isinstance(head, h11.ConnectionClosed):
            return answers
        assert isinstance(head, h11.Response), (head, raw[:300])
        body = bytearray()
        while True:
            event = conn.next_event()
            if isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
            else:
                raise AssertionError(f"a cut answer: {event!r} {raw[:300]!r}")
        answers.append(Answer(head.status_code, dict(head.headers), bytes(body)))
        if conn.their_state is not h11.DONE:
            return answers
        try:
            conn.start_next_cycle()
        except h11.LocalProtocolError:
            return answers


def check(answer: Answer, route: str = "", *, head: bool = False) -> Any:
    """The invariants of one answer; its JSON when it is JSON (``head``: a HEAD's, no body)."""
    assert answer.status != 500 and answer.status < 600, (answer.status, answer.body[:400])
    assert CANARY.encode() not in answer.body
    assert all(CANARY.encode() not in v for v in answer.headers.values())
    kind = answer.headers.get(b"content-type", b"")
    if head:
        assert not answer.body
        return None
    if kind.startswith(b"text/plain") and answer.status == 200:
        return None  # the Prometheus metrics
    assert kind == b"application/json", (answer.status, kind, answer.body[:200])
    value = json.loads(answer.body)  # strict: the daemon never writes NaN
    if answer.status >= 400:
        assert set(value) == {"api_error"}, value
        error = value["api_error"]
        assert set(error) == {"code", "message"}, value
        assert CODE.fullmatch(error["code"]), value
        assert isinstance(error["message"], str) and error["message"], value
        assert "Traceback" not in error["message"]
    elif route == "/v1/calls" and answer.status == 200:
        assert isinstance(value.get("invocation_id"), str), value
        if "error" in value:
            err = value["error"]
            assert CODE.fullmatch(err["code"]) and isinstance(err["phase"], str), value
            if err["phase"] == "validation":
                assert isinstance(err.get("field"), str) and err["field"], value
    return value


# -- what a hostile caller sends -----------------------------------------------------------------

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
