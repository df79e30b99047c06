"""The query form of reconciliation as an MCP tool (issue 12): an agent may ask the broker to run
the target's configured reconciliation query -- a read of the remote -- but no tool approves,
denies or attests (DESIGN: "an MCP tool never approves or attests")."""

from __future__ import annotations

import contextlib
import inspect
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from affidavit.config import load_config
from affidavit.mcp.tools import READ_TOOLS
from affidavit.protocols.catalog import catalog
from affidavit.reconcile import refusals
from tests.broker.approvalkit import PaymentsApi, approval_config, reconcile_target
from tests.broker.helpers import TOKEN_ENV, write_config
from tests.daemon.kit import running_daemon
from tests.http.hostile import HostileServer

from .kit import Connected, connected, env_without_secrets, structured


@contextlib.asynccontextmanager
async def _mcp(mode: str, tmp: Path, url: str, token: str) -> AsyncIterator[Connected]:
    log = tmp / "mcp.log"
    if mode == "embedded":
        cfg = write_config(tmp, reconcile_target(url))
        env = env_without_secrets(**{TOKEN_ENV: token})
        async with connected(["--config", str(cfg)], env, log) as mcp:
            yield mcp
        return
    async with (
        running_daemon(tmp, reconcile_target(url), token=token) as daemon,
        connected(["--socket", str(daemon.socket)], env_without_secrets(), log) as mcp,
    ):
        yield mcp


@pytest.mark.parametrize("mode", ["embedded", "daemon"])
async def test_an_agent_reconciles_by_query_and_no_tool_speaks_for_an_operator(
    tmp_path: Path, token: str, mode: str
) -> None:
    api = PaymentsApi()
    async with (
        HostileServer.running(api.script) as srv,
        _mcp(mode, tmp_path, srv.url, token) as mcp,
    ):
        names = {t.name for t in (await mcp.session.list_tools()).tools}
        assert "reconcile_query" in names
        assert not any(w in n for n in names for w in ("approv", "deny", "attest"))
        [tool] = [t for t in (await mcp.session.list_tools()).tools if t.name == "reconcile_query"]
        assert set(tool.input_schema["properties"]) == {"invocation_id"}

        action = {
            "target": "api",
            "method": "POST",
            "path": "/v1/charges",
            "body": json.dumps({"drop": True}),
            "idempotency_key": "mcp-1",
        }
        sent = structured(await mcp.call("http_request", action))
        assert sent["error"]["outcome"] == "unknown"
        iid = sent["invocation_id"]

        result = await mcp.call("reconcile_query", {"invocation_id": iid})
        answer = structured(result)
        assert result.is_error is False
        assert answer["reconciled"] is True
        assert answer["envelope"]["evidence"]["source"] == "remote_query"
        assert answer["envelope"]["evidence"]["outcome"] == "committed"
        assert answer["query"]["result"]["status"] == 200
        # The query's result reached the agent in this answer, written whole: delivered once,
        # by that write (``deliver``) -- not when its envelope came back in-process.
        assert await _deliveries(mcp, answer["query"]["invocation_id"]) == [
            ("RESULT_DELIVERED", "deliver")
        ]

        # A query that settles nothing (a 500): still unknown, flagged as an error.
        boom = structured(await mcp.call("http_request", {**action, "idempotency_key": "boom"}))
        unsettled = await mcp.call("reconcile_query", {"invocation_id": boom["invocation_id"]})
        assert unsettled.is_error is True
        assert structured(unsettled)["envelope"]["error"]["outcome"] == "unknown"

        again = await mcp.call("reconcile_query", {"invocation_id": iid})
        refused = structured(again)
        assert again.is_error is True
        assert refused["api_error"]["code"] == "NOT_UNKNOWN", refused  # the daemon's code
    assert [r.method for r in srv.requests] == ["POST", "GET", "POST", "GET"]  # each sent once


async def _deliveries(mcp: Connected, iid: str) -> list[tuple[str, object]]:
    """``iid``'s delivery events, once one is on record (bounded)."""
    with trio.fail_after(20):
        while True:
            events = structured(await mcp.call("get_record", {"invocation_id": iid}))["events"]
            found = [(e["kind"], e["attrs"].get("channel")) for e in events]
            found = [k for k in found if k[0].startswith("RESULT_DELIVER")]
            if found:
                return found
            await trio.sleep(0.05)


def test_list_targets_says_which_targets_wait_for_a_human_and_which_reconcile_by_query(
    tmp_path: Path,
) -> None:
    """An agent plans for APPROVAL_PENDING and for settling an ``unknown`` from what
    list_targets (and the daemon's /v1/catalog, the same function) says of each target."""
    approval = {"methods": ["POST", "DELETE"], "ttl": "15m", "wait": "2s"}
    cfg = load_config(
        approval_config(tmp_path, "http://127.0.0.1:9", approval=approval, **_RECONCILE)
    )
    [entry] = catalog(cfg.targets, cfg.descriptions)["targets"]
    assert entry["approval"] == {"methods": ["DELETE", "POST"], "ttl": 900.0, "wait": 2.0}
    assert entry["reconcile_query"] is True

    always = load_config(approval_config(tmp_path, "http://127.0.0.1:9", name="always.toml"))
    [entry] = catalog(always.targets, always.descriptions)["targets"]
    assert entry["approval"]["always"] is True and entry["reconcile_query"] is False

    plain = load_config(write_config(tmp_path, reconcile_target("http://127.0.0.1:9"), name="p"))
    [entry] = catalog(plain.targets, plain.descriptions)["targets"]
    assert entry["approval"] is None and entry["reconcile_query"] is True
    assert "env:" not in json.dumps(entry)


_RECONCILE = reconcile_target("http://127.0.0.1:9")["api"]
_RECONCILE = {k: _RECONCILE[k] for k in ("idempotency", "reconcile")}


def test_the_reconcile_query_tool_names_every_code_a_refused_query_answers() -> None:
    # The codes ``refusals.refusal`` answers (``OperatorError("CODE", ...)``), read from its
    # source: the tool's text an agent reads must name each, ROW_REFUSED included.
    source = inspect.getsource(refusals)
    codes = set(re.findall(r'OperatorError\(\s*"([A-Z_]+)"', source))
    assert {"QUERY_SUPERSEDED", "ROW_REFUSED", "RETRIED_MEANWHILE"} <= codes
    doc = READ_TOOLS["reconcile_query"].doc
    assert [c for c in sorted(codes) if c not in doc] == []
