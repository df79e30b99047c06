"""The MCP read tools (the embedded server, a real ``affidavit mcp`` process) read only
invocations on a target the caller may call -- one the configuration names: an invocation on a
target removed from it answers exactly as an unknown id does (INVALID_FIELD at
``invocation_id``, the same words) from ``fetch_result`` and ``get_record``, and
``list_actions`` neither lists nor counts it, so it can be neither read nor probed for
(tests/daemon/test_fetch_by_target.py through the daemon's socket)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from tests.broker.helpers import TOKEN_ENV, http_target, write_config
from tests.daemon.kit import running_daemon
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


@pytest.mark.parametrize("how", ["embedded", "proxied"])
async def test_reconcile_query_and_poll_of_a_hidden_id_answer_as_an_unknown_one(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    # The embedded server's tools and ``affidavit mcp --socket`` (the daemon's routes behind
    # the proxy: tests/daemon/test_hidden_ids.py asks them over HTTP): an invocation or a job on
    # a removed target is answered exactly as an id that names nothing -- not NOT_UNKNOWN,
    # NO_QUERY, the ended job whole, the record nor the result.
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
        kept = {"api": http_target(srv.url)}  # "old" and "gone" removed
        iid, op = unknown_like(ids["committed"]), unknown_like(ids["ended"])
        asked = {"committed": iid, "unknown": iid, "ended": op, "pending": op}
        async with contextlib.AsyncExitStack() as stack:
            if how == "embedded":
                args = ["--config", str(write_config(tmp_path, kept))]
                env = env_without_secrets(**{TOKEN_ENV: token})
            else:
                daemon = await stack.enter_async_context(
                    running_daemon(tmp_path, kept, token=token)
                )
                args, env = ["--socket", str(daemon.socket)], env_without_secrets()
            mcp = await stack.enter_async_context(connected(args, env, tmp_path / "mcp.log"))
            answers = {}
            for name in ("committed", "unknown", "made-up invocation"):
                for tool in ("reconcile_query", "get_record", "fetch_result"):
                    arguments = {"invocation_id": ids.get(name, iid)}
                    answers[name, tool] = structured(await mcp.call(tool, arguments))
            for name in ("ended", "pending", "made-up operation"):
                arguments = {"operation_id": ids.get(name, op)}
                answers[name, "poll_operation"] = structured(
                    await mcp.call("poll_operation", arguments)
                )
        assert (len(srv.requests), len(dropper.requests)) == sent  # nothing sent for them
    assert answers["made-up invocation", "get_record"]["error"]["field"] == "invocation_id"
    assert answers["made-up operation", "poll_operation"]["error"]["field"] == "operation_id"
    for (name, tool), answer in answers.items():
        if name in asked:
            made_up = asked[name]
            unknown = "made-up invocation" if made_up == iid else "made-up operation"
            shown = json.loads(json.dumps(answers[unknown, tool]).replace(made_up, ids[name]))
            assert answer == shown, (name, tool, answer)
