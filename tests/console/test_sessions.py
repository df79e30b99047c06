"""What a session holds and how it ends (docs/console.md, "Security model"): only the operator's
own requests restart its idle clock -- never a page reloading itself, never a stranger's refused
request -- so a browser left open on the live actions view, or a cookie an agent holds, is
logged out after ``IDLE_TTL`` like any other; and a decision's confirmation comes from the
session, never from a URL anyone can link to.

The console is served in this process as the daemon serves it (a real loopback socket)."""

from __future__ import annotations

import html
import re
import time
from pathlib import Path

import pytest

from affidavit.console import pages
from affidavit.console.auth import IDLE_TTL
from tests.broker.helpers import http_target, open_broker
from tests.daemon.kit import as_user, client_env, run

from .kit import get, log_in_to, operator_config, post, refusal, served

NOBODY = 65534


async def test_the_live_view_s_own_reload_does_not_keep_an_idle_session_alive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        cookie, _ = await log_in_to(console, origin)
        session = console.sessions.get(cookie.split("=", 1)[1], used=False)
        assert session is not None

        query = "outcome=unknown&session=%C3%BC"  # the reload asks for the same bytes
        status, _, page = await get(f"{origin}/actions?{query}", cookie=cookie)
        assert status == 200
        m = re.search(rb'<meta http-equiv="refresh" content="5; url=([^"]+)">', page)
        assert m is not None, page[:400]
        reload = html.unescape(m.group(1).decode())
        assert reload == f"?{query}&auto=1"
        # The pause link keeps the filters, not the reload's marker.
        assert b"auto=1&amp;live=0" not in page and b"outcome=unknown&amp;" in page

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
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
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


async def test_a_decision_is_confirmed_from_the_session_never_from_the_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A link (from a page an agent serves on another port of loopback, which is the same
    site) naming ``?decided=`` or ``?done=`` made the console say a decision or a query had
    been recorded that nobody made: the confirmation now comes from the session, once."""
    target = http_target("http://127.0.0.1:9", approval={"methods": ["POST"], "wait": "0s"})
    path = operator_config(tmp_path, monkeypatch, {"pay": target}, "allow_self_approval = true\n")
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        cookie, csrf = await log_in_to(console, origin)
        envelope = await b.call({"target": "pay", "method": "POST", "path": "/v1/x", "body": "x"})
        iid = envelope["invocation_id"]

        _, _, page = await get(f"{origin}/approvals?decided={iid}", cookie=cookie)
        assert b'id="decided"' not in page  # nothing was decided
        for forged in ("reconciled", "inconclusive"):
            _, _, page = await get(f"{origin}/invocations/{iid}?done={forged}", cookie=cookie)
            assert b'id="done"' not in page, forged  # no query ran

        status, headers, _ = await post(
            f"{origin}/approvals/{iid}/deny",
            {"csrf": csrf},
            {"Origin": origin, "Cookie": cookie},
        )
        assert (status, headers.get("location")) == (303, "/approvals")
        _, _, page = await get(f"{origin}/approvals", cookie=cookie)
        assert f'id="decided">Decision recorded for <code>{iid}</code>'.encode() in page
        _, _, page = await get(f"{origin}/approvals", cookie=cookie)
        assert b'id="decided"' not in page  # said once


_STRANGER = r"""
import http.client, sys
host, cookie = sys.argv[1:]
conn = http.client.HTTPConnection(host, timeout=20)
conn.request("GET", "/approvals", headers={"Cookie": cookie})
print(conn.getresponse().status)
"""


async def test_a_stranger_s_refused_request_does_not_keep_the_session_alive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent that got the cookie (its server on another port of loopback is sent it) is
    refused -- and its refused requests must not restart the session's idle clock either."""
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        cookie, _ = await log_in_to(console, origin)
        session = console.sessions.get(cookie.split("=", 1)[1], used=False)
        assert session is not None
        session.last_seen -= IDLE_TTL - 60
        idle_since = session.last_seen
        host = origin.removeprefix("http://")
        done = await run(as_user(NOBODY, "-c", _STRANGER, host, cookie), env=client_env())
        assert (done.returncode, done.stdout.strip()) == (0, b"403"), done.stderr
        assert session.last_seen == idle_since
        session.last_seen -= 61
        status, headers, _ = await get(f"{origin}/approvals", cookie=cookie)
        assert (status, headers["location"]) == (303, "/login")


