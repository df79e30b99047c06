"""An operation's polls are paced, not counted (audit 50, item 2; review of daemonfix50): each
poll adds rows to its submission's record, so two polls that reach the status resource are at
least the target's ``operations.min_poll_interval`` apart.  A poll sooner, from any caller, is
refused ``POLL_TOO_SOON`` (429, ``retry_after``) before anything is asked or written -- and
never for good: the next slot, whoever takes it, learns the job's state for every caller, an
ended job is answered at once, an open poll is taken up.  (Before, a lifetime cap of polls froze
the operation ``pending`` for every caller once any of them had spent it.)"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.engine import OperationError
from tests.http.hostile import HostileServer, scripts

from .approvalkit import OPS, OPS_UID
from .helpers import open_broker, write_config
from .http_rows import LIMIT
from .test_operations import JOBS, _poll, _submit, _target, job_api

OPS_TABLE = JOBS["operations"]
PACE = 0.25
LOOP = 1.2
"""Seconds a fast loop polls for: at most LOOP / PACE + 1 of its polls reach the remote."""


def _gets(srv: HostileServer) -> int:
    return sum(1 for r in srv.requests if r.method == "GET")


async def _poll_or_too_soon(
    broker: Broker, op_id: str, uid: int, after: int = 1
) -> dict[str, Any] | None:
    """The answer, or None when refused POLL_TOO_SOON (checked: 429, no field, ``retry_after``
    the interval left in whole seconds: ``after``)."""
    try:
        with trio.fail_after(LIMIT):
            return await broker.poll_operation(op_id, requester=uid)
    except OperationError as exc:
        assert (exc.code, exc.status, exc.field) == ("POLL_TOO_SOON", 429, None), exc
        assert exc.retry_after == after
        # The state read again from the record when refused: one ended since is answered.
        assert "Its state as last polled: pending (" in str(exc), exc
        return None


async def test_a_fast_poll_loop_reaches_the_remote_at_most_once_per_interval(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(job_api(["running"]))) as srv:
        jobs = _target(srv, operations={**OPS_TABLE, "min_poll_interval": PACE})
        async with open_broker(write_config(tmp_path, {"jobs": jobs})) as broker:
            env = await _submit(broker)
            iid, op_id = env["invocation_id"], env["operation"]["id"]
            refused = tries = 0
            end = time.monotonic() + LOOP
            while time.monotonic() < end and tries < 10_000:  # bounded in time and count
                tries += 1
                rows = len(broker.events(iid))
                if await _poll_or_too_soon(broker, op_id, 1000) is None:
                    refused += 1
                    assert len(broker.events(iid)) == rows  # nothing written
                await trio.sleep(0.005)
            polls = broker.operations()[0]["polls"]
    assert refused > 0
    assert 2 <= polls <= LOOP / PACE + 1, (polls, tries)
    assert _gets(srv) == polls  # each poll recorded reached the remote; no refused one did


async def test_another_uid_polling_cannot_keep_a_caller_from_the_final_state(
    tmp_path: Path, token: str
) -> None:
    states = ["running"] * 3 + ["done"]
    async with HostileServer.running(scripts.serve(job_api(states))) as srv:
        jobs = _target(srv, operations={**OPS_TABLE, "min_poll_interval": PACE})
        async with open_broker(write_config(tmp_path, {"jobs": jobs})) as broker:
            op_id = (await _submit(broker))["operation"]["id"]
            learnt: list[str] = []

            async def hostile() -> None:  # uid 2000 polls as fast as it may, until it ends
                while not learnt:
                    await _poll_or_too_soon(broker, op_id, 2000)
                    await trio.sleep(0.001)

            with trio.fail_after(LIMIT):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(hostile)
                    while not learnt:  # uid 1000 polls every interval
                        await trio.sleep(PACE)
                        answer = await _poll_or_too_soon(broker, op_id, 1000)
                        if answer is not None and answer["operation"]["state"] != "pending":
                            learnt.append(answer["operation"]["state"])
            assert learnt == ["succeeded"]
    assert _gets(srv) == len(states)  # the job's end was asked once: every later poll read it


async def test_polls_asked_at_once_reach_the_remote_once(tmp_path: Path, token: str) -> None:
    # Paced from the moment a poll is let through, before its first await: polls in flight
    # together in one broker are paced too (the record shows none of them yet).
    async with HostileServer.running(scripts.serve(job_api(["running"]))) as srv:
        jobs = _target(srv, operations={**OPS_TABLE, "min_poll_interval": "1h"})
        async with open_broker(write_config(tmp_path, {"jobs": jobs})) as broker:
            op_id = (await _submit(broker))["operation"]["id"]
            answers: list[dict[str, Any] | None] = []

            async def one(uid: int) -> None:
                answers.append(await _poll_or_too_soon(broker, op_id, uid, after=3600))

            async with trio.open_nursery() as nursery:
                for uid in range(1000, 1005):
                    nursery.start_soon(one, uid)
    assert sum(a is not None for a in answers) == 1
    assert _gets(srv) == 1


async def test_a_poll_sooner_than_the_last_row_of_another_broker_is_refused(
    tmp_path: Path, token: str
) -> None:
    # The pace is the record's, not this process's alone: a broker opened after another polled
    # (the command line's `operation poll`, say) reads when the last poll was recorded.
    async with HostileServer.running(scripts.serve(job_api(["running"]))) as srv:
        jobs = _target(srv, operations={**OPS_TABLE, "min_poll_interval": "1h"})
        cfg = write_config(tmp_path, {"jobs": jobs})
        async with open_broker(cfg) as broker:
            op_id = (await _submit(broker))["operation"]["id"]
            assert (await _poll(broker, op_id))["poll"] is not None
        async with open_broker(cfg) as other:
            assert await _poll_or_too_soon(other, op_id, 1000, after=3600) is None
    assert _gets(srv) == 1


@contextlib.asynccontextmanager
async def _approved_jobs(
    tmp_path: Path,
) -> AsyncIterator[tuple[HostileServer, Broker, str]]:
    """The jobs API (its GETs under approval, polls paced an hour apart), a broker whose
    operator is ``OPS_UID``, and the accepted operation's id."""
    async with HostileServer.running(scripts.serve(job_api(["done"]))) as srv:
        jobs = _target(
            srv,
            operations={**OPS_TABLE, "min_poll_interval": "1h"},
            approval={"methods": ["GET"], "wait": "0s"},
        )
        path = write_config(tmp_path, {"jobs": jobs})
        with path.open("a") as f:
            f.write(f"[service]\noperator_uids = [{OPS_UID}]\n")
        async with open_broker(path) as broker:
            yield srv, broker, (await _submit(broker))["operation"]["id"]


