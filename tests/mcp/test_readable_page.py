"""MCP's ``list_actions`` embedded over a journal where invocations sit on a target the
configuration no longer names: the filtered view's page and count of the session -- the
connection's by default, as the tool always names one (``McpSession.answer``) -- read by
streaming that session alone, never the whole journal (the embedded backend keeps no view:
its first fold would be the whole journal's, for a list of one session).  Through the daemon,
``tests/daemon/test_readable_page.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from affidavit.journal.sqlite import SqliteTables
from affidavit.mcp.backends import Embedded
from affidavit.mcp.server import McpSession
from affidavit.mcp.transport import StdioTransport
from tests.broker.helpers import TOKEN_ENV, http_target, write_config
from tests.daemon.test_readable_page import made_on_a_removed_target, streamed
from tests.http.hostile import HostileServer, Reply, scripts

from .kit import WAIT


def folds_recorded(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """The sessions whose events are folded from now on (``Tables.grouped_events``: None, the
    whole journal -- as a kept view's first fold reads it)."""
    folded: list[str | None] = []
    kind = SqliteTables
    real = kind.grouped_events

    def grouped_events(self: Any, session: str | None = None) -> Any:
        folded.append(session)
        return real(self, session)

    monkeypatch.setattr(kind, "grouped_events", grouped_events)
    return folded


async def test_list_actions_with_invocations_on_a_removed_target_streams_the_session_alone(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)
    journal = await made_on_a_removed_target(tmp_path)
    asks: list[dict[str, Any]] = [{}, {"limit": 1}, {"session": "s2"}, {"limit": 2}]
    sessions = ["s1", "s1", "s2", "s1"]  # (the connection's is s1)
    limits = [10, 1, 10, 2]
    expected = [streamed(journal, n, s) for s, n in zip(sessions, limits, strict=True)]
    assert expected[1]["truncated"] and expected[0]["total"] == 2
    answers = []
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})  # "old" removed
        with trio.fail_after(WAIT):
            async with Embedded.open(str(cfg)) as backend:
                ours, _theirs = trio.testing.memory_stream_pair()
                mcp = McpSession(backend, StdioTransport(ours, ours), "s1")
                folded = folds_recorded(monkeypatch)
                for n, ask in enumerate(asks):
                    args = {"session": None, "outcome": None, "limit": 10, **ask}
                    page = await mcp.answer(n, "list_actions", args)
                    assert page["session"] == sessions[n], page
                    assert all(a["target"] == "api" for a in page["actions"]), page
                    ids = [a["invocation_id"] for a in page["actions"]]
                    answers.append(
                        {"ids": ids, "total": page["total"], "truncated": page["truncated"]}
                    )
    assert answers == expected
    assert folded == sessions  # each page its session's events, never the whole journal's
