"""The MCP read tools (the embedded server, a real ``affidavit mcp`` process) read only
invocations on a target the caller may call -- one the configuration names: an invocation on a
target removed from it answers exactly as an unknown id does (INVALID_FIELD at
``invocation_id``, the same words) from ``fetch_result`` and ``get_record``, and
``list_actions`` neither lists nor counts it, so it can be neither read nor probed for
(tests/daemon/test_fetch_by_target.py through the daemon's socket)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.broker.helpers import TOKEN_ENV, http_target, write_config
from tests.daemon.test_fetch_by_target import BODY, SESSION, made_on_two_targets, unknown_like
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
