"""An operation's polls are bounded (audit 50, item 2): each adds rows to its submission's
record, and a caller polling without end grew it past what the daemon ever answers whole.  Past
the target's ``operations.max_polls`` a poll is refused ``POLL_LIMIT`` (the setting's path as
its field) before anything is asked or written -- and the cap hides no outcome: a job that
ended is still answered, its record readable."""

from __future__ import annotations

from pathlib import Path

import pytest

from affidavit.engine import OperationError
from tests.http.hostile import HostileServer, scripts

from .helpers import open_broker, write_config
from .test_operations import JOBS, _poll, _submit, _target, job_api

OPS = JOBS["operations"]


async def test_past_max_polls_a_poll_is_refused_poll_limit_and_nothing_is_asked(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(job_api(["running"]))) as srv:
        jobs = _target(srv, operations={**OPS, "max_polls": 3})
        async with open_broker(write_config(tmp_path, {"jobs": jobs})) as broker:
            env = await _submit(broker)
            iid, op_id = env["invocation_id"], env["operation"]["id"]
            for _ in range(3):
                assert (await _poll(broker, op_id))["operation"]["state"] == "pending"
            rows = len(broker.events(iid))
            with pytest.raises(OperationError) as refused:
                await _poll(broker, op_id)
            assert (refused.value.code, refused.value.field) == (
                "POLL_LIMIT",
                "targets.jobs.operations.max_polls",
            )
            assert "3 times" in str(refused.value)
            assert len(broker.events(iid)) == rows  # nothing written
            assert broker.operations()[0]["polls"] == 3
    assert [r.method for r in srv.requests].count("GET") == 3  # the fourth never asked


async def test_a_job_that_ended_at_its_last_poll_is_still_answered_past_the_limit(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(job_api(["running", "done"]))) as srv:
        jobs = _target(srv, operations={**OPS, "max_polls": 2})
        async with open_broker(write_config(tmp_path, {"jobs": jobs})) as broker:
            op_id = (await _submit(broker))["operation"]["id"]
            await _poll(broker, op_id)
            assert (await _poll(broker, op_id))["operation"]["state"] == "succeeded"
            again = await _poll(broker, op_id)  # polls == max_polls: answered, nothing asked
            assert again["poll"] is None
            assert (again["operation"]["state"], again["operation"]["polls"]) == ("succeeded", 2)
    assert [r.method for r in srv.requests].count("GET") == 2
