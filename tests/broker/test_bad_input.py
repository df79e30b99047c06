"""Every bad input is an envelope or a usage error, never a traceback (issue 9, item 4).

Seed, "Validation and credential injection finish before dispatch": "Return a stable code ...
along with the path to the field that the caller can fix."  Action JSON is checked before it is
parsed (size, encoding, nesting); caller strings are checked before anything is journaled, and
a refused value is journaled bounded -- never whole.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.protocols.actions import MAX_DEPTH, MAX_NODES, ActionInvalid, load_action_json
from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import TOKEN_ENV, assert_error, http_target, open_broker, write_config

LIMIT = 30
GET = {"target": "api", "method": "GET", "path": "/x"}


def _cli(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "affidavit", *args],
        input=stdin,
        capture_output=True,
        env={**os.environ, TOKEN_ENV: "tok-bad-input-1234"},
        timeout=LIMIT,
        check=False,
    )


def _refused(broker: Any, env: dict[str, Any], code: str) -> Any:
    """A validation refusal: nothing attempted, fix the field and send again."""
    return assert_error(
        broker,
        env,
        phase="validation",
        outcome="not_attempted",
        retry="after_correction",
        code=code,
    )


def _journal_size(tmp: Path) -> int:
    return sum(p.stat().st_size for p in tmp.glob("journal.db*") if p.is_file())


# --- action JSON, before parsing ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "code", "message"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "PAYLOAD_LIMIT", f"nests deeper than {MAX_DEPTH}"),
        (b'{"a":' * 50_000 + b"1" + b"}" * 50_000, "PAYLOAD_LIMIT", "nests deeper"),
        (b'{"target": "api", "path": "\xff\xfe"}', "INVALID_FIELD", "is not UTF-8 text"),
        (b'{"target": "api"', "INVALID_FIELD", "is not valid JSON (line 1"),
        # JSON all the same (another reader takes it as a double): no "is not valid JSON".
        (b'{"n": ' + b"9" * 5000 + b"}", "INVALID_FIELD", "holds an integer of more than 4300"),
        (b" " * (1 << 21), "PAYLOAD_LIMIT", f"is larger than {1 << 20} bytes"),
    ],
    ids=["100k-deep-list", "50k-deep-object", "not-utf8", "cut-short", "long-number", "2MiB"],
)
def test_action_text_is_checked_before_it_is_parsed(data: bytes, code: str, message: str) -> None:
    with pytest.raises(ActionInvalid) as info:
        load_action_json(data, 1 << 20)
    assert (info.value.code.value, info.value.field) == (code, "action")
    assert message in info.value.message


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        (b'{"target":"nope","target":"api"}', "action.target", "is given twice"),
        (b'{"target":"api","headers":{"X":"a","X":"b"}}', "action.headers.X", "is given twice"),
        (b'{"a":[1,{"b":[{"c":1,"c":1}]}]}', "action.a[1].b[0].c", "is given twice"),
        (b'[{"k":1,"k":2}]', "action[0].k", "is given twice"),
        # A name that is not short visible ASCII is not echoed: the path ends at its object.
        (b'{"h":{"\\u00e9":1,"\\u00e9":2}}', "action.h", "is given twice"),
        (b'{"target":"api","n":NaN}', "action", "holds NaN, which is not a JSON number"),
        (b'{"n":[Infinity]}', "action", "holds Infinity"),
        (b'{"n":-Infinity}', "action", "holds -Infinity"),
    ],
    ids=[
        "target",
        "header",
        "deep",
        "in-list",
        "unprintable-name",
        "nan",
        "inf",
        "minus-inf",
    ],
)
def test_a_field_named_twice_or_a_non_json_number_is_refused_at_its_path(
    data: bytes, field: str, message: str
) -> None:
    """Python's parser keeps the last of two same-named fields (a proxy reading the first would
    see another action than the broker runs) and reads NaN/Infinity, which are not JSON."""
    with pytest.raises(ActionInvalid) as info:
        load_action_json(data, 1 << 20)
    assert (info.value.code.value, info.value.field) == ("INVALID_FIELD", field)
    assert message in info.value.message


def test_the_cli_refuses_an_action_naming_its_target_twice(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, {"api": http_target("http://127.0.0.1:9")})
    stdin = b'{"target":"nope","target":"api","method":"GET","path":"/x"}'
    p = _cli("call", "--config", str(cfg), stdin=stdin)
    assert (p.returncode, p.stdout) == (2, b""), p.stderr
    assert p.stderr == (
        b"affidavit: action refused: INVALID_FIELD at action.target: "
        b"is given twice in one object (each field once)\n"
    )


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    text = json.dumps({"target": "api", "body": "[" * 10_000 + "{" * 10_000 + '\\"]'})
    assert load_action_json(text.encode(), 1 << 20)["body"].startswith("[[[")


@pytest.mark.parametrize(
    ("stdin", "expect"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "PAYLOAD_LIMIT at action: nests deeper than"),
        (b'{"target": "api", "session": "\xc3\x28"}', "INVALID_FIELD at action: is not UTF-8"),
        (b"not json", "INVALID_FIELD at action: is not valid JSON"),
    ],
    # Short ids: pytest puts the test id in $PYTEST_CURRENT_TEST, which the child inherits, and
    # an id made of the 200 kB action is over the kernel's 128 KiB limit on one variable.
    ids=["100k-deep", "not-utf8", "not-json"],
)
def test_the_cli_refuses_bad_action_text_with_one_line_and_exit_2(
    tmp_path: Path, stdin: bytes, expect: str
) -> None:
    cfg = write_config(tmp_path, {"api": http_target("http://127.0.0.1:9")})
    p = _cli("call", "--config", str(cfg), stdin=stdin)
    assert p.returncode == 2, p.stderr
    assert b"Traceback" not in p.stderr and p.stdout == b""
    line = p.stderr.decode().strip()
    assert "\n" not in line and line.startswith("affidavit: action refused: ") and expect in line


def test_an_action_larger_than_any_target_accepts_is_not_read_whole(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, {"api": http_target("http://127.0.0.1:9", max_body=16)})
    p = _cli("call", "--config", str(cfg), stdin=b" " * (2 << 20))  # 6 x 16 + 1 MiB allowed
    assert p.returncode == 2 and b"PAYLOAD_LIMIT at action: is larger than" in p.stderr


# --- objects from the Python API --------------------------------------------------------------


def _deep(n: int) -> Any:
    obj: Any = "x"
    for _ in range(n):
        obj = [obj]
    return obj


async def test_a_deep_wide_or_cyclic_object_is_an_envelope_not_a_recursion_error(
    tmp_path: Path, token: str
) -> None:
    cyclic: dict[str, Any] = {**GET}
    cyclic["headers"] = {"X-Loop": cyclic}
    cases: list[tuple[object, str]] = [
        ({**GET, "body": _deep(100_000)}, "nests deeper"),
        ({**GET, "headers": {"X-A": _deep(50)}}, "nests deeper"),
        ({**GET, "body": list(range(MAX_NODES + 1))}, f"more than {MAX_NODES} values"),
        (cyclic, "nests deeper"),
    ]
    cfg = write_config(tmp_path, {"api": http_target("http://127.0.0.1:9")})
    async with open_broker(cfg) as broker:
        for action, message in cases:
            env = await broker.call(action)  # type: ignore[arg-type]
            rec = _refused(broker, env, "PAYLOAD_LIMIT")
            assert rec.field == "action" and message in env["error"]["message"]


# --- caller strings, before anything is journaled --------------------------------------------


@pytest.mark.parametrize(
    "session",
    ["x" * (5 << 20), "\udc80bad", "tab\there", "\x1b[31mred", "é"],
    ids=["5MB", "lone-surrogate", "control", "escape-sequence", "non-ascii"],
)
async def test_a_refused_session_is_journaled_bounded_never_whole(
    tmp_path: Path, token: str, session: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(200))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as broker:
            before = _journal_size(tmp_path)
            env = await broker.call({**GET, "session": session})
            rec = _refused(broker, env, "INVALID_FIELD")
            assert rec.field == "session" and rec.session is None
            accepted = broker.events(env["invocation_id"])[0].attrs
            refused = accepted["refused_session"]
            assert refused["length"] == len(session)
            assert len(refused["prefix"]) <= 4 * 64 and refused["prefix"].isprintable()
            assert len(refused["sha256"]) == 64
        assert srv.requests == []
    # The journal grew by rows, not by the value (a 5 MB session grew it by 15 MB).
    assert _journal_size(tmp_path) - before < 256 * 1024


def test_a_non_utf8_session_through_the_cli_is_an_envelope(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, {"api": http_target("http://127.0.0.1:9")})
    action = json.dumps({**GET, "session": "\udc80"}).encode()  # JSON escapes it: valid UTF-8
    p = _cli("call", "--config", str(cfg), stdin=action)
    assert p.returncode == 1, p.stderr
    assert b"Traceback" not in p.stderr
    env = json.loads(p.stdout)
    assert (env["error"]["code"], env["error"]["field"]) == ("INVALID_FIELD", "session")
    with sqlite3.connect(tmp_path / "journal.db") as db:
        (attrs,) = db.execute("SELECT attrs FROM events WHERE kind = 'ACTION_ACCEPTED'").fetchone()
    assert json.loads(attrs)["refused_session"]["prefix"] == "\\udc80"


async def test_nothing_is_sent_for_a_refused_action(tmp_path: Path, token: str) -> None:
    async with HostileServer.running(scripts.serve(Reply(200))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        with trio.fail_after(LIMIT):
            async with open_broker(cfg) as broker:
                await broker.call({**GET, "session": "\x00"})
                await broker.call({**GET, "body": _deep(40)})
        assert srv.requests == []


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("/x?_method=DELETE", "FORBIDDEN_HEADER"),
        ("/x?%5FMETHOD=DELETE", "FORBIDDEN_HEADER"),
        ("/x?X-HTTP-Method-Override=DELETE", "FORBIDDEN_HEADER"),
        ("/x?_method%00=DELETE", "INVALID_FIELD"),
    ],
)
async def test_a_method_override_in_the_query_is_refused_at_path_and_never_sent(
    tmp_path: Path, path: str, code: str
) -> None:
    """A target that allows POST but not DELETE: ``POST /x?_method=DELETE`` would run as DELETE
    on Rails, Laravel or Express's method-override -- with the credential."""
    async with HostileServer.running(scripts.serve(Reply(200))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url, methods=["GET", "POST"])})
        with trio.fail_after(LIMIT):
            async with open_broker(cfg) as broker:
                env = await broker.call({**GET, "method": "POST", "path": path})
                _refused(broker, env, code)
        assert env["error"]["field"] == "path"
        assert srv.requests == [] and srv.connections == 0


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/x-www-form-urlencoded", "_method=delete"),
        ("application/x-www-form-urlencoded,text/plain", "_method=delete"),
        ("", "_method=delete"),
        ("application/json", '{"_method": "DELETE"}'),
        (
            "multipart/form-data; boundary=B",
            '--B\r\nContent-Disposition: form-data; name="t"; name="\\_method"\r\n\r\n'
            "DELETE\r\n--B--\r\n",
        ),
    ],
)
async def test_a_method_override_in_a_form_body_is_refused_at_body_and_never_sent(
    tmp_path: Path, content_type: str, body: str
) -> None:
    """Rails' Rack::MethodOverride reads ``_method`` from a POST's form body (its media type
    ends at ";" or ","; an empty one is none), Laravel from a JSON body's object too: the same
    refusal as in the query, at the body's field."""
    async with HostileServer.running(scripts.serve(Reply(200))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url, methods=["GET", "POST"])})
        form = {"Content-Type": content_type}
        with trio.fail_after(LIMIT):
            async with open_broker(cfg) as broker:
                action = {**GET, "method": "POST", "headers": form, "body": body}
                env = await broker.call(action)
                _refused(broker, env, "FORBIDDEN_HEADER")
        assert env["error"]["field"] == "body"
        assert srv.requests == [] and srv.connections == 0