NAVIGATION = {"Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}
FETCHED_BY = {
    "an image": {
        "Sec-Fetch-Site": "same-site",
        "Sec-Fetch-Mode": "no-cors",
        "Sec-Fetch-Dest": "image",
    },
    "a script's fetch": {
        "Sec-Fetch-Site": "cross-site",
        "Sec-Fetch-Mode": "cors",
        "Sec-Fetch-Dest": "empty",
    },
    "a frame": {
        "Sec-Fetch-Site": "same-site",
        "Sec-Fetch-Mode": "navigate",
        "Sec-Fetch-Dest": "iframe",
    },
}
"""Requests a page on another port of 127.0.0.1 (the same site) or another site makes with the
operator's cookie, as the browser labels them (Fetch Metadata)."""


async def test_a_request_refused_after_its_session_was_found_does_not_keep_it_alive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator's browser, on a hostile page of another loopback port, sends the console
    the session cookie with that page's posts (their Origin or CSRF token wrong: 403) and its
    images: refused, and none of them restarts the idle clock -- else the page could keep the
    session alive forever."""
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        cookie, csrf = await log_in_to(console, origin)
        session = console.sessions.get(cookie.split("=", 1)[1], used=False)
        assert session is not None
        session.last_seen -= IDLE_TTL - 60
        idle_since = session.last_seen
        other = origin.rsplit(":", 1)[0] + ":9"  # the attacker's page: another port
        for form, origin_header, code in (
            ({"csrf": csrf}, other, ("ORIGIN_REFUSED", None)),
            ({"csrf": "forged"}, origin, ("CSRF_REFUSED", "csrf")),
            ({}, origin, ("CSRF_REFUSED", "csrf")),
        ):
            headers = {"Origin": origin_header, "Cookie": cookie}
            status, _, page = await post(f"{origin}/journal/verify", form, headers)
            assert (status, refusal(page)) == (403, code), (form, origin_header)
            assert session.last_seen == idle_since, (form, origin_header)
        for what, fetch in FETCHED_BY.items():
            status, headers, page = await get(f"{origin}/approvals", cookie=cookie, headers=fetch)
            assert (status, refusal(page)) == (403, ("SITE_REFUSED", None)), what
            assert headers["cross-origin-resource-policy"] == "same-origin"
            assert session.last_seen == idle_since, what
        # A form another port's page submits, even with the console's Origin and CSRF token
        # (were they ever leaked): a navigation, but no GET -- refused for its site alone.
        form_post = {"Sec-Fetch-Site": "same-site", **NAVIGATION, "Origin": origin}
        status, _, page = await post(
            f"{origin}/logout", {"csrf": csrf}, {**form_post, "Cookie": cookie}
        )
        assert (status, refusal(page)) == (403, ("SITE_REFUSED", None))
        assert console.sessions.get(session.id, used=False) is session  # not logged out
        assert session.last_seen == idle_since
        # ... so it ends after the idle time, whatever that page sent.
        session.last_seen -= 61
        status, headers, _ = await get(f"{origin}/approvals", cookie=cookie)
        assert (status, headers["location"]) == (303, "/login")


async def test_only_the_operator_s_own_navigation_restarts_the_idle_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A console page's own request, an address typed or bookmarked, and a client's that sends
    no Fetch Metadata restart the idle clock.  A navigation another page started is served (it
    may be a link the operator followed) but restarts nothing: a page on another port of
    127.0.0.1 (``same-site``: the browser sends it the SameSite=Strict cookie) can re-navigate
    a popup at will.  (``cross-site`` never carries the cookie from a browser; from a client
    that sends it anyway it is served the same way.)"""
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        cookie, _ = await log_in_to(console, origin)
        session = console.sessions.get(cookie.split("=", 1)[1], used=False)
        assert session is not None
        for site, restarts in (
            ("same-origin", True),
            ("none", True),
            (None, True),
            ("same-site", False),
            ("cross-site", False),
        ):
            fetch = NAVIGATION if site is None else {"Sec-Fetch-Site": site, **NAVIGATION}
            session.last_seen = time.time() - (IDLE_TTL - 60)
            idle_since = session.last_seen
            status, headers, _ = await get(f"{origin}/approvals", cookie=cookie, headers=fetch)
            assert status == 200, site
            assert headers["cross-origin-opener-policy"] == "same-origin"
            assert (session.last_seen > idle_since) is restarts, site


SPECULATIVE = {
    "a prefetch": {"Sec-Purpose": "prefetch"},
    "a prerender": {"Sec-Purpose": "prefetch;prerender"},
    "an anonymous prefetch": {"Sec-Purpose": "prefetch;anonymous-client-ip"},
    "an old browser's prefetch": {"Purpose": "prefetch"},
}


@pytest.mark.parametrize("what", sorted(SPECULATIVE))
async def test_a_prefetch_or_prerender_is_refused_and_keeps_nobody_logged_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    """Speculation rules on a page on another port made chromium fetch console pages with the
    cookie, labelled as the operator's own navigation (``Sec-Fetch-Site: none``): only
    ``Sec-Purpose`` tells them apart.  Refused, 503, not stored, and the clock stays."""
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        cookie, _ = await log_in_to(console, origin)
        session = console.sessions.get(cookie.split("=", 1)[1], used=False)
        assert session is not None
        session.last_seen -= IDLE_TTL - 60
        idle_since = session.last_seen
        fetch = {"Sec-Fetch-Site": "none", **NAVIGATION, **SPECULATIVE[what]}
        for page in ("/approvals", "/journal", "/actions"):
            status, headers, body = await get(f"{origin}{page}", cookie=cookie, headers=fetch)
            assert (status, refusal(body)) == (503, ("PREFETCH_REFUSED", None)), page
            assert headers["cache-control"] == "no-store"
            assert b"<table" not in body  # nothing of the page
            assert session.last_seen == idle_since, page


async def test_the_list_pages_show_a_bounded_number_of_rows_whatever_an_agent_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every refused action is journaled, and an action may name any session: an agent can
    make rows without end (3000 refused calls took 5 s and made /actions 0.9 MB, reloaded every
    5 s).  The list pages show the newest ``MAX_ROWS`` and say how many there are."""
    monkeypatch.setattr(pages, "MAX_ROWS", 4)
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        cookie, _ = await log_in_to(console, origin)
        made = []
        for i in range(7):
            action = {"target": "nope", "method": "GET", "path": "/", "session": f"spam-{i}"}
            made.append((await b.call(action))["invocation_id"])

        _, _, page = await get(f"{origin}/actions", cookie=cookie)
        listed = re.findall(rb'<td><a href="/invocations/([^"]+)">', page)
        assert [i.decode() for i in listed] == made[::-1][:4]  # the newest, newest first
        assert b"the newest 4 of 7 shown" in page
        assert b'<td class="not_attempted">7</td>' in page  # the counts are of all

        _, _, page = await get(f"{origin}/journal", cookie=cookie)
        sessions = re.findall(rb'<a href="/actions\?session=spam-(\d)">', page)
        assert sorted(sessions) == [b"3", b"4", b"5", b"6"]  # those seen last
        assert b"the 4 seen last of 7" in page
