"""The whole verify an operator's press starts runs in the background (a task of the event loop
the console is served on, reading in a worker thread): the press is answered at once -- it held
its connection for the verify, ~41 s at 1M events -- and the journal page says since when it
runs, then how it ended: verified through seq N, BROKEN at the altered row, or failed with the
error's code (kept until the next whole verify ends).  The page a press is sent to says it
runs even before the verify's thread has begun, and a visit never waits for a whole verify,
not even when it found the lock held by an extension first.

The console is served in this process as the daemon serves it (a real loopback socket), its
views read in worker threads through a limiter as the daemon's; requests are plain HTTP."""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.daemon.app import VIEW_THREADS
from affidavit.journal import JournalReader, ReadFailed
from tests.broker.helpers import http_target, open_broker

from .kit import get, log_in_to, operator_config, page_line, post, read_in_threads, served, settled

BOUND = 10.0
"""Seconds any wait here may take at most: a guard against a hang, never a speed asserted."""


def _paragraph(page: bytes, id: str) -> str | None:
    """The paragraph ``id`` as its HTML (markup kept: what it shows escaped)."""
    m = re.search(rf'id="{id}">(.*?)</p>'.encode(), page, re.S)
    return None if m is None else " ".join(m.group(1).decode().split())


def _threaded(console: Any, db: Path, gate: list[trio.Event]) -> None:
    """The console reads in worker threads through a limiter, as the daemon's; a read begun
    while ``gate`` holds an event waits for it first."""
    read_in_threads(console, db, limiter=trio.CapacityLimiter(VIEW_THREADS), gate=gate)


@contextmanager
def _held(monkeypatch: pytest.MonkeyPatch, name: str) -> Iterator[tuple[Any, Any]]:
    """``JournalReader.<name>`` held until the test lets it go: (running, go) events."""
    real = getattr(JournalReader, name)
    running, go = threading.Event(), threading.Event()

    def held(self: JournalReader, *a: Any, **k: Any) -> Any:
        running.set()
        assert go.wait(3 * BOUND)
        return real(self, *a, **k)

    monkeypatch.setattr(JournalReader, name, held)
    try:
        yield running, go
    finally:
        go.set()  # (a failed test does not leave a thread waiting)


async def _until(event: threading.Event) -> None:
    for _ in range(int(BOUND * 100)):  # bounded
        if event.is_set():
            return
        await trio.sleep(0.01)
    raise AssertionError("not reached in time")


async def test_the_press_that_starts_a_whole_verify_is_answered_before_it_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        _threaded(console, tmp_path / "journal.db", [])
        cookie, csrf = await log_in_to(console, origin)
        await b.call({"target": "nope", "method": "GET", "path": "/"})
        await get(f"{origin}/journal", cookie=cookie)  # a report kept
        form, headers = {"csrf": csrf}, {"Origin": origin, "Cookie": cookie}
        with _held(monkeypatch, "verify") as (running, go):
            with trio.fail_after(BOUND):  # (a press held for the verify is never answered)
                status, got, _ = await post(f"{origin}/journal/verify", form, headers)
            assert (status, got.get("location")) == (303, "/journal")
            await _until(running)
            assert not go.is_set()  # answered while the verify is held
            _, _, page = await get(f"{origin}/journal", cookie=cookie)
            line = page_line(page, "verify-running") or ""
            assert line.startswith("A whole verify is running since"), page[-2000:]
            go.set()
            await settled(console)
        _, _, page = await get(f"{origin}/journal", cookie=cookie)
        assert page_line(page, "verify-running") is None
        when = page_line(page, "verify-when") or ""
        assert when.startswith(f"Whole journal verified through seq {b.journal.head()[0]} ")
        assert "(started " in when and ", finished " in when, when


