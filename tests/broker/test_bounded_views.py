"""The views an agent can make grow -- every refused call is a record -- are read as streams:
MCP ``list_actions`` (embedded), the metrics, the console's actions and approvals pages and the
approvals list never load the whole actions view (``list_actions``, ``views.fold``), they keep
a page (``views.Newest``) or counts.  The daemon's ``/v1/actions`` and ``/v1/metrics`` are
tested through a real daemon (tests/daemon/test_calls.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

import pytest

from affidavit.approvals import pending
from affidavit.console import pages
from affidavit.journal import JournalReader, SessionSummary
from affidavit.journal import views as journal_views
from affidavit.mcp.backends import Embedded
from affidavit.views import actions_page, metrics, metrics_key
from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import http_target, open_broker, write_config

OK = Reply(200, body=b'{"ok": true}')


def _whole(*args: Any, **kwargs: Any) -> NoReturn:
    raise AssertionError("the whole actions view was loaded into memory")


async def test_the_views_stream_and_keep_a_page(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with HostileServer.running(scripts.serve(OK)) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as b:
            action = {"target": "api", "method": "GET", "path": "/"}
            ids = [(await b.call({**action, "session": "s"}))["invocation_id"] for _ in range(4)]
            monkeypatch.setattr(JournalReader, "list_actions", _whole)
            monkeypatch.setattr(journal_views, "fold", _whole)
            listed = await Embedded(b).actions("s", None, 2)
            assert [a["invocation_id"] for a in listed["actions"]] == ids[-2:]
            assert (listed["total"], listed["truncated"]) == (4, True)
            assert metrics(b.journal.iter_actions())["invocations"] == 4
            page = pages.actions_page(b.journal, pages.ActionFilters())
            assert page["total"] == 4 and len(page["rows"]) == 4
            assert pending(b.journal) == []
            assert pages.approvals_page(b.journal) == {"rows": [], "total": 0}


async def test_a_page_of_the_newest_actions_reads_no_other_record(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page without a filter on what a record says (``views.actions_page``) reads the page
    alone, never the whole view folded (``fold_each``): the rows of the records shown and a
    count (``newest_actions``).  Filtered by outcome, the page is still cut from the stream,
    every match counted.  MCP ``list_actions`` holds only invocations on configured targets
    (``readable``): embedded it keeps no summary, and a session's page streams the session
    alone, never the whole journal folded for it (tests/mcp/test_readable_page.py) -- never a
    page that lists another target's."""
    async with HostileServer.running(scripts.serve(OK)) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as b:
            action = {"target": "api", "method": "GET", "path": "/"}
            ids = [(await b.call({**action, "session": "s"}))["invocation_id"] for _ in range(3)]
            other = (await b.call({**action, "session": "t"}))["invocation_id"]
            listed = await Embedded(b).actions("s", None, 2)
            assert [a["invocation_id"] for a in listed["actions"]] == ids[-2:]
            assert (listed["total"], listed["truncated"]) == (3, True)
            monkeypatch.setattr(journal_views, "fold_each", _whole)
            monkeypatch.setattr(journal_views, "fold", _whole)
            page = actions_page(b.journal, 2)
            assert [r.invocation_id for r in page.records] == [ids[-1], other]
            assert (page.total, page.truncated) == (4, True)
            with pytest.raises(AssertionError, match="whole actions view"):
                actions_page(b.journal, 2, outcome="committed")
            monkeypatch.undo()
            page = actions_page(b.journal, 2, outcome="committed")
            assert [r.invocation_id for r in page.records] == [ids[-1], other]
            assert (page.total, page.truncated) == (4, True)


async def test_the_consoles_unfiltered_actions_page_reads_no_whole_fold_after_the_first(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The console's actions page without a filter (issue 15): its counts are the kept
    tallies (``SessionSummary``) and its rows the page alone -- after the summary's first
    fold, a request folds only what was appended since, never the whole view; the counts
    are a full fold's.  Filtered, it still folds every match."""
    async with HostileServer.running(scripts.serve(OK)) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as b:
            action = {"target": "api", "method": "GET", "path": "/"}
            await b.call({**action, "session": "s"})
            summary = SessionSummary(metrics_key)
            first = pages.actions_page(b.journal, pages.ActionFilters(), summary)
            assert first["total"] == 1
            ids = [(await b.call({**action, "session": "s"}))["invocation_id"] for _ in range(2)]
            monkeypatch.setattr(journal_views, "fold_each", _whole)
            page = pages.actions_page(b.journal, pages.ActionFilters(), summary)
            assert page["total"] == 3 and [r["invocation_id"] for r in page["rows"][:2]] == [
                ids[1],
                ids[0],
            ]
            with pytest.raises(AssertionError, match="whole actions view"):
                pages.actions_page(b.journal, pages.ActionFilters(session="s"), summary)
            monkeypatch.undo()
            full = pages.actions_page(b.journal, pages.ActionFilters())
            assert (page["matrix"], page["total"]) == (full["matrix"], full["total"])
