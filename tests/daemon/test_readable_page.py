"""A caller's ``/v1/actions`` over a journal where invocations sit on a target the
configuration no longer names is the filtered view's page and count -- read from the daemon's
kept summary and the rows of the records shown, not streamed from the whole journal for every
request (issue 15: 21 -> 368 ms at 35k events, ~10 s at 1M, as soon as one such invocation was
there), a session's page too once the summary is kept; ``/v1/sessions`` and ``/v1/metrics``
count what it lists.  The daemon runs in this process (``kit.in_process``) so that a stream of
the journal fails the request."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import trio

import affidavit.daemon.app
from affidavit.daemon.shares import CONSOLE
from affidavit.journal import JournalReader
from affidavit.views import Newest
from tests.broker.helpers import TOKEN_ENV, http_target, open_broker, write_config
from tests.http.hostile import HostileServer, Reply, scripts

from .kit import HUNG, ask, embedded, in_process

PLAN = [
    ("old", "s1"),
    ("api", "s1"),
    ("old", "s2"),
    ("api", "s2"),
    ("old", "s1"),
    ("api", "s1"),
    ("api", "s2"),
    ("old", "s1"),
]
"""The calls made before ``old`` is removed from the configuration: (target, session)."""


async def made_on_a_removed_target(tmp: Path) -> Path:
    """``PLAN``'s calls, embedded, on ``api`` and ``old`` (both answering 200): the journal."""
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        both = {"api": http_target(srv.url), "old": http_target(srv.url)}
        async with open_broker(write_config(tmp, both)) as broker:
            for target, session in PLAN:
                action = {"target": target, "method": "GET", "path": "/x", "session": session}
                with trio.fail_after(HUNG):
                    env = await broker.call(action)
                assert env.get("error") is None, env
    return tmp / "journal.db"


def streamed(journal: Path, limit: int, session: str | None = None) -> dict[str, Any]:
    """The filtered view's page, as a stream of the whole view (of ``session``) would be:
    only records on ``api``, the target the configuration still names."""
    with JournalReader.open(journal) as r:
        rows = (rec for rec in r.iter_actions(session=session) if rec.target == "api")
        page = Newest(limit).take(rows)
    ids = [rec.invocation_id for rec in page.records]
    return {"ids": ids, "total": page.total, "truncated": page.truncated}


def refuse_streams_in(monkeypatch: pytest.MonkeyPatch, module: Any) -> None:
    """``module.actions_page`` (the caller's page) fails if it streams the journal
    (``JournalReader.iter_actions``); other readers (the approvals' watch) stream as ever."""
    inside = threading.local()
    real_page, real_stream = module.actions_page, JournalReader.iter_actions

    def page(*a: Any, **k: Any) -> Any:
        inside.page = True
        try:
            return real_page(*a, **k)
        finally:
            inside.page = False

    def stream(self: JournalReader, *a: Any, **k: Any) -> Any:
        if getattr(inside, "page", False):
            raise AssertionError("the caller's page streamed the journal")
        return real_stream(self, *a, **k)

    monkeypatch.setattr(module, "actions_page", page)
    monkeypatch.setattr(JournalReader, "iter_actions", stream)


async def test_a_callers_page_with_invocations_on_a_removed_target_is_read_from_the_summary(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)
    journal = await made_on_a_removed_target(tmp_path)
    queries = {"": (10, None), "?limit=2": (2, None), "?session=s1&limit=1": (1, "s1")}
    expected = {q: streamed(journal, limit, s) for q, (limit, s) in queries.items()}
    assert expected["?limit=2"]["truncated"] and expected["?limit=2"]["total"] == 4
    refuse_streams_in(monkeypatch, affidavit.daemon.app)
    answers = {}
    async with in_process(tmp_path, scripts.serve(Reply(200, body=b"ok"))) as (_, socket):
        with trio.fail_after(HUNG):
            for query in queries:  # ("" first: the summary is kept from then on)
                status, _h, body = await ask(socket, "GET", f"/v1/actions{query}")
                assert status == 200, body
                page = json.loads(body)
                answers[query] = {
                    "ids": [a["invocation_id"] for a in page["actions"]],
                    "total": page["total"],
                    "truncated": page["truncated"],
                }
                assert all(a["target"] == "api" for a in page["actions"]), page
    assert answers == expected


