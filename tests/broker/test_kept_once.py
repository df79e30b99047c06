"""The result's kept streams are joined once, and only when read (``engine/delivery.py``): a
call whose result nothing reads before the commit -- a kind without result contracts
(``engine.contracts.reader`` None: SSH; here an HTTP call given none, so no sshd is needed)
-- joins them after the commit, and not at all when the commit fails (RESULT_STORE_FAILED)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.engine import invocation
from affidavit.engine.sink import StreamSink
from affidavit.journal import ResultStoreFailed
from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import TOKEN_ENV, http_target, open_broker, write_config

GET = {"target": "api", "method": "GET", "path": "/"}


async def _call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail: bool
) -> tuple[list[str], dict[str, Any]]:
    said: list[str] = []
    kept = StreamSink.kept

    def counted(self: StreamSink) -> Any:
        said.append("kept")
        return kept(self)

    monkeypatch.setattr(StreamSink, "kept", counted)
    monkeypatch.setattr(invocation, "reader", lambda action, target: None)
    async with HostileServer.running(scripts.serve(Reply(200, body=b"x" * 32))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as broker:
            commit = broker.journal.commit_result

            async def committing(event: Any, **kwargs: Any) -> Any:
                said.append("commit")
                if fail:
                    raise ResultStoreFailed("injected: the disk is full")
                return await commit(event, **kwargs)

            monkeypatch.setattr(broker.journal, "commit_result", committing)
            with trio.fail_after(10):
                env = await broker.call(GET)
    said.append(env.get("error", {}).get("code") or "ok")
    return said, env


def test_a_plain_results_streams_are_joined_once_after_its_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, "tok-kept-once-0123")
    said, env = trio.run(_call, tmp_path, monkeypatch, False)
    assert said == ["commit", "kept", "ok"]
    # Joined after the commit, the envelope's inline result is still the 32 bytes served.
    assert env["result"]["body"] == "x" * 32, env["result"]


def test_a_result_whose_commit_fails_joins_no_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, "tok-kept-once-0123")
    said, env = trio.run(_call, tmp_path, monkeypatch, True)
    assert said == ["commit", "RESULT_STORE_FAILED"]
    assert "result" not in env, env
