"""``reconcile_query`` refused because of what the record is -- ``QUERY_PENDING`` (an earlier
query awaits an operator) and ``BATCH_NOT_ATOMIC`` (a batch applied item by item) -- answers the
refusal's own code, embedded and through the daemon alike (``tools.act_refused``).  Both used to
carry ``field = "invocation_id"``, which ``act_refused`` turns into ``INVALID_FIELD``, retry
``after_correction``: the agent never saw why, and was told to change an id that is right.
``poll_operation``'s ``POLL_PENDING`` (an earlier poll awaits an operator) likewise."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.broker.approvalkit import OPS_UID, PaymentsApi, reconcile_target
from tests.broker.helpers import http_target, write_config
from tests.broker.test_batches import BATCH, BATCH_CALL, RECONCILE, _cut_then_absent
from tests.broker.test_operations import JOBS, SUBMIT, job_api
from tests.daemon.kit import running_daemon
from tests.http.hostile import HostileServer, scripts

from .conftest import Remotes
from .kit import Connected, connected, env_without_secrets, structured
from .test_modes import MODES

CHARGE = {
    "target": "api",
    "method": "POST",
    "path": "/v1/charges",
    "body": json.dumps({"drop": True}),
    "idempotency_key": "m1",
}


@contextlib.asynccontextmanager
async def _session(
    mode: str, tmp: Path, targets: dict[str, Any], remotes: Remotes, token: str
) -> AsyncIterator[Connected]:
    log = tmp / "mcp.log"
    service = {"operator_uids": [OPS_UID]}
    if mode == "embedded":
        cfg = write_config(tmp, targets)
        with cfg.open("a") as f:
            f.write(f"[service]\noperator_uids = [{OPS_UID}]\n")
        async with connected(["--config", str(cfg)], remotes.env(token), log) as mcp:
            yield mcp
        return
    async with (
        running_daemon(tmp, targets, token=token, service=service) as daemon,
        connected(["--socket", str(daemon.socket)], env_without_secrets(), log) as mcp,
    ):
        yield mcp


def _refused(answer: Any, code: str) -> None:
    assert answer.is_error is True
    content = structured(answer)
    assert "error" not in content, content  # not dressed as a validation refusal
    assert content["api_error"]["code"] == code, content
    assert "field" not in content["api_error"], content


@pytest.mark.parametrize("mode", MODES)
async def test_query_pending_reaches_the_agent(
    tmp_path: Path, remotes: Remotes, token: str, mode: str
) -> None:
    async with HostileServer.running(PaymentsApi().script) as srv:
        targets = reconcile_target(srv.url, approval={"methods": ["GET"], "wait": "0s"})
        async with _session(mode, tmp_path, targets, remotes, token) as mcp:
            iid = structured(await mcp.call("http_request", CHARGE))["invocation_id"]
            first = structured(await mcp.call("reconcile_query", {"invocation_id": iid}))
            assert first["query"]["error"]["code"] == "APPROVAL_PENDING", first
            _refused(await mcp.call("reconcile_query", {"invocation_id": iid}), "QUERY_PENDING")
    assert [r.method for r in srv.requests] == ["POST"]  # the query was never sent


@pytest.mark.parametrize("mode", MODES)
async def test_batch_not_atomic_reaches_the_agent(
    tmp_path: Path, remotes: Remotes, token: str, mode: str
) -> None:
    seen: list[str] = []
    async with HostileServer.running(_cut_then_absent(seen)) as srv:
        targets = {"bulk": http_target(srv.url, batch=BATCH, reconcile=RECONCILE)}
        async with _session(mode, tmp_path, targets, remotes, token) as mcp:
            sent = structured(await mcp.call("http_request", BATCH_CALL))
            assert sent["error"]["outcome"] == "unknown", sent
            answer = await mcp.call("reconcile_query", {"invocation_id": sent["invocation_id"]})
            _refused(answer, "BATCH_NOT_ATOMIC")
    assert seen == ["POST"]


@pytest.mark.parametrize("mode", MODES)
async def test_poll_pending_reaches_the_agent(
    tmp_path: Path, remotes: Remotes, token: str, mode: str
) -> None:
    async with HostileServer.running(scripts.serve(job_api(["done"]))) as srv:
        approval = {"methods": ["GET"], "wait": "0s"}
        targets = {"jobs": http_target(srv.url + "/v1", **JOBS, approval=approval)}
        async with _session(mode, tmp_path, targets, remotes, token) as mcp:
            op_id = structured(await mcp.call("http_request", SUBMIT))["operation"]["id"]
            first = structured(await mcp.call("poll_operation", {"operation_id": op_id}))
            assert first["poll"]["error"]["code"] == "APPROVAL_PENDING", first
            _refused(await mcp.call("poll_operation", {"operation_id": op_id}), "POLL_PENDING")
    assert [r.method for r in srv.requests] == ["POST"]  # the poll was never sent
