"""The journal stalls at the dispatch gate past the call's deadline: the gate's DISPATCH_STARTED
is not cancellable (``attempt.py``), so the deadline falls while it runs, and the adapter,
unwinding from the gate's error, raises the deadline's cancellation in its place.  The answer
is what the journal stopped the attempt with -- never CONNECT_TIMEOUT ("Connection setup did
not finish within its timeout", hint backoff), which sends an operator to a network that
connected fine (audit 49c: evidence path dns_resolved, tcp_connected, abandoned, LEASE_LOST
recorded, and the envelope said CONNECT_TIMEOUT).

The stall: a trigger holds DISPATCH_STARTED's insert, then ends its own session
(``tests/postgres.terminate_on_insert``), on a shared PostgreSQL journal.
- every run: the write fails, not committed, after its runs (``journal/commit.py``): the
  journal's SETUP_FAILED, stage ``journal``;
- the first run only, held past the lease: the rerun finds the lease run out and records
  LEASE_LOST in the gate's transaction: the answer is LEASE_LOST.
Nothing is sent either way.  A caller's deadline shorter than the target's falls the same
way: the answer is the journal's SETUP_FAILED, not CALLER_CANCELLED -- the caller did not stop
the attempt, the journal did (its write failed after the deadline) -- and it is what the
record holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.config import load_config
from affidavit.engine.settings import EngineSettings
from affidavit.statemachine import EventKind as E
from tests.http.hostile import HostileServer, Reply, scripts
from tests.postgres import Cluster, terminate_on_insert

from .helpers import assert_error, event_kinds, http_target, pg_journal, write_config

TOTAL = 1.0  # seconds: the target's total timeout, the call's deadline
LIMIT = 30
POST = {"target": "api", "method": "POST", "path": "/charge", "body": "{}"}

# (runs it stalls (None: every one), held for, [journal] reconnect, lease margin, code,
#  stage or None)
ROWS = {
    "write_failed": (None, 1.5, 0.5, 5.0, "SETUP_FAILED", "journal"),
    "lease_lost": (1, 2.5, 5.0, 1.0, "LEASE_LOST", None),
}


@pytest.mark.parametrize("row", sorted(ROWS))
async def test_a_journal_stall_at_the_gate_past_the_deadline_is_answered_as_the_journal(
    tmp_path: Path, pg: Cluster, pg_url: str, token: str, row: str
) -> None:
    times, held, reconnect, margin, code, stage = ROWS[row]
    journal = pg_journal(tmp_path, pg_url, reconnect=reconnect)
    async with HostileServer.running(scripts.serve(Reply(201, body=b"{}"))) as srv:
        target = http_target(srv.url, timeout={"connect": TOTAL, "total": TOTAL})
        config = load_config(write_config(tmp_path, {"api": target}, journal=journal))
        settings = EngineSettings(lease_margin=margin)
        async with Broker.open(config=config, settings=settings) as broker:
            terminate_on_insert(
                pg, pg_url.rsplit("/", 1)[1], "DISPATCH_STARTED", sleep=held, times=times
            )
            with trio.fail_after(LIMIT):
                env: dict[str, Any] = await broker.call(POST)
            kinds = event_kinds(broker, env["invocation_id"])
    assert srv.requests == [] and E.DISPATCH_STARTED not in kinds, kinds
    error = env["error"]
    assert error["code"] == code and error["code"] != "CONNECT_TIMEOUT", env
    assert error["phase"] == "connection_setup" and not env["evidence"]["dispatch_started"], env
    if stage is not None:
        assert [a["stage"] for a in env["evidence"]["attempts"]] == [stage], env
        assert error["outcome"] == "not_attempted" and error["retry"] == "backoff", env
        assert "journal" in error["message"], error
    else:
        assert E.LEASE_LOST in kinds and env["evidence"]["stale_workers"], env
        assert "it sent nothing" in error["message"], error


async def test_a_journal_stall_past_a_callers_shorter_deadline_is_answered_as_the_journal(
    tmp_path: Path, pg: Cluster, pg_url: str, token: str
) -> None:
    """The caller's timeout (1 s) is shorter than the target's (5 s), so a deadline falling
    before dispatch would be the caller's (CALLER_CANCELLED).  Here it falls while the gate's
    DISPATCH_STARTED is held and then fails (every run lost, ``reconnect`` 0.5 s): the
    journal stopped the attempt -- SETUP_FAILED stage ``journal``, not_attempted, backoff --
    and the envelope says exactly what the durable record says."""
    journal = pg_journal(tmp_path, pg_url, reconnect=0.5)
    async with HostileServer.running(scripts.serve(Reply(201, body=b"{}"))) as srv:
        target = http_target(srv.url, timeout={"connect": 5.0, "total": 5.0})
        config = load_config(write_config(tmp_path, {"api": target}, journal=journal))
        settings = EngineSettings(lease_margin=5.0)
        async with Broker.open(config=config, settings=settings) as broker:
            terminate_on_insert(pg, pg_url.rsplit("/", 1)[1], "DISPATCH_STARTED", sleep=1.5)
            with trio.fail_after(LIMIT):
                env: dict[str, Any] = await broker.call(POST, timeout=TOTAL)
            kinds = event_kinds(broker, env["invocation_id"])
            assert_error(
                broker,
                env,
                phase="connection_setup",
                outcome="not_attempted",
                retry="backoff",
                code="SETUP_FAILED",
            )
    assert srv.requests == [] and E.DISPATCH_STARTED not in kinds, kinds
    assert [a["stage"] for a in env["evidence"]["attempts"]] == ["journal"], env
    assert "journal" in env["error"]["message"], env
