"""The MCP read tools (the embedded server, a real ``affidavit mcp`` process) read only
invocations on a target the caller may call -- one the configuration names: an invocation on a
target removed from it answers exactly as an unknown id does (INVALID_FIELD at
``invocation_id``, the same words) from ``fetch_result`` and ``get_record``, and
``list_actions`` neither lists nor counts it, so it can be neither read nor probed for
(tests/daemon/test_fetch_by_target.py through the daemon's socket)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.broker.helpers import TOKEN_ENV, http_target, write_config
from tests.daemon.test_fetch_by_target import BODY, SESSION, made_on_two_targets, unknown_like
from tests.daemon.test_hidden_ids import OPERATIONS, jobs, made_on_removed_targets
from tests.http.hostile import HostileServer, Reply, scripts

from .kit import connected, env_without_secrets, structured


async def test_fetch_result_of_a_target_no_longer_configured_is_an_unknown_id(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)  # the embedded calls' credential
    async with HostileServer.running(scripts.serve(Reply(200, body=BODY))) as srv:
        both = {"api": http_target(srv.url), "old": http_target(srv.url)}
        kept, old = await made_on_two_targets(write_config(tmp_path, both))
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})  # "old" removed
        env = env_without_secrets(**{TOKEN_ENV: token})
        async with connected(["--config", str(cfg)], env, tmp_path / "mcp.log") as mcp:
            answers = {
                (tool, iid): structured(await mcp.call(tool, {"invocation_id": iid}))
                for tool in ("fetch_result", "get_record")
                for iid in (kept, old, unknown_like(old))
            }
            listed = [
                structured(await mcp.call("list_actions", {"session": SESSION, **more}))
                for more in ({}, {"outcome": "committed"})
            ]
    assert answers["fetch_result", kept]["result"]["status"] == 200, answers
    assert answers["get_record", kept]["record"]["invocation_id"] == kept, answers
    for tool in ("fetch_result", "get_record"):
        refused = answers[tool, old]
        assert (refused["error"]["code"], refused["error"]["field"]) == (
            "INVALID_FIELD",
            "invocation_id",
        ), refused
        assert BODY.decode() not in str(refused)
        assert refused == answers[tool, unknown_like(old)]
    for page in listed:
        assert [a["invocation_id"] for a in page["actions"]] == [kept], page
        assert (page["total"], page["truncated"]) == (1, False), page
        assert old not in str(page)


async def test_reconcile_query_and_poll_of_a_hidden_id_answer_as_an_unknown_one(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The embedded server's reconcile_query and poll_operation (the daemon's routes behind the
    # proxy: tests/daemon/test_hidden_ids.py): an invocation or a job on a removed target is
    # answered exactly as an id that names nothing -- not NOT_UNKNOWN, NO_QUERY nor the ended
    # job whole.
    monkeypatch.setenv(TOKEN_ENV, token)  # the embedded calls' credential
    async with (
        HostileServer.running(scripts.serve(jobs)) as srv,
        HostileServer.running(scripts.apply_then_close()) as dropper,
    ):
        every = {
            "api": http_target(srv.url),
            "old": http_target(srv.url, operations=OPERATIONS),
            "gone": http_target(dropper.url),
        }
        ids = await made_on_removed_targets(write_config(tmp_path, every))
        sent = len(srv.requests), len(dropper.requests)
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})  # "old" and "gone" removed
        env = env_without_secrets(**{TOKEN_ENV: token})
        iid, op = unknown_like(ids["committed"]), unknown_like(ids["ended"])
        asked = {"committed": iid, "unknown": iid, "ended": op, "pending": op}
        async with connected(["--config", str(cfg)], env, tmp_path / "mcp.log") as mcp:
            answers = {}
            for name in ("committed", "unknown", "made-up invocation"):
                arguments = {"invocation_id": ids.get(name, iid)}
                answers[name] = structured(await mcp.call("reconcile_query", arguments))
            for name in ("ended", "pending", "made-up operation"):
                arguments = {"operation_id": ids.get(name, op)}
                answers[name] = structured(await mcp.call("poll_operation", arguments))
        assert (len(srv.requests), len(dropper.requests)) == sent  # nothing sent for them
    assert answers["made-up invocation"]["error"]["field"] == "invocation_id", answers
    assert answers["made-up operation"]["error"]["field"] == "operation_id", answers
    for name, made_up in asked.items():
        unknown = answers["made-up invocation" if made_up == iid else "made-up operation"]
        assert answers[name] == json.loads(json.dumps(unknown).replace(made_up, ids[name]))
