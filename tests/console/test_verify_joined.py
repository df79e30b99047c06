"""A press of 'Verify the whole journal now' while a whole verify runs joins it -- one verify at a
time -- and is answered at once (303 to the journal page, which says since when the verify
runs), not when the verify ends (~41 s at 1M events): a joined press held its connection open
that long, so a client pressing again and again held as many connections as presses.  The
press that started the verify is answered at once too (test_verify_background.py).

The console is served in this process as the daemon serves it (a real loopback socket), its
views read in worker threads through the daemon's limiter; the presses are plain HTTP."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.daemon.app import VIEW_THREADS
from affidavit.journal import JournalReader
from tests.broker.helpers import http_target, open_broker

from .kit import get, log_in_to, operator_config, page_line, post, read_in_threads, served, settled

PRESSES = 3 * VIEW_THREADS
BOUND = 10.0
"""Seconds any wait here may take at most: a guard against a hang, never a speed asserted."""


async def test_presses_while_a_whole_verify_runs_are_answered_before_it_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    db = tmp_path / "journal.db"
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        read_in_threads(console, db, limiter=trio.CapacityLimiter(VIEW_THREADS))
        cookie, csrf = await log_in_to(console, origin)
        await b.call({"target": "nope", "method": "GET", "path": "/"})
        _, _, page = await get(f"{origin}/journal", cookie=cookie)  # a report kept
        assert (page_line(page, "verify") or "").startswith("intact")
        real = JournalReader.verify
        verifies: list[int] = []
        running, go = threading.Event(), threading.Event()

        def held(self: JournalReader, *a: Any, **k: Any) -> Any:
            verifies.append(1)
            running.set()
            assert go.wait(3 * BOUND)  # held until the test lets it go
            return real(self, *a, **k)

        monkeypatch.setattr(JournalReader, "verify", held)
        form, headers = {"csrf": csrf}, {"Origin": origin, "Cookie": cookie}
        first: list[tuple[int, str | None]] = []

        async def start() -> None:
            status, got, _ = await post(f"{origin}/journal/verify", form, headers)
            first.append((status, got.get("location")))

        joined: list[tuple[int, str | None]] = []
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(start)
                for _ in range(int(BOUND * 100)):  # bounded: until the verify is held
                    if running.is_set():
                        break
                    await trio.sleep(0.01)
                assert running.is_set()
                with trio.fail_after(BOUND):  # (a press held for the verify never returns)
                    async with trio.open_nursery() as presses:
                        for _ in range(PRESSES):

                            async def press() -> None:
                                status, got, _ = await post(
                                    f"{origin}/journal/verify", form, headers
                                )
                                joined.append((status, got.get("location")))

                            presses.start_soon(press)
                # Every press answered while the verify is still held: none waited for it.
                assert not go.is_set() and first == [(303, "/journal")]
                assert joined == [(303, "/journal")] * PRESSES
                _, _, page = await get(f"{origin}/journal", cookie=cookie)
                assert (page_line(page, "verify-running") or "").startswith(
                    "A whole verify is running since"
                ), page[-2000:]
                go.set()
        finally:
            go.set()  # (a failed test does not leave the verify's thread waiting)
        await settled(console)
        assert verifies == [1]  # one verify for every press
        _, _, page = await get(f"{origin}/journal", cookie=cookie)
        assert page_line(page, "verify-running") is None, page[-2000:]
        head = b.journal.head()[0]
        when = page_line(page, "verify-when") or ""
        assert when.startswith(f"Whole journal verified through seq {head} (started "), when
        assert ", finished " in when, when
