"""Logging out (POST /logout, docs/console.md): the session ends -- its cookie, presented again,
is no session at all -- and the answer expires the cookie; a logout without the session's CSRF
token or from another origin (a page on another port of loopback) is refused like any other
form, and the session lives on.

The console is served in this process as the daemon serves it (a real loopback socket)."""

from __future__ import annotations

from pathlib import Path

import pytest

from affidavit.console import COOKIE
from tests.broker.helpers import http_target, open_broker
from tests.external import free_port

from .kit import get, log_in_to, operator_config, post, refusal, served


async def test_logging_out_ends_the_session_and_its_cookie_no_longer_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        cookie, csrf = await log_in_to(console, origin)
        sid = cookie.split("=", 1)[1]
        same = {"Origin": origin, "Cookie": cookie}
        status, headers, _ = await post(f"{origin}/logout", {"csrf": csrf}, same)
        assert (status, headers["location"]) == (303, "/login")
        expired = headers["set-cookie"]
        assert expired.startswith(f"{COOKIE}=;") and "Max-Age=0" in expired, expired
        assert console.sessions.get(sid, used=False) is None
        # The old cookie, kept by a client that ignores the expiry, is no session.
        status, headers, _ = await get(f"{origin}/approvals", cookie=cookie)
        assert (status, headers["location"]) == (303, "/login")
        for after in ("/journal/verify", "/logout"):
            status, _, page = await post(f"{origin}{after}", {"csrf": csrf}, same)
            assert (status, refusal(page)) == (403, ("NOT_LOGGED_IN", None)), after


async def test_a_logout_without_the_token_or_from_another_origin_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        cookie, csrf = await log_in_to(console, origin)
        other_port = f"http://127.0.0.1:{free_port()}"
        for form, headers, code in (
            ({}, {"Origin": origin}, "CSRF_REFUSED"),
            ({"csrf": "forged"}, {"Origin": origin}, "CSRF_REFUSED"),
            ({"csrf": csrf}, {"Origin": other_port}, "ORIGIN_REFUSED"),
            ({"csrf": csrf}, {"Referer": f"{other_port}/"}, "ORIGIN_REFUSED"),
            ({"csrf": csrf}, {}, "ORIGIN_REFUSED"),  # neither Origin nor Referer
        ):
            status, got, page = await post(f"{origin}/logout", form, {**headers, "Cookie": cookie})
            assert (status, (refusal(page) or ("",))[0]) == (403, code), (form, headers)
            assert "set-cookie" not in got, (form, headers)
        status, _, _ = await get(f"{origin}/approvals", cookie=cookie)
        assert status == 200  # still logged in
