"""A caller's timeout: one parser and one refusal everywhere, and a deadline spent before
dispatch closes the record as the caller's stop.

* ``--timeout``, ``?timeout=`` and the Python API take seconds in (0, 100 years]
  (``wire.check_timeout``); 0, a negative value, NaN, ``inf`` and anything past 100 years are
  ``INVALID_FIELD at timeout`` in the same words, before anything is journaled.  (``--timeout
  inf`` ran embedded but was refused through the daemon, which took ``1e308``.)
* A budget spent before the first try (``--timeout 0.001``; 0 before it was refused) closes the
  record not_attempted with CALLER_CANCELLED.  It was answered LEASE_LOST -- no lease was lost
  -- and the record stayed ``authorized`` for good.
* The caller's deadline firing during connection setup is CALLER_CANCELLED, not a
  CONNECT_TIMEOUT blamed on the remote (contract, "Before dispatch").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.wire import MAX_TIMEOUT, TIMEOUT_RULE, parse_timeout
from affidavit.config import load_config
from affidavit.journal import JournalReader
from affidavit.schema.values import MAX_DURATION
from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import TOKEN_ENV, assert_error, http_target, open_broker, write_config

LIMIT = 30
GET = {"target": "api", "method": "GET", "path": "/x"}
BAD = ["0", "0.0", "-1", "nan", "inf", "-inf", "1e308", "9" * 26, "1_0", " 1", "3153600001"]


def _cli(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "affidavit", *args],
        input=stdin,
        capture_output=True,
        env={**os.environ, TOKEN_ENV: "tok-timeout-1234"},
        timeout=LIMIT,
        check=False,
    )


def test_the_longest_timeout_is_the_longest_duration() -> None:
    assert MAX_TIMEOUT == MAX_DURATION
    assert parse_timeout("3153600000") == MAX_TIMEOUT
    assert parse_timeout("1e-3") == 0.001


@pytest.mark.parametrize("value", BAD)
def test_a_timeout_outside_0_to_100_years_is_refused(value: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_timeout(value)
    assert str(info.value) == TIMEOUT_RULE


@pytest.mark.parametrize("value", [0, 0.0, -1.0, float("nan"), float("inf"), 1e308])
async def test_the_python_api_refuses_the_same_timeouts_before_journaling(
    tmp_path: Path, token: str, value: float
) -> None:
    cfg = write_config(tmp_path, {"api": http_target("http://127.0.0.1:9")})
    async with open_broker(cfg) as broker:
        with pytest.raises(ValueError) as info:
            await broker.call(GET, timeout=value)
        assert str(info.value) == TIMEOUT_RULE
        assert broker.journal.list_actions() == []


def test_the_cli_refuses_a_bad_timeout_before_reading_the_action(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, {"api": http_target("http://127.0.0.1:9")})
    for value in ("0", "inf", "1e308"):
        p = _cli("call", "-", "--config", str(cfg), "--timeout", value, stdin=b"{}")
        assert (p.returncode, p.stdout) == (2, b""), (value, p.stderr)
        assert p.stderr == f"affidavit: {TIMEOUT_RULE}\n".encode(), p.stderr
    assert not (tmp_path / "journal.db").exists()


async def test_a_deadline_spent_before_the_first_try_closes_the_record(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"{}"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as broker:
            env = await broker.call(GET, timeout=1e-9)
            rec = assert_error(
                broker,
                env,
                phase="connection_setup",
                outcome="not_attempted",
                retry="backoff",
                code="CALLER_CANCELLED",
            )
            assert rec.state == "setup_failed", rec.state  # closed, not left ``authorized``
            assert not srv.requests


def test_the_cli_s_short_timeout_is_the_caller_s_and_the_record_is_closed(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, {"api": http_target("http://127.0.0.1:9")})
    p = _cli("call", "-", "--config", str(cfg), "--timeout", "1e-9", stdin=json.dumps(GET).encode())
    assert p.returncode == 1, p.stderr
    err = json.loads(p.stdout)["error"]
    assert (err["code"], err["phase"], err["outcome"], err["retry"]) == (
        "CALLER_CANCELLED",
        "connection_setup",
        "not_attempted",
        "backoff",
    )
    with JournalReader.open(load_config(cfg).journal.path) as r:
        (record,) = r.list_actions()
    assert (record.state, record.code and record.code.value) == (
        "setup_failed",
        "CALLER_CANCELLED",
    )


async def test_the_caller_s_deadline_during_connection_setup_is_the_caller_s(
    tmp_path: Path, token: str
) -> None:
    """A TLS handshake that never completes: the caller's 0.3 s deadline fires before the
    target's 2 s connect timeout -- the caller stopped, the remote is not to blame."""
    async with HostileServer.running(scripts.silent()) as srv:
        target: dict[str, Any] = http_target(f"https://{srv.hostport}")
        cfg = write_config(tmp_path, {"api": target})
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                env = await broker.call(GET, timeout=0.3)
            assert_error(
                broker,
                env,
                phase="connection_setup",
                outcome="not_attempted",
                retry="backoff",
                code="CALLER_CANCELLED",
            )
