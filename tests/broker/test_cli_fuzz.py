"""Fuzzing the action parser and the config loader through the CLI entry point (issue 9, item 4):
whatever the action text or the config file, ``affidavit call`` exits 0, 1 or 2, never prints a
traceback, and sends nothing to the server for input it refuses.

Seed: "Reject incorrectly specified targets, unsupported methods, missing fields, oversized
payloads ... before resolving the host name or accessing the secret."  In-process runs of
``affidavit.cli.main`` carry the examples (an interpreter per example would take minutes); a few
subprocess runs check the real entry point.  The scripted server runs in its own process and
counts what reaches it in a file.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import affidavit.cli

from .helpers import TOKEN_ENV, http_target, write_config
from .server_process import server_process

COUNTING_SERVER = r"""
import sys, trio
from pathlib import Path
from tests.http.hostile import HostileServer, Reply, scripts

count = Path(sys.argv[1])

def reply(req):
    n = int(count.read_text() or 0) + 1
    count.write_text(str(n))
    return Reply(200, body=b"ok")

async def main():
    async with HostileServer.running(scripts.serve(reply)) as srv:
        print(srv.url, flush=True)
        await trio.to_thread.run_sync(sys.stdin.read)

trio.run(main)
"""

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_FIELD_VALUES = st.one_of(
    _JSON,
    st.sampled_from(["api", "GET", "POST", "/x", "/a?API_KEY=1", "/../x", "\udc80", "x" * 300]),
)
_ACTIONS = st.fixed_dictionaries(
    {},
    optional={
        k: _FIELD_VALUES
        for k in (
            *("target", "method", "path", "headers", "body", "body_base64", "session"),
            *("idempotency_key", "command", "stdin", "extra"),
        )
    },
)
_ACTION_TEXT = st.one_of(
    _ACTIONS.map(lambda a: json.dumps(a).encode()),
    _JSON.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=64),
    st.integers(1, 3000).map(lambda n: b"[" * n + b"]" * n),
    st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")),
)
_TARGET_VALUES = st.one_of(
    _JSON,
    st.sampled_from(["http", "ssh", "bearer", "query:k", "header:", "env:X", "https://", -1]),
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    count = tmp_path_factory.mktemp("server") / "count"
    count.write_text("0")
    with server_process(COUNTING_SERVER, str(count)) as (url, _):
        yield url, count


def _main(args: list[str], stdin: bytes) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    saved = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin))
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = affidavit.cli.main(args)
    finally:
        sys.stdin = saved
    return code, out.getvalue(), err.getvalue()


def _refused(code: int, out: str) -> bool:
    if code == 2:
        return True
    env: dict[str, Any] = json.loads(out)
    return env.get("error", {}).get("phase") == "validation"


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=_ACTION_TEXT)
def test_any_action_text_is_an_envelope_or_a_usage_error(
    text: bytes, server: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, count = server
    monkeypatch.setenv(TOKEN_ENV, "tok-fuzz-1234")
    cfg = write_config(tmp_path, {"api": http_target(url, max_body=64)})
    before = count.read_text()
    code, out, err = _main(["call", "-", "--config", str(cfg), "--timeout", "5"], text)
    assert code in (0, 1, 2), (code, err)
    assert "Traceback" not in err
    if _refused(code, out):
        assert count.read_text() == before, "a refused action reached the server"


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    overrides=st.dictionaries(
        st.sampled_from(
            [
                *("kind", "url", "methods", "idempotent", "credential", "inject", "timeout"),
                *("max_body", "idempotency", "proxy", "ca_file", "host", "port", "junk"),
            ]
        ),
        _TARGET_VALUES,
        max_size=4,
    ),
    raw=st.none() | st.text(max_size=60),
)
def test_any_config_file_is_loaded_or_refused_with_one_line(
    overrides: dict[str, Any],
    raw: str | None,
    server: tuple[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, count = server
    monkeypatch.setenv(TOKEN_ENV, "tok-fuzz-1234")
    try:
        cfg = write_config(tmp_path, {"api": {**http_target(url), **overrides}})
    except TypeError:  # a value TOML cannot hold (the helper's own limit, not the loader's)
        return
    if raw is not None:
        cfg.write_text(raw)
    action = json.dumps({"target": "api", "method": "GET", "path": "/x"}).encode()
    before = count.read_text()
    code, _, err = _main(["call", "-", "--config", str(cfg), "--timeout", "5"], action)
    assert code in (0, 1, 2), (code, err)
    assert "Traceback" not in err
    if code == 2:
        assert err.startswith("affidavit: ") and err.count("\n") == 1, err
        assert count.read_text() == before


@pytest.mark.parametrize(
    "stdin",
    [b"[" * 5000 + b"]" * 5000, b"\xff\xfe", b'{"target": "api", "session": "\\udc80"}', b"7"],
)
def test_the_real_entry_point_agrees(
    stdin: bytes, server: tuple[str, Path], tmp_path: Path
) -> None:
    url, count = server
    cfg = write_config(tmp_path, {"api": http_target(url)})
    before = count.read_text()
    p = subprocess.run(
        [sys.executable, "-m", "affidavit", "call", "-", "--config", str(cfg)],
        input=stdin,
        capture_output=True,
        env={**os.environ, TOKEN_ENV: "tok-fuzz-1234"},
        timeout=60,
        check=False,
    )
    assert p.returncode in (1, 2) and b"Traceback" not in p.stderr, p.stderr
    assert count.read_text() == before
