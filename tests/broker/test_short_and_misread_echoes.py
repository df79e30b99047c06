"""Audit 54b, F2 and F3, through a real ``Broker.call`` against a loopback server.

F2: a Basic password under 8 bytes (``MIN_ANY_CASE``) is replaced wherever it occurs -- in a
date as well as in an echo -- so its replacement proves no echo: the record says
``short_redacted`` ("may be ordinary text"), not ``redacted``, and the operator's log says once
per target that an agent can guess such a value through echoes (CREDENTIAL_SHORT, the field
path, never the value).  F3: a non-ASCII password echoed as Python's http.server and WSGI hand
it over -- its UTF-8 bytes read as latin-1 -- then written as JSON (``\\u00c3\\u00a4``).
"""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path

import pytest
import trio

from tests.http.hostile import HostileServer, Received, Reply, scripts

from .helpers import http_target, open_broker, write_config
from .test_basic_password_echo import call_basic


def _invoices(req: Received) -> Reply:
    """Ordinary data that happens to hold the short password's digits; no echo."""
    body = {"invoices": [{"id": 12024, "date": "2024-12-07"}], "year": 2024}
    return Reply(
        200, headers=[("Content-Type", "application/json")], body=json.dumps(body).encode()
    )


def _wsgi_echo(req: Received) -> Reply:
    """The decoded Basic password as a WSGI application sees it (latin-1), answered in JSON."""
    auth = req.header("authorization") or ""
    user_pass = base64.b64decode(auth.split(" ", 1)[1]).decode("latin-1")
    body = json.dumps({"user": user_pass.split(":", 1)[0], "password": user_pass.split(":", 1)[1]})
    return Reply(200, headers=[("Content-Type", "application/json")], body=body.encode())


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


async def test_a_short_password_in_ordinary_data_is_recorded_as_maybe_ordinary_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    monkeypatch.setenv("BASIC_CRED", "alice:2024")
    env, fetched, events = await call_basic(tmp_path, _invoices)
    assert "error" not in env, env
    assert '"date": "[REDACTED]-12-07"' in env["result"]["body"]
    # The record does not say the remote echoed a secret: it may be ordinary text.
    assert "'body_received_withheld': 'short_redacted'" in events, events
    assert "'redacted'" not in events
    short = [w for w in _warnings(caplog) if w.startswith("CREDENTIAL_SHORT: ")]
    assert len(short) == 1, _warnings(caplog)
    assert short[0].startswith("CREDENTIAL_SHORT: targets.t.credential ")
    assert "guess" in short[0]
    for text in _warnings(caplog):
        assert "2024" not in text
    # Ids, hashes and timestamps may hold the digits "2024" by chance: the body is checked for
    # them, every text for the credential's whole forms.
    assert "2024" not in env["result"]["body"].replace("[REDACTED]-12-07", "")
    basic = base64.b64encode(b"alice:2024").decode()
    for text in (*_warnings(caplog), json.dumps(env), json.dumps(fetched), events):
        assert "alice:2024" not in text and basic not in text


async def test_an_eight_byte_password_is_not_warned_of(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    monkeypatch.setenv("BASIC_CRED", "alice:q7Wp3xN9")
    env, _, _ = await call_basic(tmp_path, _invoices)
    assert "error" not in env, env
    assert not [w for w in _warnings(caplog) if "CREDENTIAL_SHORT" in w], _warnings(caplog)


async def test_an_empty_password_is_not_warned_of(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``alice-admin:``: an empty password is no form, nothing of it is replaced -- no
    CREDENTIAL_SHORT (the whole value, 12 bytes, is no short one either)."""
    caplog.set_level(logging.WARNING)
    monkeypatch.setenv("BASIC_CRED", "alice-admin:")
    env, _, _ = await call_basic(tmp_path, _invoices)
    assert "error" not in env, env
    assert '"date": "2024-12-07"' in env["result"]["body"]
    assert not [w for w in _warnings(caplog) if "CREDENTIAL_SHORT" in w], _warnings(caplog)


async def test_a_non_ascii_password_echoed_as_wsgi_reads_it_is_redacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    password = "pässwörd-Ünïcode-CANARYzz9Q"
    monkeypatch.setenv("BASIC_CRED", f"alice:{password}")
    env, fetched, events = await call_basic(tmp_path, _wsgi_echo)
    assert "error" not in env, env
    body = env["result"]["body"]
    assert json.loads(body) == {"user": "alice", "password": "[REDACTED]"}, body
    assert "'body_received_withheld': 'redacted'" in events
    for text in (json.dumps(env), json.dumps(fetched), events):
        assert "CANARY" not in text
    for path in sorted(tmp_path.glob("journal.db*")):
        assert b"CANARY" not in path.read_bytes(), path.name


def _many_invoices(req: Received) -> Reply:
    """Ordinary data holding the short password's digits, past ``max_result``."""
    body = json.dumps([{"id": i, "date": "2024-12-07"} for i in range(2000)]).encode()
    return Reply(200, headers=[("Content-Type", "application/json")], body=body)


async def test_a_short_value_in_an_answer_past_max_result_is_recorded_as_such(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record's ``result_size_limit`` takes ``short_redacted`` too (the projector accepts
    it), its counts withheld as for any replacement."""
    monkeypatch.setenv("BASIC_CRED", "alice:2024")
    async with HostileServer.running(scripts.serve(_many_invoices)) as srv:
        target = http_target(srv.url, credential="env:BASIC_CRED", inject="basic")
        cfg = write_config(tmp_path, {"t": {**target, "max_result": 4096}})
        async with open_broker(cfg) as broker:
            with trio.fail_after(10):
                env = await broker.call({"target": "t", "method": "GET", "path": "/"})
    assert env["error"]["code"] == "RESULT_SIZE_LIMIT", env
    over = env["evidence"]["result_size_limit"]
    assert over == {"limit": 4096, "received_withheld": "short_redacted"}, over
    assert env["evidence"]["http"]["received_withheld"] == "short_redacted"


def _year_header(req: Received) -> Reply:
    """Ordinary data, a header among it, holding the short password's digits (no echo)."""
    return Reply(
        200,
        headers=[("Content-Type", "application/json"), ("X-Report-Year", "2024")],
        body=b'{"date": "2024-12-07"}',
    )


async def test_a_short_value_in_a_header_makes_no_echo_of_the_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A header holding a short value's form is no proof of an echo (every ``Date`` holds the
    year): the record says ``short_redacted``, never ``redacted`` (review fixR2, F2 through the
    head)."""
    monkeypatch.setenv("BASIC_CRED", "alice:2024")
    env, fetched, events = await call_basic(tmp_path, _year_header)
    assert "error" not in env, env
    assert env["result"]["body"] == '{"date": "[REDACTED]-12-07"}'
    assert "'body_received_withheld': 'short_redacted'" in events, events
    assert "'redacted'" not in events, events
    assert env["evidence"]["http"]["received_withheld"] == "short_redacted", env["evidence"]
    for text in (json.dumps(env), json.dumps(fetched), events):
        assert "alice:2024" not in text
