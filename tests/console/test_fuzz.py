"""The console's port is open to every local user -- an agent too.  Fuzzed without a session
(the agent has none): whatever it sends -- any method, path, query, ``Host``, ``Origin``,
``Cookie`` (junk, repeated, forged), form or garbage -- the answer is the login page, a redirect
to it, a static file or a 4xx page, never a 500, a traceback in the log or a hung connection;
nothing reaches the journal; the canary credential is in no answer.

One real daemon serving its console on loopback for the module (``fuzz_daemon``); raw bytes
over TCP, parsed with h11.  Bounded by ``max_examples`` and ``READ_WAIT``.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.daemon.fuzzkit import CANARY, READ_WAIT, Daemon, fuzz_daemon, parse_answers
from tests.external import on_free_port


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, int]]:
    tmp = tmp_path_factory.mktemp("consolefuzz")
    with contextlib.ExitStack() as stack:
        d, port = on_free_port(
            lambda port: stack.enter_context(fuzz_daemon(tmp, console=f"127.0.0.1:{port}"))
        )
        yield d, port


def exchange(port: int, data: bytes) -> bytes:
    deadline = time.monotonic() + READ_WAIT
    raw = bytearray()
    with socket.create_connection(("127.0.0.1", port), timeout=READ_WAIT) as s:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(data)
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
    return bytes(raw)


_SEGMENT = st.one_of(
    st.binary(min_size=1, max_size=20).map(lambda b: quote(b, safe="")),
    st.sampled_from(
        ["..", "%2e%2e", "%2F", "%00", "console.css", "console.js", "x" * 2000, "act_" + "0" * 26]
    ),
)
_PATH = st.one_of(
    st.sampled_from(
        [
            "/",
            "/login",
            "/logout",
            "/approvals",
            "/actions",
            "/journal",
            "/static/console.css",
            "/static/",
            "/invocations/",
            "//login",
            "/login/",
            "*",
        ]
    ),
    st.builds(
        lambda t, s: t.format(s),
        st.sampled_from(
            [
                "/static/{}",
                "/invocations/{}",
                "/invocations/{}/result.json",
                "/invocations/{}/reconcile",
                "/approvals/{}/approve",
                "/approvals/{}/deny",
                "/approvals/{}/content/body",
                "/approvals/x/content/{}",
                "/{}",
            ]
        ),
        _SEGMENT,
    ),
)
_QUERY = st.dictionaries(
    st.sampled_from(["token", "auto", "since", "until", "outcome", "phase", "code", "session"]),
    st.text(max_size=20) | st.sampled_from(["1", "1e999", "nan", "9" * 400, "\x00", "é"]),
    max_size=3,
).map(
    lambda q: "&".join(
        f"{k}={quote(v.encode('utf-8', 'surrogatepass'), safe='')}" for k, v in q.items()
    )
)
_COOKIE = st.sampled_from(
    [None, "affidavit_console=x", "affidavit_console=x; affidavit_console=y", "affidavit_console",
     "=;;=;", "affidavit_console=" + "A" * 5000, "a=b\x7f"]
)  # fmt: skip


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS"]),
    path=_PATH,
    query=_QUERY,
    host_ok=st.booleans(),
    origin=st.sampled_from([None, "null", "http://evil", "SELF"]),
    cookie=_COOKIE,
    body=st.binary(max_size=60)
    | st.sampled_from([b"token=" + b"a" * 40, b"csrf=x&reason=y", b"%ff=%fe", b"a" * 70_000]),
)
def test_anything_an_agent_sends_the_console_is_a_page_or_a_refusal(
    console: tuple[Daemon, int],
    method: str,
    path: str,
    query: str,
    host_ok: bool,
    origin: str | None,
    cookie: str | None,
    body: bytes,
) -> None:
    daemon, port = console
    me = f"127.0.0.1:{port}"
    target = path + (f"?{query}" if query else "")
    head = f"{method} {target} HTTP/1.1\r\nhost: {me if host_ok else 'evil.example'}\r\n"
    head += "connection: close\r\ncontent-type: application/x-www-form-urlencoded\r\n"
    if origin is not None:
        head += f"origin: {'http://' + me if origin == 'SELF' else origin}\r\n"
    if cookie is not None:
        head += f"cookie: {cookie}\r\n"
    head += f"content-length: {len(body)}\r\n\r\n"
    before = daemon.events()
    raw = exchange(port, head.encode("latin-1") + body)
    answers = parse_answers(raw, head=method == "HEAD")
    assert len(answers) == 1, raw[:300]
    [answer] = answers
    assert answer.status in (200, 303) or 400 <= answer.status < 500, (answer.status, raw[:400])
    if answer.status == 200:
        assert path in ("/login", "/static/console.css", "/static/console.js"), path
    assert CANARY.encode() not in raw
    assert daemon.events() == before
    daemon.alive()
    daemon.log_is_clean()
