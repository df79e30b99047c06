"""Cookie tossing: a server on another port of 127.0.0.1 (an agent's) can set a cookie named
``affidavit_console`` for 127.0.0.1 -- cookies ignore ports (RFC 6265 §8.5) -- and one with a
longer ``Path`` is sent *before* the console's own (§5.4).  The console must not take the first
value for its session: a junk one would log the operator out for good (logging in again sets
``Path=/``, which the longer path still shadows), a live session of someone else's would put
the operator's requests under it.  A random cookie name would not help: the operator's browser
sends the name to that server with every request.  What the other port cannot set is the
connection's owner (the kernel's), so on loopback the session is the live one of the
connection's owner; where nothing can be checked, two live sessions are refused.

HTTP-level: the requests carry the cookie twice, as a browser would after such a toss.
"""

from __future__ import annotations

import http.client
import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import trio

from affidavit.approvals import Operator
from affidavit.console import COOKIE
from tests.broker.helpers import http_target, open_broker

from .kit import WAIT, Browser, console_world, log_in_to, operator_config, refusal, served

OTHER_GID = 4242
"""A group named an operator group, so that a session of another operator (uid 65534 in it)
is live."""


async def _get(url: str, cookie_lines: list[str]) -> tuple[int, bytes]:
    """A GET whose ``Cookie`` header lines are exactly ``cookie_lines``."""
    parts = urlsplit(url)

    def run() -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(parts.netloc, timeout=WAIT)
        try:
            conn.putrequest("GET", parts.path)
            for line in cookie_lines:
                conn.putheader("Cookie", line)
            conn.endheaders()
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    return await trio.to_thread.run_sync(run)


def _csrf(page: bytes) -> str | None:
    m = re.search(rb'name="csrf" value="([^"]+)"', page)
    return m.group(1).decode() if m else None


async def test_a_tossed_cookie_beside_the_session_s_does_not_log_the_operator_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        cookie, csrf = await log_in_to(console, origin)
        tossed = f"{COOKIE}=tossed-by-another-port"
        for lines in ([f"{tossed}; {cookie}"], [f"{cookie}; {tossed}"], [tossed, cookie]):
            status, page = await _get(f"{origin}/approvals", lines)
            assert (status, _csrf(page)) == (200, csrf), lines
        # Only junk: no session, the login page as before.
        status, _ = await _get(f"{origin}/approvals", [tossed])
        assert status == 303


async def test_another_operator_s_live_session_tossed_first_is_not_taken_for_the_operator_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = operator_config(
        tmp_path,
        monkeypatch,
        {"pay": http_target("http://127.0.0.1:9")},
        f"operator_gids = [{OTHER_GID}]\n",
    )
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        cookie, csrf = await log_in_to(console, origin)
        other = console.sessions.start(Operator(65534, OTHER_GID, (), "other", "console"))
        status, page = await _get(f"{origin}/approvals", [f"{COOKIE}={other.id}; {cookie}"])
        assert (status, _csrf(page)) == (200, csrf)
        # Alone, the other operator's session is still refused on this connection.
        status, _ = await _get(f"{origin}/approvals", [f"{COOKIE}={other.id}"])
        assert status == 403


async def test_where_no_connection_is_checked_two_live_sessions_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    public = "https://console.example:8443"  # a proxy whose user is not declared: no check
    async with open_broker(path) as b, served(b, tmp_path, public_origin=public) as (origin, c):
        assert not c.check_peer
        cookie, csrf = await log_in_to(c, origin)
        second = c.sessions.start(Operator.current())
        status, page = await _get(f"{origin}/approvals", [f"{COOKIE}={second.id}; {cookie}"])
        assert status == 403 and _csrf(page) is None
        assert refusal(page) == ("SESSION_AMBIGUOUS", None)
        status, page = await _get(f"{origin}/approvals", [f"{COOKIE}=junk; {cookie}"])
        assert (status, _csrf(page)) == (200, csrf)


async def test_in_chromium_a_page_on_another_port_cannot_log_the_operator_out(
    tmp_path: Path, token: str, chrome: Browser
) -> None:
    """The toss as it happens: the operator's browser opens a page an agent serves on another
    port of 127.0.0.1, whose answer sets ``affidavit_console`` with ``Path=/approvals``; the
    browser then sends both cookies to the console, the tossed one first."""
    tossed = f"{COOKIE}=tossed-by-another-port; Path=/approvals; SameSite=Lax".encode()
    answer = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\nset-cookie: %s\r\n"
        b"content-length: 2\r\nconnection: close\r\n\r\nok" % tossed
    )
    seen: list[bytes] = []

    async def agent(stream: trio.SocketStream) -> None:
        with trio.move_on_after(WAIT):
            seen.append(await stream.receive_some(65536))
            await stream.send_all(answer)
        await stream.aclose()

    async with console_world(tmp_path, token) as world, trio.open_nursery() as nursery:
        [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
        nursery.start_soon(trio.serve_listeners, agent, [listener])
        await chrome.get(f"{world.origin}/approvals")
        await chrome.log_in(await world.login_url())
        assert await chrome.count("#operator") == 1

        await chrome.get(f"http://127.0.0.1:{listener.socket.getsockname()[1]}/")
        assert seen and f"{COOKIE}=".encode() in seen[0]  # the agent saw the session cookie

        await chrome.get(f"{world.origin}/approvals")
        jar = await chrome.run(lambda d: d.get_cookies())  # those sent to /approvals
        assert sorted(c["path"] for c in jar if c["name"] == COOKIE) == ["/", "/approvals"]
        assert await chrome.count("#operator") == 1, await chrome.source()  # still logged in
        nursery.cancel_scope.cancel()
