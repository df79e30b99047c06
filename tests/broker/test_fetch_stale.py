"""fetch_result on a record a killed broker left at DISPATCH_STARTED.

While the dead holder's lease could still be live, the journal cannot tell a crash from a slow
call: IN_PROGRESS, fetch later.  Once the lease has expired, the record is closed with what it
proves — unknown, never not_attempted — and the answer says reconcile.  Neither sends anything.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.cli.tour import demo_config
from affidavit.config import load_config
from affidavit.engine.recovery import closing_event
from affidavit.journal import Journal
from affidavit.statemachine import Event, EventKind, EvidenceSource, ImpossibleEvent

E = EventKind
OP = {"target": "api", "protocol": "http", "idempotent": False, "fingerprint": "sha256:f"}


async def _crashed_record(db: Path, iid: str, lease_expires_at: float) -> None:
    """A dead broker's record: written while its lease ran (the first attempt's gate refuses a
    DISPATCH_STARTED after ``lease_expires_at``), its lease run out by now when it is past."""
    async with Journal.open(db, clock=lambda: min(time.time(), lease_expires_at - 1.0)) as j:
        await j.append(
            Event(
                E.ACTION_ACCEPTED,
                iid,
                {"operation": OP, "holder": "dead-broker", "lease_expires_at": lease_expires_at},
            )
        )
        await j.append(Event(E.PREFLIGHT_VALIDATED, iid, {}))
        await j.append(Event(E.CREDENTIAL_AUTHORIZED, iid, {}))
        await j.append(Event(E.DISPATCH_STARTED, iid, {"generation": 0}), barrier=True)


@pytest.mark.parametrize(
    ("expires_in", "code", "retry"),
    [(3600.0, "IN_PROGRESS", "fetch_result"), (-1.0, "REMOTE_OUTCOME_UNKNOWN", "reconcile")],
)
async def test_fetch_of_a_crashed_dispatch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, expires_in: float, code: str, retry: str
) -> None:
    monkeypatch.setenv("AFFIDAVIT_DEMO_TOKEN", "unused-token")
    cfg = tmp_path / "affidavit.toml"
    cfg.write_text(demo_config(tmp_path, 9), encoding="utf-8")
    config = load_config(cfg)
    await _crashed_record(config.journal.path, "act_crashed", time.time() + expires_in)
    with trio.fail_after(10):
        async with Broker.open(config=config) as broker:
            env = await broker.fetch_result("act_crashed")
            assert env is not None
            assert (env["error"]["code"], env["error"]["retry"]) == (code, retry)
            assert env["error"]["outcome"] == "unknown"
            assert env["evidence"]["dispatch_started"] is True
            if code != "IN_PROGRESS":
                # A lease that ran out proves no more: its holder may still run (a close it
                # gave up, ``internal_close``) -- never "the broker stopped", which only a
                # daemon's start-up recovery knows (``holder_gone``).
                said = "The attempt's lease ran out after dispatch; no result was recorded."
                assert env["error"]["message"] == said, env["error"]
            record = broker.record("act_crashed")
            assert record is not None and record.outcome.value == "unknown"
            assert "result" not in env or env["result"] is None


async def test_fetch_of_a_retry_whose_worker_died_before_its_own_dispatch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker took a retry lease (retry_pending) and died before its DISPATCH_STARTED.  The
    earlier attempt keeps the outcome unknown; the dead retry is closed as a setup failure of
    that retry (never as not_attempted, never left IN_PROGRESS once the lease has expired)."""
    monkeypatch.setenv("AFFIDAVIT_DEMO_TOKEN", "unused-token")
    cfg = tmp_path / "affidavit.toml"
    cfg.write_text(demo_config(tmp_path, 9), encoding="utf-8")
    config = load_config(cfg)
    iid = "act_dead_retry"
    await _crashed_record(config.journal.path, iid, time.time() - 60)
    async with Journal.open(config.journal.path) as j:
        await j.append(
            Event(E.ATTEMPT_INTERRUPTED, iid, {"code": "REMOTE_OUTCOME_UNKNOWN"}), barrier=True
        )
        lease = await j.acquire_lease(iid, "dead-retrier", 0.05)
    assert lease.generation == 1
    # A real wait: lease expiry is wall-clock time in the journal, not trio's clock.
    await trio.sleep(0.1)  # the retrier's lease runs out
    with trio.fail_after(10):
        async with Broker.open(config=config) as broker:
            env = await broker.fetch_result(iid)
            assert env is not None
            assert env["error"]["code"] != "IN_PROGRESS", env["error"]
            assert env["error"]["outcome"] == "unknown"
            assert env["error"]["retry"] != "fetch_result"
            assert env["evidence"]["dispatch_started"] is True
            # The projection's form for a refunded stop after an earlier dispatch (recovery's
            # own words are replaced, as old journals' "nothing was sent" is).
            assert env["error"]["message"] == (
                "This retry's lease ran out before its dispatch gate; this retry sent nothing,"
                " and the earlier attempt's outcome (unknown) stands."
            ), env["error"]
            record = broker.record(iid)
            assert record is not None and record.final
            assert record.outcome.value == "unknown"
            # No DISPATCH_STARTED in its generation: the dead retry sent nothing, and gives
            # back the unit its lease took -- only the first attempt's stays spent (52a).
            assert (record.budget.used, record.attempts[-1]["repeated"]) == (1, 1), record