async def test_the_page_a_press_is_sent_to_says_the_verify_runs_before_its_thread_began(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        gate: list[trio.Event] = []
        _threaded(console, tmp_path / "journal.db", gate)
        cookie, csrf = await log_in_to(console, origin)
        await b.call({"target": "nope", "method": "GET", "path": "/"})
        await get(f"{origin}/journal", cookie=cookie)  # a report kept
        form, headers = {"csrf": csrf}, {"Origin": origin, "Cookie": cookie}
        begun = trio.Event()
        gate.append(begun)  # the verify's read waits: its thread has not begun
        try:
            with trio.fail_after(BOUND):
                status, _, _ = await post(f"{origin}/journal/verify", form, headers)
                assert status == 303
                while gate:  # (the verify's read is the one that waits)
                    await trio.sleep(0.01)
                _, _, page = await get(f"{origin}/journal", cookie=cookie)
        finally:
            begun.set()
        line = page_line(page, "verify-running") or ""
        assert line.startswith("A whole verify is running since"), page[-2000:]
        await settled(console)


async def test_a_whole_verify_that_finds_a_row_altered_is_shown_broken_after_the_press(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    db = tmp_path / "journal.db"
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        _threaded(console, db, [])
        cookie, csrf = await log_in_to(console, origin)
        await b.call({"target": "nope", "method": "GET", "path": "/"})
        await get(f"{origin}/journal", cookie=cookie)  # a report kept
        conn = sqlite3.connect(db, isolation_level=None)
        try:  # altered in place, as someone who can write the file
            conn.execute("DROP TRIGGER IF EXISTS events_no_update")
            conn.execute("UPDATE events SET at = at + 1 WHERE seq = 2")
        finally:
            conn.close()
        form, headers = {"csrf": csrf}, {"Origin": origin, "Cookie": cookie}
        with _held(monkeypatch, "verify") as (running, go):
            with trio.fail_after(BOUND):
                status, _, _ = await post(f"{origin}/journal/verify", form, headers)
            assert status == 303
            await _until(running)
            go.set()
            await settled(console)
        for _ in range(2):  # kept until the next whole verify
            _, _, page = await get(f"{origin}/journal", cookie=cookie)
            line = page_line(page, "verify") or ""
            assert line.startswith("BROKEN at seq 2 (ROW_ALTERED): row 2 was altered"), line
            assert "(broken)" in (page_line(page, "verify-when") or "")


async def test_a_whole_verify_that_could_not_read_is_shown_failed_until_the_next_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        _threaded(console, tmp_path / "journal.db", [])
        cookie, csrf = await log_in_to(console, origin)
        await b.call({"target": "nope", "method": "GET", "path": "/"})
        await get(f"{origin}/journal", cookie=cookie)  # a report kept
        form, headers = {"csrf": csrf}, {"Origin": origin, "Cookie": cookie}
        real = JournalReader.verify

        def declined(self: JournalReader, *a: Any, **k: Any) -> Any:
            raise ReadFailed("canceling statement due to \u202estatement timeout")

        monkeypatch.setattr(JournalReader, "verify", declined)
        with trio.fail_after(BOUND):
            status, _, _ = await post(f"{origin}/journal/verify", form, headers)
        assert status == 303  # (it was answered 503 once it failed, and then forgotten)
        await settled(console)
        for _ in range(2):  # visits after it: the failure stays shown
            _, _, page = await get(f"{origin}/journal", cookie=cookie)
            line = _paragraph(page, "verify-failed") or ""
            assert "failed" in line and "<code>JOURNAL_READ_DECLINED</code>" in line, line
            assert "\u202e" not in line, line  # shown as its escape, never reordering it
            assert '"U+202E">\\u202e</span>statement timeout' in line, line
            assert (page_line(page, "verify") or "").startswith("intact")  # the last that read
        monkeypatch.setattr(JournalReader, "verify", real)
        await post(f"{origin}/journal/verify", form, headers)
        await settled(console)
        _, _, page = await get(f"{origin}/journal", cookie=cookie)
        assert _paragraph(page, "verify-failed") is None, page[-2500:]


async def test_a_visit_waiting_for_an_extension_is_answered_once_a_whole_verify_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A visit that finds the lock held by an extension (rows appended since) waits for it; a
    whole verify begun meanwhile may take the lock next and hold it its whole length: the
    visit is answered with the last report and the running line instead of waiting on."""
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        _threaded(console, tmp_path / "journal.db", [])
        cookie, csrf = await log_in_to(console, origin)
        await b.call({"target": "nope", "method": "GET", "path": "/"})
        await get(f"{origin}/journal", cookie=cookie)  # a report kept
        await b.call({"target": "nope", "method": "GET", "path": "/"})  # rows to extend over
        form, headers = {"csrf": csrf}, {"Origin": origin, "Cookie": cookie}
        pages: list[bytes] = []

        async def visit() -> None:
            pages.append((await get(f"{origin}/journal", cookie=cookie))[2])

        with _held(monkeypatch, "verify_since") as (extending, let_go):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(visit)  # its extension holds the lock
                await _until(extending)
                nursery.start_soon(visit)  # waits for the lock
                await trio.sleep(0.3)  # (it has come in)
                status, _, _ = await post(f"{origin}/journal/verify", form, headers)
                assert status == 303
                with trio.fail_after(BOUND):  # (held until the extension ends: never here)
                    while not pages:
                        await trio.sleep(0.01)
                assert not let_go.is_set()
                let_go.set()
            await settled(console)
        line = page_line(pages[0], "verify-running") or ""
        assert line.startswith("A whole verify is running since"), pages[0][-2000:]
        assert (page_line(pages[0], "verify") or "").startswith("intact")
