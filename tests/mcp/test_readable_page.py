"""MCP's ``list_actions`` embedded (``backends.Embedded.actions``) over a journal where
invocations sit on a target the configuration no longer names: the filtered view's page and
count, read from the backend's own kept summary and the rows of the records shown -- never a
stream of the journal per request (tests/daemon/test_readable_page.py through the daemon)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

import affidavit.views
from affidavit.mcp.backends import Embedded
from tests.broker.helpers import TOKEN_ENV, http_target, write_config
from tests.daemon.test_readable_page import made_on_a_removed_target, refuse_streams_in, streamed
from tests.http.hostile import HostileServer, Reply, scripts

from .kit import WAIT


async def test_list_actions_with_invocations_on_a_removed_target_is_read_from_a_kept_summary(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)
    journal = await made_on_a_removed_target(tmp_path)
    asks = [(None, 10), (None, 2), ("s1", 1), ("s2", 10)]
    expected = [streamed(journal, limit, session) for session, limit in asks]
    assert expected[1]["truncated"] and expected[1]["total"] == 4
    refuse_streams_in(monkeypatch, affidavit.views)  # (``Embedded.actions`` imports it there)
    answers = []
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})  # "old" removed
        with trio.fail_after(WAIT):
            async with Embedded.open(str(cfg)) as backend:
                for session, limit in asks:  # (the whole page first: kept from then on)
                    page = await backend.actions(session, None, limit)
                    assert all(a["target"] == "api" for a in page["actions"]), page
                    ids = [a["invocation_id"] for a in page["actions"]]
                    answers.append(
                        {"ids": ids, "total": page["total"], "truncated": page["truncated"]}
                    )
    assert answers == expected