async def test_fetch_of_a_result_that_was_complete_but_never_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker died between REMOTE_RESPONSE_COMPLETE and RESULT_COMMITTED.  Once its lease
    has expired the record is closed as a store failure: the outcome the journal proves stays,
    nothing is re-run (retry never), and it is not left IN_PROGRESS for ever."""
    monkeypatch.setenv("AFFIDAVIT_DEMO_TOKEN", "unused-token")
    cfg = tmp_path / "affidavit.toml"
    cfg.write_text(demo_config(tmp_path, 9), encoding="utf-8")
    config = load_config(cfg)
    iid = "act_unstored"
    await _crashed_record(config.journal.path, iid, time.time() - 60)
    async with Journal.open(config.journal.path) as j:
        await j.append(
            Event(
                E.REMOTE_RESPONSE_COMPLETE,
                iid,
                {"outcome": "committed", "code": None, "status": 200},
                source=EvidenceSource.REMOTE_RESPONSE,
            ),
            barrier=True,
        )
    with trio.fail_after(10):
        async with Broker.open(config=config) as broker:
            env = await broker.fetch_result(iid)
            assert env is not None
            assert env["error"]["code"] != "IN_PROGRESS", env["error"]
            assert (env["error"]["outcome"], env["error"]["retry"]) == ("committed", "never")
            record = broker.record(iid)
            assert record is not None and record.final
            assert record.outcome.value == "committed"


async def test_recovery_does_not_close_the_retry_that_took_over_after_it_read_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recovery reads a retry whose worker stalled past its lease (retry_pending, generation 1)
    and appends the event that closes it -- but another broker on the journal may take the next
    lease between that read and that append (retry_pending allows it: "the holder stalled").
    The closing event names the generation recovery read, so it cannot close the attempt of
    generation 2, which goes on to dispatch under its lease."""
    monkeypatch.setenv("AFFIDAVIT_DEMO_TOKEN", "unused-token")
    cfg = tmp_path / "affidavit.toml"
    cfg.write_text(demo_config(tmp_path, 9), encoding="utf-8")
    config = load_config(cfg)
    iid = "act_raced_retry"
    await _crashed_record(config.journal.path, iid, time.time() - 60)
    async with Journal.open(config.journal.path) as j:
        await j.append(
            Event(E.ATTEMPT_INTERRUPTED, iid, {"code": "REMOTE_OUTCOME_UNKNOWN"}), barrier=True
        )
        await j.acquire_lease(iid, "stalled-retrier", 0.05)
    await trio.sleep(0.1)  # real time: the stalled retrier's lease runs out
    with trio.fail_after(10):
        async with Broker.open(config=config) as broker:
            read = broker.record(iid)  # what recovery read
            assert read is not None and (read.state, read.generation) == ("retry_pending", 1)
            closing = closing_event(read, "broker_stopped")
            assert closing is not None
            lease = await broker.journal.acquire_lease(iid, "next-worker", 60.0)
            assert lease.generation == 2
            with pytest.raises(ImpossibleEvent, match="stale generation 1"):
                await broker.journal.append(closing, barrier=True)
            await broker.journal.append(
                Event(E.DISPATCH_STARTED, iid, {"generation": 2}), lease=("next-worker", 2)
            )
            record = broker.record(iid)
            assert record is not None and record.state == "dispatched"
