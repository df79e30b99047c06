"""What the console refuses, over plain HTTP (no browser needed to prove a refusal): no
session, a forged or missing CSRF token, a foreign origin, a reused or unknown login token, a
decision the service's rules refuse, a non-operator asking for a link, a non-loopback bind."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from affidavit.config import ConfigError, config_from_dict
from affidavit.console import COOKIE
from tests.daemon.kit import cli, embedded, run, write_daemon_config
from tests.external import free_port

from .kit import CHARGE, World, console_world, get, log_in, post


async def _redeem(world: World, url: str) -> tuple[int, dict[str, str], bytes]:
    """Press the login page's button for ``url``'s token (a POST from the console's origin)."""
    token = url.split("=", 1)[1]
    return await post(f"{world.origin}/login", {"token": token}, {"Origin": world.origin})


async def _session(world: World) -> tuple[str, str]:
    """Log in over HTTP: (the Cookie header, the session's CSRF token)."""
    cookie, csrf = await log_in(world)
    assert cookie.startswith(f"{COOKIE}=")
    return cookie, csrf


async def _events(world: World, iid: str) -> list[str]:
    return [e["kind"] for e in (await world.record(iid))["events"]]


async def test_without_a_session_every_page_leads_to_the_login_page(
    tmp_path: Path, token: str
) -> None:
    async with console_world(tmp_path, token) as world:
        for path in ("/", "/approvals", "/actions", "/journal", "/invocations/x"):
            status, headers, _ = await get(world.origin + path)
            assert (status, headers["location"]) == (303, "/login"), path
        status, headers, page = await get(f"{world.origin}/login")
        assert status == 200 and b'id="login"' in page
        # Every answer carries the security headers.
        assert headers["content-security-policy"].startswith("default-src 'none'")
        assert "frame-ancestors 'none'" in headers["content-security-policy"]
        assert "script-src 'self'" in headers["content-security-policy"]
        assert headers["x-frame-options"] == "DENY"
        assert headers["cache-control"] == "no-store"
        assert headers["referrer-policy"] == "same-origin"
        status, _, page = await _redeem(world, "x=not-a-token-anyone-issued")
        assert status == 403 and b'id="login-failed"' in page


async def test_a_login_link_works_once(tmp_path: Path, token: str) -> None:
    async with console_world(tmp_path, token) as world:
        url = await world.login_url()
        status, headers, _ = await _redeem(world, url)
        assert status == 200
        for attr in ("HttpOnly", "SameSite=Strict", "Path=/"):
            assert attr in headers["set-cookie"]
        status, headers, page = await _redeem(world, url)
        assert status == 403 and b'id="login-failed"' in page
        assert "set-cookie" not in headers


async def test_state_changes_need_the_session_csrf_token_and_the_origin(
    tmp_path: Path, token: str
) -> None:
    async with console_world(tmp_path, token, wait="0s") as world:
        envelope = await world.call(dict(CHARGE))  # answered pending at once
        await world.one_pending()
        iid = envelope["invocation_id"]
        before = await _events(world, iid)
        cookie, csrf = await _session(world)
        approve = f"{world.origin}/approvals/{iid}/approve"
        same = {"Origin": world.origin, "Cookie": cookie}
        for form, headers in (
            ({"note": "x"}, same),  # no token
            ({"csrf": "forged", "note": "x"}, same),
            ({"csrf": csrf[:-1], "note": "x"}, same),
            ({"csrf": csrf}, {"Origin": "http://evil.example", "Cookie": cookie}),
            ({"csrf": csrf}, {"Cookie": cookie}),  # neither Origin nor Referer
            ({"csrf": csrf}, {"Origin": world.origin}),  # no session
        ):
            status, _, page = await post(approve, form, headers)
            assert status == 403, (form, headers)
            assert b"nothing done" in page or b"console page" in page or b"not logged" in page
        reconcile = f"{world.origin}/invocations/{iid}/reconcile"
        status, _, _ = await post(reconcile, {"how": "committed", "note": "n"}, same)
        assert status == 403
        assert await _events(world, iid) == before  # nothing recorded
        assert world.pay.requests == []

        # The same form with the token is done, and recorded with the console's identity.
        referer = {"Referer": f"{world.origin}/approvals", "Cookie": cookie}
        status, headers, _ = await post(approve, {"csrf": csrf, "note": "ok"}, referer)
        assert (status, headers["location"]) == (303, f"/approvals?decided={iid}")
        assert "APPROVAL_GRANTED" in await _events(world, iid)


async def test_the_service_rules_decide_and_their_refusal_is_shown(
    tmp_path: Path, token: str
) -> None:
    """The console passes its operator to the Broker; the service refuses self-approval."""
    no_self = {"allow_self_approval": False}
    async with console_world(tmp_path, token, service=no_self, wait="0s") as world:
        iid = (await world.call(dict(CHARGE)))["invocation_id"]
        cookie, csrf = await _session(world)
        status, _, page = await post(
            f"{world.origin}/approvals/{iid}/approve",
            {"csrf": csrf},
            {"Origin": world.origin, "Cookie": cookie},
        )
        assert status == 403 and b"SELF_APPROVAL" in page
        assert "APPROVAL_GRANTED" not in await _events(world, iid)
        # Attesting an outcome that is not unknown: NOT_UNKNOWN, shown on the page.
        status, _, page = await post(
            f"{world.origin}/invocations/{iid}/reconcile",
            {"csrf": csrf, "how": "committed", "note": "checked"},
            {"Origin": world.origin, "Cookie": cookie},
        )
        assert status == 409 and b"STILL_RUNNING" in page


async def test_only_an_operator_gets_a_login_link(tmp_path: Path, token: str) -> None:
    async with console_world(tmp_path, token, service={"operator_uids": [4242]}) as world:
        refused = await cli(world.daemon, "console-url")
        assert refused.returncode == 2 and refused.stdout == b""
        assert b"NOT_AN_OPERATOR" in refused.stderr or b"may not open" in refused.stderr
        refused = await embedded("console-url", "--config", str(world.daemon.config))
        assert refused.returncode == 2 and b"may not open the operator console" in refused.stderr


async def test_an_operator_on_the_daemon_s_machine_mints_a_link_embedded(
    tmp_path: Path, token: str
) -> None:
    async with console_world(tmp_path, token) as world:
        done = await embedded("console-url", "--config", str(world.daemon.config), "--json")
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        assert answer["url"].startswith(f"{world.origin}/login?token=")
        tokens = tmp_path / "journal.db.console-tokens"
        [stored] = list(tokens.iterdir())
        assert answer["url"].split("=", 1)[1] not in stored.read_text()  # stored hashed
        assert stored.stat().st_mode & 0o077 == 0 and tokens.stat().st_mode & 0o077 == 0
        status, _, page = await _redeem(world, answer["url"])
        assert status == 200 and f"uid={os.geteuid()}".encode() in page
        assert list(tokens.iterdir()) == []  # redeemed: gone


async def test_a_daemon_without_a_console_mints_no_link(tmp_path: Path, token: str) -> None:
    async with console_world(tmp_path, token, service={"console": None}) as world:
        refused = await cli(world.daemon, "console-url")
        assert refused.returncode == 2 and b"serves no console" in refused.stderr


def test_a_non_loopback_console_needs_an_explicit_setting(tmp_path: Path) -> None:
    base = {"journal": {"path": str(tmp_path / "j.db")}}
    for address in ("0.0.0.0:8470", "192.0.2.1:8470", "[::]:8470", "example.com:80"):
        with pytest.raises(ConfigError) as info:
            config_from_dict({**base, "service": {"console": address}}, base_dir=tmp_path)
        assert "service.console" in str(info.value)
    for address in ("127.0.0.1:8470", "[::1]:8470", "localhost:0"):
        loaded = config_from_dict({**base, "service": {"console": address}}, base_dir=tmp_path)
        assert loaded.service.console is not None
    allowed = config_from_dict(
        {**base, "service": {"console": "0.0.0.0:8470", "console_allow_remote": True}},
        base_dir=tmp_path,
    )
    assert allowed.service.console == ("0.0.0.0", 8470)


async def test_serve_refuses_a_non_loopback_console_flag(tmp_path: Path) -> None:
    import sys

    config = write_daemon_config(tmp_path, {}, socket=tmp_path / "s.sock")
    done = await run(
        [
            sys.executable,
            "-m",
            "affidavit",
            "serve",
            "--config",
            str(config),
            "--console",
            f"0.0.0.0:{free_port()}",
        ]
    )
    assert done.returncode == 2
    assert b"--console: 0.0.0.0 is not a loopback address" in done.stderr
    assert not (tmp_path / "s.sock").exists()