async def test_a_callers_sessions_and_metrics_leave_out_a_removed_targets_invocations(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``/v1/sessions`` and ``/v1/metrics`` count what ``/v1/actions`` lists (a session
    holding only such invocations is not named); the operator's CLI run embedded counts every
    invocation of the journal, as before."""
    monkeypatch.setenv(TOKEN_ENV, token)
    journal = await made_on_a_removed_target(tmp_path)
    with JournalReader.open(journal) as r:
        records = list(r.iter_actions())
    shown = [rec for rec in records if rec.target == "api"]
    refuse_streams_in(monkeypatch, affidavit.daemon.app)
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        # ("only-old": a session of the removed target's alone)
        both = {"api": http_target(srv.url), "old": http_target(srv.url)}
        async with open_broker(write_config(tmp_path, both)) as broker:
            action = {"target": "old", "method": "GET", "path": "/x", "session": "only-old"}
            with trio.fail_after(HUNG):
                assert (await broker.call(action)).get("error") is None
    answers = {}
    async with in_process(tmp_path, scripts.serve(Reply(200, body=b"ok"))) as (_, socket):
        with trio.fail_after(HUNG):
            for query in (
                "/v1/sessions",
                "/v1/metrics?format=json",
                "/v1/metrics?format=json&session=s1",
            ):
                status, _h, body = await ask(socket, "GET", query)
                assert status == 200, body
                answers[query] = json.loads(body)
        cfg = tmp_path / "affidavit.toml"  # (the daemon's: "old" removed)
        operator = await embedded("metrics", "--json", "--config", str(cfg), token=token)
    sessions = {s["session"]: s["actions"] for s in answers["/v1/sessions"]["sessions"]}
    assert sessions == {"s1": 2, "s2": 2}, answers
    assert answers["/v1/sessions"]["total"] == 2
    assert answers["/v1/metrics?format=json"]["invocations"] == len(shown) == 4
    assert answers["/v1/metrics?format=json&session=s1"]["invocations"] == 2
    assert operator.returncode == 0, operator.stderr
    assert json.loads(operator.stdout)["invocations"] == len(records) + 1 == 9


async def test_only_the_page_that_makes_the_first_fold_takes_the_kept_views_turn(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first unfiltered page folds the whole journal: it takes ``summary_turn`` (one
    thread folds, the rest wait on the event loop).  Once the summary is kept a page does not
    take it -- it answers while another view holds the turn -- so a flood of pages cannot keep
    ``/v1/sessions`` and ``/v1/metrics`` waiting past ``view_wait``."""
    monkeypatch.setenv(TOKEN_ENV, token)
    await made_on_a_removed_target(tmp_path)
    apis: list[affidavit.daemon.app.Api] = []
    turns: list[bool] = []  # the summary's ``kept`` as each turn was taken
    Api = affidavit.daemon.app.Api
    real_init, real_turn = Api.__init__, Api.read_summarized

    def init(self: Any, *a: Any, **k: Any) -> None:
        real_init(self, *a, **k)
        apis.append(self)

    async def turn(self: Any, view: Any, asker: Any) -> Any:
        turns.append(self.summary.kept)
        return await real_turn(self, view, asker)

    monkeypatch.setattr(Api, "__init__", init)
    monkeypatch.setattr(Api, "read_summarized", turn)
    async with in_process(tmp_path, scripts.serve(Reply(200, body=b"ok"))) as (_, socket):
        with trio.fail_after(HUNG):
            status, _h, body = await ask(socket, "GET", "/v1/actions?limit=2")
            assert status == 200, body
            assert turns == [False]  # the first fold took the turn
            (api,) = apis
            assert api.summary.kept
            await api.summary_turn.acquire(CONSOLE, HUNG)  # another's turn, held throughout
            try:
                for query in ("", "?limit=1", "?session=s1&limit=1"):
                    status, _h, body = await ask(socket, "GET", f"/v1/actions{query}")
                    assert status == 200, body
                    assert json.loads(body)["actions"], body
            finally:
                api.summary_turn.release(CONSOLE)
    assert turns == [False]
