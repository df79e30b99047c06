"""A hostile page cannot keep a console session alive without a click (docs/console.md,
"Requests other pages make"), in a real headless chromium: a page on another port of
127.0.0.1 -- the same site as the console -- lists console pages in speculation rules
(``<script type=speculationrules>``).  Chromium prefetches and prerenders them with the
operator's cookie, labelled as the operator's own navigation (``Sec-Fetch-Site: none``,
``Sec-Fetch-Mode: navigate``); only ``Sec-Purpose`` says what they are.  They are refused and
the session's idle clock stays where it was.

The console is served in this process as the daemon serves it (a real loopback socket)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from affidavit.approvals import Operator
from affidavit.console.auth import IDLE_TTL
from tests.broker.helpers import http_target, open_broker
from tests.daemon.kit import wait_until
from tests.http.hostile import HostileServer, Reply, scripts

from .kit import Browser, operator_config, served

SPECULATION_WAIT = 15.0
"""Seconds the browser is given to act on the rules (bounded: a guard, no speed asserted)."""


def _hostile_page(origin: str) -> bytes:
    rules = {
        "prefetch": [{"source": "list", "urls": [f"{origin}/approvals?x=pf"]}],
        "prerender": [{"source": "list", "urls": [f"{origin}/journal?x=pr"]}],
    }
    return (
        "<!doctype html><title>nothing to see</title>"
        f'<script type="speculationrules">{json.dumps(rules)}</script><p>hello</p>'
    ).encode()


async def test_speculation_rules_on_another_port_do_not_keep_a_session_alive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chrome: Browser
) -> None:
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        seen: list[tuple[str, dict[str, str]]] = []
        route = console._route

        async def watched(req: Any) -> None:  # what reached the console, as it arrived
            seen.append((req.path + "?" + req.scope["query_string"].decode(), dict(req.headers)))
            await route(req)

        console._route = watched
        token, _ = console.tokens.mint(Operator.current())
        await chrome.log_in(f"{origin}/login?token={token}")
        [session] = list(console.sessions._by_id.values())
        session.last_seen -= IDLE_TTL - 60
        idle_since = session.last_seen
        seen.clear()

        page = Reply(200, [("Content-Type", "text/html")], _hostile_page(origin))
        async with HostileServer.running(scripts.serve(page)) as hostile:
            await chrome.get(f"{hostile.origin}/")

            def speculated() -> set[str]:
                return {
                    h.get("sec-purpose", "")
                    for target, h in seen
                    if target.endswith(("x=pf", "x=pr")) and "cookie" in h
                }

            await wait_until(
                lambda: {"prefetch", "prefetch;prerender"} <= speculated(),
                "chromium prefetched and prerendered the console's pages with the cookie",
                SPECULATION_WAIT,
            )
        assert session.last_seen == idle_since, seen
