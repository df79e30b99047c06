"""A caller flooding the views while the kept summary's first fold runs (~20 s at 1M events)
does not tie up the daemon's threads: the views that need the summary take turns on the event
loop (one thread waits on the fold, not one per request), every view reads in one of the views'
own ``VIEW_THREADS`` (never trio's default threads, which the calls' journal opens share), and a
call still completes meanwhile.

The daemon runs in this process (``Daemon.run``, as ``affidavit serve`` runs it) so that the
fold and a view can be held (bounded); the caller is on its real socket."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

import affidavit.api.readers
from affidavit.api.broker import Broker
from affidavit.api.client import Client
from affidavit.daemon.app import VIEW_THREADS
from affidavit.journal import JournalReader, SessionSummary
from tests.broker.helpers import TOKEN_ENV
from tests.http.hostile import Reply, scripts

from .kit import WAIT, in_process

FLOOD = 8
"""Requests of each kind sent while the fold is held."""


class _Gauge:
    """How many threads are inside something at once, and the most there were."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = self.peak = 0

    @contextlib.contextmanager
    def inside(self) -> Iterator[None]:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
        try:
            yield
        finally:
            with self.lock:
                self.now -= 1


async def _get(socket: Path, path: str) -> tuple[int, bytes]:
    """One GET on its own connection (no thread of this process: trio's own socket)."""
    stream = await trio.open_unix_socket(str(socket))
    async with stream:
        await stream.send_all(
            f"GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".encode()
        )
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


async def test_a_flood_of_views_during_the_first_fold_holds_few_threads_and_calls_run(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)
    # The flood waits while the fold is held, however loaded the machine: not declined here.
    monkeypatch.setattr(affidavit.api.readers, "VIEW_WAIT", 3 * WAIT)
    folding, release = threading.Event(), threading.Event()
    readers, in_summary = _Gauge(), _Gauge()

    real_build = SessionSummary._build

    def held_build(self: SessionSummary, *a: Any, **k: Any) -> Any:
        folding.set()
        assert release.wait(WAIT)  # bounded: the fold is held until the flood is in
        return real_build(self, *a, **k)

    monkeypatch.setattr(SessionSummary, "_build", held_build)
    for name in ("summarized_sessions", "summarized_session_page", "summarized_tallies"):
        real = getattr(JournalReader, name)

        def counted(self: JournalReader, *a: Any, _real: Any = real, **k: Any) -> Any:
            with in_summary.inside():  # (waiting on the summary's lock is inside it)
                return _real(self, *a, **k)

        monkeypatch.setattr(JournalReader, name, counted)

    # A session's page while nothing is kept streams the session (it needs no summary): held
    # as long, where it starts (``views.actions_page`` asks the summary for the page first).
    real_page, holding = JournalReader.newest_readable, _Gauge()

    def held_page(self: JournalReader, *a: Any, **k: Any) -> Any:
        with holding.inside():
            assert release.wait(WAIT)
        return real_page(self, *a, **k)

    monkeypatch.setattr(JournalReader, "newest_readable", held_page)
    real_view = Broker.view

    async def counted_view(self: Broker, read: Callable[[JournalReader], Any], *a: Any) -> Any:
        def inside(reader: JournalReader) -> Any:
            with readers.inside():  # one per view thread
                return read(reader)

        return await real_view(self, inside, *a)

    monkeypatch.setattr(Broker, "view", counted_view)
    answers: list[tuple[int, bytes]] = []
    default = trio.to_thread.current_default_thread_limiter()
    async with in_process(tmp_path, scripts.serve(Reply(200, body=b"ok"))) as (_, socket):
        with trio.fail_after(WAIT):
            async with Client.open(socket) as client:
                await client.call({"target": "api", "method": "GET", "path": "/r"})

                async def one(path: str) -> None:
                    answers.append(await _get(socket, path))

                async with trio.open_nursery() as flood:
                    for n in range(FLOOD):
                        flood.start_soon(one, "/v1/sessions")
                        flood.start_soon(one, f"/v1/metrics?since={n}")
                        flood.start_soon(one, "/v1/actions?session=s")
                    while not folding.is_set():
                        await trio.sleep(0.01)
                    await trio.sleep(0.5)  # (the flood is in: each request has been read)
                    borrowed = default.borrowed_tokens
                    # A call completes while the fold and the views are held.
                    envelope = await client.call({"target": "api", "method": "GET", "path": "/r"})
                    assert envelope["result"]["status"] == 200, envelope
                    assert (await client.health())["ok"] is True
                    held = (in_summary.peak, readers.peak, holding.now)
                    release.set()
    assert len(answers) == 3 * FLOOD
    assert all(status == 200 for status, _ in answers), answers
    assert all(json.loads(body)["total"] == 1 for status, body in answers if b'"sessions"' in body)
    # One thread waited on the fold, not one per request; the views held their own threads,
    # at most VIEW_THREADS of them, none of trio's default ones.
    assert held[0] == 1, held
    assert held[1] <= VIEW_THREADS, held
    assert held[2] >= 1, held  # (the pages were held in their threads meanwhile)
    assert borrowed == 0, borrowed
