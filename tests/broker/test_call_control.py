"""``CallControl``: how the daemon stops a call it runs for a caller (affidavit/engine/control.py).

Seed, "Cancellation after dispatch is not a preflight error": a caller that goes away before the
dispatch gate withdraws the call -- CALLER_CANCELLED, not_attempted, nothing sent; after the
gate the withdrawal is refused and the call runs to its result.  A stop (the daemon's shutdown
past its grace) ends the call wherever it is, recorded BROKER_SHUTDOWN with the outcome its
boundary proves.  And the journal's owner closes every record a stopped broker left open.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.engine import CallControl
from affidavit.statemachine import EventKind
from tests.http.hostile import HostileServer, Reply, scripts, unresponsive_listener

from .helpers import (
    FakeResolver,
    custom_resolver,
    event_kinds,
    http_target,
    open_broker,
    write_config,
)
from .test_fetch_stale import _crashed_record

E = EventKind
LIMIT = 20
POST = {"target": "api", "method": "POST", "path": "/v1/pay", "body": "{}"}


async def _run(broker: Broker, control: CallControl, out: list[dict[str, Any]]) -> None:
    out.append(await broker.call(POST, control=control))


async def _connecting(broker: Broker, control: CallControl) -> None:
    with trio.fail_after(LIMIT):
        while True:
            iid = control.invocation_id
            rec = broker.record(iid) if iid else None
            if rec is not None and rec.state == "authorized":
                return
            await trio.sleep(0.01)


@pytest.mark.parametrize(
    ("how", "code", "retry"),
    [("withdraw", "CALLER_CANCELLED", "backoff"), ("stop", "BROKER_SHUTDOWN", "backoff")],
)
async def test_before_the_gate_a_withdrawal_or_a_stop_ends_the_call_not_attempted(
    tmp_path: Path, token: str, how: str, code: str, retry: str
) -> None:
    async with unresponsive_listener() as port:
        target = http_target(f"http://127.0.0.1:{port}", timeout={"connect": 30, "total": 40})
        async with open_broker(write_config(tmp_path, {"api": target})) as broker:
            control, out = CallControl(), []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_run, broker, control, out)
                await _connecting(broker, control)
                with trio.fail_after(5):  # well inside the 30 s connect timeout
                    if how == "withdraw":
                        assert control.withdraw() is True
                    else:
                        control.stop()
            iid = out[0]["invocation_id"]
            kinds = event_kinds(broker, iid)
    err = out[0]["error"]
    assert (err["code"], err["phase"], err["outcome"], err["retry"]) == (
        code,
        "connection_setup",
        "not_attempted",
        retry,
    )
    assert E.DISPATCH_STARTED not in kinds and kinds[-1] is E.SETUP_FAILED


async def test_a_withdrawal_just_before_connecting_still_sends_nothing(
    tmp_path: Path, token: str
) -> None:
    """The caller goes away while the host name resolves -- the last moment before setup."""
    control = CallControl()

    async def on_lookup(name: str) -> None:
        assert control.withdraw() is True

    async with HostileServer.running(scripts.held(Reply(200))) as srv:
        target = http_target(f"http://api.test:{srv.port}", trust_cleartext=True)
        with custom_resolver(FakeResolver({"api.test": "127.0.0.1"}, on_lookup)):
            async with open_broker(write_config(tmp_path, {"api": target})) as broker:
                with trio.fail_after(LIMIT):
                    env = await broker.call(POST, control=control)
    assert (env["error"]["code"], env["error"]["outcome"]) == ("CALLER_CANCELLED", "not_attempted")
    assert srv.requests == [] and srv.connections == 0


async def test_after_the_gate_a_withdrawal_is_refused_and_the_call_completes(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.held(Reply(201, body=b'{"id": 1}'))) as srv:
        config = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(config) as broker, trio.open_nursery() as nursery:
            out: list[dict[str, Any]] = []
            control = CallControl()
            nursery.start_soon(_run, broker, control, out)
            with trio.fail_after(LIMIT):
                await srv.event("received").wait()
            assert control.withdraw() is False
            srv.event("release").set()
    assert "error" not in out[0]
    assert out[0]["result"]["status"] == 201


async def test_after_the_gate_a_stop_leaves_the_outcome_unknown(tmp_path: Path, token: str) -> None:
    out: list[dict[str, Any]] = []
    async with HostileServer.running(scripts.held()) as srv:
        config = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(config) as broker:
            control = CallControl()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_run, broker, control, out)
                with trio.fail_after(LIMIT):
                    await srv.event("received").wait()
                control.stop()
            rec = broker.record(out[0]["invocation_id"])
    err = out[0]["error"]
    assert (err["code"], err["phase"], err["outcome"], err["retry"]) == (
        "BROKER_SHUTDOWN",
        "remote_execution",
        "unknown",
        "reconcile",
    )
    assert rec is not None and rec.state == "interrupted"


async def test_the_journals_owner_closes_open_records_without_waiting_for_their_leases(
    tmp_path: Path, token: str
) -> None:
    """A lease that would run an hour more: ``fetch_result`` must wait it out (the holder may
    be alive); the owner of the journal knows it is not and closes the record now."""
    config = write_config(tmp_path, {"api": http_target("http://127.0.0.1:9")})
    db = tmp_path / "journal.db"
    await _crashed_record(db, "act_left_open", time.time() + 3600)
    async with open_broker(config) as broker:
        assert (await broker.fetch_result("act_left_open") or {})["error"]["code"] == "IN_PROGRESS"
    from affidavit.config import load_config

    async with Broker.open(config=load_config(config), owner="the test") as broker:
        closed = await broker.recover()
        again = await broker.recover()
    assert [r.invocation_id for r in closed] == ["act_left_open"]
    rec = closed[0]
    assert (rec.state, rec.outcome.value, rec.code and rec.code.value) == (
        "interrupted",
        "unknown",
        "REMOTE_OUTCOME_UNKNOWN",
    )
    assert again == []
