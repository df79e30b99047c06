"""``reconcile_query`` and ``poll_operation`` refused before anything was sent answer, embedded
and through the daemon alike, what the daemon's socket API answers (one mapping,
``tools.act_refused``): a call still running is ``STILL_RUNNING`` and a job whose status
resource the broker will not query is ``OPERATION_ERROR`` -- ``api_error``s, where the right
move is to wait or to check by hand.  Both used to be ``INVALID_FIELD`` at the id, retry
``after_correction``, as if the id were wrong.  An id that names nothing stays that (the
argument to correct), as ``fetch_result`` answers one."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.mcp.tools import NOT_SENT, api_error
from tests.broker.helpers import http_target, write_config
from tests.daemon.kit import running_daemon

from .conftest import Remotes, wait_for
from .kit import Connected, connected, env_without_secrets, structured
from .test_modes import MODES

HELD = {"target": "holds", "method": "POST", "path": "/h", "body": "{}"}


def _targets(remotes: Remotes) -> dict[str, dict[str, Any]]:
    """The remotes' targets, and ``elsewhere``: the jobs API under another base path, so its
    202's status resource (``/v1/jobs/j1``) is off the target's base path: never queried."""
    ops = {"status": "json:/state", "succeeded": ["done"], "failed": ["x"]}
    # ``paced``: the jobs API, its answer naming no state (the job stays pending), polled at
    # most once in 90 s.
    paced = {"status": "json:/nope", "succeeded": ["done"], "min_poll_interval": "90s"}
    return {
        **remotes.targets(),
        "elsewhere": http_target(remotes.jobs.url + "/v2", operations=ops),
        "paced": http_target(remotes.jobs.url + "/v1", operations=paced),
    }


@contextlib.asynccontextmanager
async def _session(mode: str, tmp: Path, remotes: Remotes, token: str) -> AsyncIterator[Connected]:
    log = tmp / "mcp.log"
    if mode == "embedded":
        cfg = write_config(tmp, _targets(remotes))
        async with connected(["--config", str(cfg)], remotes.env(token), log) as mcp:
            yield mcp
        return
    async with (
        running_daemon(tmp, _targets(remotes), token=token) as daemon,
        connected(["--socket", str(daemon.socket)], env_without_secrets(), log) as mcp,
    ):
        yield mcp


@pytest.mark.parametrize("mode", MODES)
async def test_still_running_and_an_unqueryable_job_keep_the_daemon_s_codes(
    tmp_path: Path, remotes: Remotes, token: str, mode: str
) -> None:
    async with _session(mode, tmp_path, remotes, token) as mcp:
        job = {"target": "elsewhere", "method": "POST", "path": "/jobs", "body": "{}"}
        op_id = structured(await mcp.call("http_request", job))["operation"]["id"]
        polled = await mcp.call("poll_operation", {"operation_id": op_id})
        assert polled.is_error is True
        error = structured(polled)["api_error"]
        assert error["code"] == "OPERATION_ERROR", error
        assert "not on this target's origin and base path" in error["message"], error
        assert [r.method for r in remotes.jobs.requests] == ["POST"]  # no poll was sent

        async with trio.open_nursery() as nursery:
            nursery.start_soon(mcp.call, "http_request", HELD)
            await wait_for(remotes.holds.event("received"))
            [held] = structured(await mcp.call("list_actions"))["actions"][-1:]
            queried = await mcp.call("reconcile_query", {"invocation_id": held["invocation_id"]})
            assert queried.is_error is True
            error = structured(queried)["api_error"]
            assert error["code"] == "STILL_RUNNING", error
            remotes.holds.event("release").set()
        assert len(remotes.holds.requests) == 1  # nothing queried

        unknown = structured(await mcp.call("reconcile_query", {"invocation_id": "act_nope"}))
        assert (unknown["error"]["code"], unknown["error"]["field"]) == (
            "INVALID_FIELD",
            "invocation_id",
        ), unknown


@pytest.mark.parametrize("mode", MODES)
async def test_a_poll_too_soon_is_not_attempted_backoff_with_retry_after(
    tmp_path: Path, remotes: Remotes, token: str, mode: str
) -> None:
    async with _session(mode, tmp_path, remotes, token) as mcp:
        job = {"target": "paced", "method": "POST", "path": "/jobs", "body": "{}"}
        op_id = structured(await mcp.call("http_request", job))["operation"]["id"]
        first = structured(await mcp.call("poll_operation", {"operation_id": op_id}))
        assert first["operation"]["state"] == "pending", first
        polled = await mcp.call("poll_operation", {"operation_id": op_id})
        assert polled.is_error is True
        error = structured(polled)["api_error"]
        assert (error["code"], error["outcome"], error["retry"]) == (
            "POLL_TOO_SOON",
            "not_attempted",
            "backoff",
        ), error
        assert 89 <= error["retry_after"] <= 90 and "field" not in error, error
    assert [r.method for r in remotes.jobs.requests] == ["POST", "GET"]  # the second unsent


@pytest.mark.parametrize(
    ("code", "retry"),
    [
        # Wait retry_after and poll again: the next slot learns the job's state.
        ("POLL_TOO_SOON", "backoff"),
        # Never held whole, however long one waits: read it in parts (results.held).
        ("ANSWER_TOO_LARGE", "never"),
    ],
)
def test_refusals_carry_their_own_retry_hint(code: str, retry: str) -> None:
    # Named in the table, not left to the fallback for codes it does not list (backoff, which
    # would tell an agent to wait for an answer no wait brings).
    assert NOT_SENT.get(code) == retry
    error = api_error(code, "m", sent=False)["api_error"]
    assert (error["outcome"], error["retry"]) == ("not_attempted", retry)
