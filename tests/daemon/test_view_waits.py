"""A view waits a bounded time, then is answered 503 ``JOURNAL_READ_DECLINED`` with
``Retry-After`` -- never parked for as long as something else holds what it waits for:

- the database holding its read (a lock another session holds: the view reader's
  ``lock_timeout``, ``readers.VIEW_WAIT``) -- the record route waited as long as the lock was
  held (``test_view_read_stuck``: a row-level security gate on one invocation's events);
- every view thread a caller may use busy (its slow views holding its share of
  ``VIEW_THREADS``: half, ``shares.FairShare``): a record view waited for one on the event
  loop as long as they read;
- the kept views' turn held by another's fold: a sessions view waited as long.

The daemon runs in this process (``Daemon.run``) with the bound lowered; the caller is on its
real socket."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import trio

import affidavit.api.readers
from affidavit.api.client import Client
from affidavit.daemon.app import VIEW_THREADS
from affidavit.journal import Journal, JournalReader, SessionSummary
from tests.broker.helpers import TOKEN_ENV
from tests.http.hostile import Reply, scripts
from tests.postgres import Cluster

from .kit import WAIT, ask, in_process
from .test_view_read_stuck import GET, _held, _keys, _waiting, gated_journal

BOUND = 0.5
"""The daemon's ``VIEW_WAIT`` here."""
SHARE = VIEW_THREADS // 2
"""The view threads one uid that is not an operator may hold (``Api.view_share``)."""


def _declined(answer: tuple[int, dict[str, str], bytes], words: str) -> None:
    status, headers, body = answer
    assert status == 503, answer
    assert headers.get("retry-after") == "1", headers
    error = json.loads(body)["api_error"]
    assert error["code"] == "JOURNAL_READ_DECLINED", error
    assert words in error["message"], error
    assert "Traceback" not in error["message"]


async def test_a_record_read_the_database_holds_is_declined_after_the_bound(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)
    monkeypatch.setattr(affidavit.api.readers, "VIEW_WAIT", BOUND)
    async with Journal.open(pg_url, **_keys(tmp_path, "owner")):
        pass  # the schema, created by its owner
    database, journal = gated_journal(pg, pg_url, tmp_path)
    async with (
        in_process(tmp_path, scripts.serve(Reply(200, body=b"ok")), journal=journal) as (_, socket),
        Client.open(socket) as client,
    ):
        with trio.fail_after(WAIT):
            gated = str((await client.call(GET))["invocation_id"])
            await client.call(GET)  # (the chain's head is not the gated invocation's)
        pg.sql("INSERT INTO gated VALUES (%s)", database, (gated,))
        with _held(pg_url):
            # (held past the bound many times over: a read that waits on is never answered)
            with trio.fail_after(WAIT):
                answer = await ask(socket, "GET", f"/v1/invocations/{gated}")
                left = await trio.to_thread.run_sync(_waiting, pg_url)
        _declined(answer, "lock timeout")
        assert left == 0  # the read gave the lock up: no session still waits on it
        with trio.fail_after(WAIT):  # the lock let go: the same read answers
            status, _, body = await ask(socket, "GET", f"/v1/invocations/{gated}")
        assert status == 200, body
        assert json.loads(body)["record"]["invocation_id"] == gated


async def test_views_that_find_every_view_thread_or_the_kept_turn_busy_are_declined(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)
    monkeypatch.setattr(affidavit.api.readers, "VIEW_WAIT", BOUND)
    inside, release = threading.Semaphore(0), threading.Event()
    real_iter = JournalReader.iter_actions

    def held_iter(self: JournalReader, *a: Any, **k: Any) -> Any:
        # A caller's page of one session streams the session (views.records.newest_page).
        inside.release()
        assert release.wait(WAIT)  # bounded: held until the test has its answers
        return real_iter(self, *a, **k)

    real_build = SessionSummary._build

    def held_build(self: SessionSummary, *a: Any, **k: Any) -> Any:
        inside.release()
        assert release.wait(WAIT)
        return real_build(self, *a, **k)

    answers: list[tuple[int, dict[str, str], bytes]] = []
    async with (
        in_process(tmp_path, scripts.serve(Reply(200, body=b"ok"))) as (_, socket),
        Client.open(socket) as client,
    ):
        with trio.fail_after(WAIT):
            iid = str((await client.call(GET))["invocation_id"])
        monkeypatch.setattr(JournalReader, "iter_actions", held_iter)
        monkeypatch.setattr(SessionSummary, "_build", held_build)

        async def one(path: str) -> None:
            answers.append(await ask(socket, "GET", path))

        try:
            async with trio.open_nursery() as holders:
                # The kept views' fold holds the turn (its own thread); slow pages this uid's
                # share of the others.
                holders.start_soon(one, "/v1/sessions")
                for _ in range(SHARE):
                    holders.start_soon(one, "/v1/actions?session=s")
                with trio.fail_after(WAIT):
                    for _ in range(SHARE + 1):  # each held (bounded: a miss fails, never hangs)
                        assert await trio.to_thread.run_sync(lambda: inside.acquire(timeout=WAIT))
                    record = await ask(socket, "GET", f"/v1/invocations/{iid}")
                    sessions = await ask(socket, "GET", "/v1/sessions")
                    envelope = await client.call(GET)  # the calls run meanwhile
                release.set()
        finally:
            release.set()
    _declined(record, "every view thread this uid may use stayed busy")
    _declined(sessions, "the kept views' turn stayed busy")
    assert envelope["result"]["status"] == 200, envelope
    assert sorted(status for status, _, _ in answers) == [200] * (SHARE + 1), answers