async def test_an_open_poll_is_taken_up_within_the_interval(tmp_path: Path, token: str) -> None:
    # Taking up the poll awaiting an operator asks nothing new: never POLL_TOO_SOON.
    async with _approved_jobs(tmp_path) as (srv, broker, op_id):
        with trio.fail_after(LIMIT):
            first = await broker.poll_operation(op_id)
            assert first["poll"]["error"]["code"] == "APPROVAL_PENDING"
            with pytest.raises(OperationError) as pending:
                await broker.poll_operation(op_id)
            assert pending.value.code == "POLL_PENDING"
            await broker.approve(first["poll"]["invocation_id"], note="ok", operator=OPS)
            answer = await broker.poll_operation(op_id)
        assert answer["poll"]["invocation_id"] == first["poll"]["invocation_id"]
        assert answer["operation"]["state"] == "succeeded"
    assert _gets(srv) == 1


async def test_a_poll_refused_too_soon_answers_an_end_recorded_since_it_read_the_record(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The poll reads the record (pending), then checks the target has not moved -- an await,
    # which may hop to a thread -- and only then is paced.  Another poll, let through past the
    # interval, records the job's end meanwhile: this one is too soon now, and answers the end
    # it reads again, not the pending of its first read.
    async with HostileServer.running(scripts.serve(job_api(["running", "done"]))) as srv:
        jobs = _target(srv, operations={**OPS_TABLE, "min_poll_interval": PACE})
        async with open_broker(write_config(tmp_path, {"jobs": jobs})) as broker:
            op_id = (await _submit(broker))["operation"]["id"]
            assert (await _poll(broker, op_id))["operation"]["state"] == "pending"
            snapshot = broker._engine.snapshot
            real = snapshot.moved
            others: list[dict[str, Any]] = []

            async def moved(*args: Any) -> Any:
                if not others:  # another caller's poll, past the interval, ends the job
                    others.append({})
                    others[0] = await broker.poll_operation(op_id, requester=2000)
                return await real(*args)

            await trio.sleep(PACE * 1.2)
            monkeypatch.setattr(snapshot, "moved", moved)
            with trio.fail_after(LIMIT):
                answer = await broker.poll_operation(op_id, requester=1000)
    assert others[0]["operation"]["state"] == "succeeded"
    assert answer["operation"]["state"] == "succeeded" and answer["poll"] is None
    assert _gets(srv) == 2


async def test_a_last_poll_row_dated_far_ahead_holds_a_poll_back_one_interval_at_most(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A writer whose clock runs 10 hours ahead labels the last poll's row in the future: the
    # next poll is held back by the interval at most, never until that label is past.
    async with HostileServer.running(scripts.serve(job_api(["running"]))) as srv:
        jobs = _target(srv, operations={**OPS_TABLE, "min_poll_interval": "1h"})
        cfg = write_config(tmp_path, {"jobs": jobs})
        async with open_broker(cfg) as broker:
            op_id = (await _submit(broker))["operation"]["id"]
            writer = broker._engine.journal._writer  # its wall clock labels the rows
            monkeypatch.setattr(writer, "clock", lambda: time.time() + 10 * 3600)
            assert (await _poll(broker, op_id))["poll"] is not None
        async with open_broker(cfg) as other:
            assert await _poll_or_too_soon(other, op_id, 1000, after=3600) is None
    assert _gets(srv) == 1


async def test_a_poll_asked_anew_after_an_open_one_was_never_sent_is_paced(
    tmp_path: Path, token: str
) -> None:
    # The open poll awaiting an operator is denied: nothing was sent, and the next poll closes
    # it and would ask anew -- another claim and more rows on the record -- so it is paced like
    # any new poll: POLL_TOO_SOON within the interval, nothing asked.
    async with _approved_jobs(tmp_path) as (srv, broker, op_id):
        with trio.fail_after(LIMIT):
            first = await broker.poll_operation(op_id)
            assert first["poll"]["error"]["code"] == "APPROVAL_PENDING"
            await broker.deny(first["poll"]["invocation_id"], note="no", operator=OPS)
        assert await _poll_or_too_soon(broker, op_id, 1000, after=3600) is None
    assert _gets(srv) == 0
