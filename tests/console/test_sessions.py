"""A session's idle clock (docs/console.md, "Security model"): only the operator's own requests
restart it -- never a page reloading itself -- so a browser left open on the live actions view
is logged out after ``IDLE_TTL`` like any other.

The console is served in this process as the daemon serves it (a real loopback socket)."""

from __future__ import annotations

import html
import os
import re
from pathlib import Path

import pytest

from affidavit.console.auth import IDLE_TTL
from tests.broker.helpers import TOKEN_ENV, http_target, open_broker, write_config

from .kit import get, log_in_to, served


async def test_the_live_view_s_own_reload_does_not_keep_an_idle_session_alive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, "canary-never-shown")
    path = write_config(tmp_path, {"pay": http_target("http://127.0.0.1:9")})
    with path.open("a") as f:
        f.write(f"[service]\noperator_uids = [{os.geteuid()}]\n")
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        cookie, _ = await log_in_to(console, origin)
        session = console.sessions.get(cookie.split("=", 1)[1], used=False)
        assert session is not None

        status, _, page = await get(f"{origin}/actions?outcome=unknown", cookie=cookie)
        assert status == 200
        m = re.search(rb'<meta http-equiv="refresh" content="5; url=([^"]+)">', page)
        assert m is not None, page[:400]
        reload = html.unescape(m.group(1).decode())
        assert reload == "?outcome=unknown&auto=1"
        # The pause link keeps the filters, not the reload's marker.
        assert b"auto=1&amp;live=0" not in page and b"outcome=unknown&amp;live=0" in page

        # Nobody touched the page for most of the idle time; the page reloads itself.
        session.last_seen -= IDLE_TTL - 60
        idle_since = session.last_seen
        status, _, _ = await get(f"{origin}/actions{reload}", cookie=cookie)
        assert status == 200
        assert session.last_seen == idle_since  # the reload was no use of the session
        session.last_seen -= 61  # ... and past the idle time: the next reload is logged out
        status, headers, _ = await get(f"{origin}/actions{reload}", cookie=cookie)
        assert (status, headers["location"]) == (303, "/login")


async def test_an_operator_s_own_request_restarts_the_idle_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, "canary-never-shown")
    path = write_config(tmp_path, {"pay": http_target("http://127.0.0.1:9")})
    with path.open("a") as f:
        f.write(f"[service]\noperator_uids = [{os.geteuid()}]\n")
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        cookie, _ = await log_in_to(console, origin)
        session = console.sessions.get(cookie.split("=", 1)[1], used=False)
        assert session is not None
        session.last_seen -= IDLE_TTL - 60
        status, _, _ = await get(f"{origin}/actions", cookie=cookie)
        assert status == 200
        session.last_seen -= 61  # idle for less than IDLE_TTL since that request
        status, _, _ = await get(f"{origin}/actions", cookie=cookie)
        assert status == 200
