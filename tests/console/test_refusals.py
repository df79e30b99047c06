"""What the console refuses, over plain HTTP (no browser needed to prove a refusal): no
session, a forged or missing CSRF token, a foreign origin, a reused or unknown login token, a
decision the service's rules refuse, a non-operator asking for a link, a non-loopback bind; a
login link opened but not confirmed, another Host name (DNS rebinding), an Origin that is not
the console's, an embedded link to a port this user's daemon does not hold, root minting a
link beside another user's journal."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
from pathlib import Path

import pytest
import trio

from affidavit.api.wire import blocking_request
from affidavit.config import ConfigError, config_from_dict
from affidavit.console import COOKIE
from tests.daemon.kit import (
    HUNG,
    NOBODY,
    as_user,
    cli,
    client_env,
    embedded,
    run,
    write_daemon_config,
)
from tests.external import free_port, require_root

from .kit import CHARGE, World, console_world, get, log_in, post, refusal


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
        other_port = f"http://127.0.0.1:{free_port()}"
        csrf_refused = ("CSRF_REFUSED", "csrf")
        origin_refused = ("ORIGIN_REFUSED", None)
        for form, headers, code in (
            ({"note": "x"}, same, csrf_refused),  # no token
            ({"csrf": "forged", "note": "x"}, same, csrf_refused),
            ({"csrf": csrf[:-1], "note": "x"}, same, csrf_refused),
            ({"csrf": csrf}, {"Origin": "http://evil.example", "Cookie": cookie}, origin_refused),
            # The realistic attacker: a page an agent serves on another port of loopback.
            ({"csrf": csrf}, {"Origin": other_port, "Cookie": cookie}, origin_refused),
            ({"csrf": csrf}, {"Referer": f"{other_port}/", "Cookie": cookie}, origin_refused),
            ({"csrf": csrf}, {"Cookie": cookie}, origin_refused),  # neither Origin nor Referer
            ({"csrf": csrf}, {"Origin": world.origin}, ("NOT_LOGGED_IN", None)),  # no session
        ):
            status, _, page = await post(approve, form, headers)
            assert (status, refusal(page)) == (403, code), (form, headers)
        reconcile = f"{world.origin}/invocations/{iid}/reconcile"
        status, _, _ = await post(reconcile, {"how": "committed", "note": "n"}, same)
        assert status == 403
        assert await _events(world, iid) == before  # nothing recorded
        assert world.pay.requests == []

        # The same form with the token is done, and recorded with the console's identity.
        referer = {"Referer": f"{world.origin}/approvals", "Cookie": cookie}
        status, headers, _ = await post(approve, {"csrf": csrf, "note": "ok"}, referer)
        assert (status, headers["location"]) == (303, "/approvals")
        me = {"uid": os.geteuid(), "via": "console"}
        assert await _decided(world, iid, "APPROVAL_GRANTED") == (me, "ok")
        # ... as is a denial.
        denied = (await world.call(dict(CHARGE)))["invocation_id"]
        deny = f"{world.origin}/approvals/{denied}/deny"
        status, headers, _ = await post(deny, {"csrf": csrf, "note": "no"}, same)
        assert (status, headers["location"]) == (303, "/approvals")
        assert await _decided(world, denied, "APPROVAL_DENIED") == (me, "no")


async def _decided(world: World, iid: str, kind: str) -> tuple[dict[str, object], str]:
    """The one ``kind`` event of ``iid``: (its operator's uid and via, its note)."""
    [attrs] = [e["attrs"] for e in (await world.record(iid))["events"] if e["kind"] == kind]
    return {k: attrs["operator"][k] for k in ("uid", "via")}, attrs["note"]


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


async def test_a_login_link_request_with_a_body_field_is_refused_naming_it(
    tmp_path: Path, token: str
) -> None:
    """``POST /v1/console/login`` takes no field: one is refused ``INVALID_FIELD`` naming it,
    as the other operator routes refuse theirs, and nothing is minted (it used to be ignored:
    a caller asking for another operator's or a longer-lived link got a plain one silently)."""
    tokens = tmp_path / "journal.db.console-tokens"
    async with console_world(tmp_path, token) as world:
        socket = str(world.daemon.socket)
        for body, said in (
            (b'{"operator": "root"}', "operator: unknown field (the body takes no field)"),
            (b'{"ttl": 1e9, "uid": 0}', "ttl: unknown field"),
        ):
            answer = await trio.to_thread.run_sync(
                blocking_request, socket, "POST", "/v1/console/login", body
            )
            error = answer.error()
            assert (answer.status, error.code) == (400, "INVALID_FIELD"), error
            assert error.message.startswith(said), error.message
            assert error.field == said.split(":")[0], error.field
            assert not tokens.exists() or list(tokens.iterdir()) == []
        for body in (b"{}", b""):
            answer = await trio.to_thread.run_sync(
                blocking_request, socket, "POST", "/v1/console/login", body
            )
            assert answer.status == 200, answer
        assert len(list(tokens.iterdir())) == 2


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
    remote = {"console_allow_remote": True, "console_public_origin": "https://console.example"}
    allowed = config_from_dict(
        {**base, "service": {"console": "0.0.0.0:8470", **remote}}, base_dir=tmp_path
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


async def test_opening_a_login_link_redeems_nothing_and_its_post_needs_the_origin(
    tmp_path: Path, token: str
) -> None:
    """A link previewer or prefetcher that GETs the link cannot use it up: the page only offers
    a button that POSTs the token, and that POST is refused from another origin."""
    async with console_world(tmp_path, token) as world:
        url = await world.login_url()
        for _ in range(2):
            status, headers, page = await get(url)
            assert status == 200 and b'id="login-confirm"' in page
            assert "set-cookie" not in headers
        code = url.split("=", 1)[1]
        assert f'name="token" value="{code}"'.encode() in page
        for origin in ("http://evil.example", "null"):
            status, headers, _ = await post(
                f"{world.origin}/login", {"token": code}, {"Origin": origin}
            )
            assert status == 403 and "set-cookie" not in headers
        status, headers, _ = await _redeem(world, url)  # still unused
        assert status == 200 and headers["set-cookie"].startswith(f"{COOKIE}=")


async def test_another_host_name_is_refused_and_origins_are_the_console_s(
    tmp_path: Path, token: str
) -> None:
    """DNS rebinding: a page of evil.example whose name now resolves to 127.0.0.1 reaches the
    console with ``Host: evil.example:PORT`` -- refused before anything is read.  And the
    Origin a POST must carry is the console's own, not whatever Host the request names."""
    async with console_world(tmp_path, token, wait="0s") as world:
        iid = (await world.call(dict(CHARGE)))["invocation_id"]
        cookie, csrf = await _session(world)
        port = world.origin.rsplit(":", 1)[1]
        for host in (f"evil.example:{port}", f"localhost:{port}", "127.0.0.1"):
            status, _, page = await _request_with_host(world, "/approvals", host, cookie)
            assert (status, refusal(page)) == (421, ("HOST_REFUSED", None)), host
        before = await _events(world, iid)
        # Host and Origin agreeing with each other is not enough: they must name the console.
        status, _, _ = await _request_with_host(
            world, f"/approvals/{iid}/approve", f"evil.example:{port}", cookie, {"csrf": csrf}
        )
        assert status == 421
        for origin in (f"http://localhost:{port}", f"https://127.0.0.1:{port}"):
            status, _, _ = await post(
                f"{world.origin}/approvals/{iid}/approve",
                {"csrf": csrf},
                {"Origin": origin, "Cookie": cookie},
            )
            assert status == 403, origin
        assert await _events(world, iid) == before


@pytest.mark.parametrize(
    ("written", "sent"),
    [
        ("https://console.example:8443", "console.example:8443"),
        ("https://console.example:443", "console.example"),  # as browsers send it
    ],
)
async def test_behind_a_tls_proxy_the_public_origin_is_accepted(
    tmp_path: Path, token: str, written: str, sent: str
) -> None:
    """``[service] console_public_origin``: the login link names it, and forms posted from it
    are accepted (a proxy is the TCP peer there, so the peer check is off: docs/console.md)."""
    public = {"console_public_origin": written}
    async with console_world(tmp_path, token, service=public, wait="0s") as world:
        iid = (await world.call(dict(CHARGE)))["invocation_id"]
        url = (await cli(world.daemon, "console-url")).stdout.decode().strip()
        assert url.startswith(f"https://{sent}/login?token=")
        proxied = {"Origin": f"https://{sent}", "Host": sent}
        status, headers, _ = await post(
            f"{world.origin}/login", {"token": url.split("=", 1)[1]}, proxied
        )
        assert status == 200
        # Secure: never sent over plain HTTP, e.g. to an agent's server on another port of
        # the public host (cookies ignore ports).
        assert "; Secure" in headers["set-cookie"], headers["set-cookie"]
        cookie = headers["set-cookie"].split(";")[0]
        status, _, page = await _request_with_host(world, "/approvals", sent, cookie)
        assert status == 200
        m = re.search(rb'name="csrf" value="([^"]+)"', page)
        assert m is not None
        status, _, _ = await post(
            f"{world.origin}/approvals/{iid}/approve",
            {"csrf": m.group(1).decode()},
            {**proxied, "Cookie": cookie},
        )
        assert status == 303
        assert "APPROVAL_GRANTED" in await _events(world, iid)


def test_a_public_origin_is_an_origin(tmp_path: Path) -> None:
    base = {"journal": {"path": str(tmp_path / "j.db")}}
    for bad in (
        "console.example",
        "https://console.example/path",
        "ftp://x",
        "https://u@x",
        "https://bücher.example",  # browsers send xn--bcher-kva.example: every page 421
        "https://x:0",
        "http://console.example:0",
    ):
        with pytest.raises(ConfigError) as info:
            config_from_dict({**base, "service": {"console_public_origin": bad}}, base_dir=tmp_path)
        assert "service.console_public_origin" in str(info.value)
    good = config_from_dict(
        {**base, "service": {"console_public_origin": "https://Console.Example:8443/"}},
        base_dir=tmp_path,
    )
    assert good.service.console_public_origin == "https://console.example:8443"


def test_a_public_origin_is_written_as_browsers_send_it(tmp_path: Path) -> None:
    """Without its scheme's default port: browsers send ``Origin: https://console.example``
    (and ``Host: console.example``) for ``https://console.example:443`` -- kept, that port made
    every form 403 and every page 421."""
    base = {"journal": {"path": str(tmp_path / "j.db")}}
    written = {
        "https://Console.Example:443": "https://console.example",
        "https://console.example:443/": "https://console.example",
        "http://console.example:80": "http://console.example",
        "https://[2001:DB8::1]:443": "https://[2001:db8::1]",
        "https://console.example:80": "https://console.example:80",
        "http://console.example:443": "http://console.example:443",
        "https://[2001:db8::1]:8443": "https://[2001:db8::1]:8443",
    }
    for given, origin in written.items():
        service = {"console_public_origin": given}
        loaded = config_from_dict({**base, "service": service}, base_dir=tmp_path)
        assert loaded.service.console_public_origin == origin, given


async def test_an_embedded_link_goes_only_to_this_user_s_listener(tmp_path: Path) -> None:
    """``affidavit console-url`` embedded prints a link to ``[service] console`` only when this
    user's daemon listens there: a free port could be taken by any local user, who would then
    receive the operator's login."""
    me = os.geteuid()

    def config_for(port: int) -> Path:
        return write_daemon_config(
            tmp_path,
            {},
            socket=tmp_path / "s.sock",
            service={"console": f"127.0.0.1:{port}", "operator_uids": [me]},
        )

    refused = await embedded("console-url", "--config", str(config_for(free_port())))
    assert refused.returncode == 2 and b"nothing listens on" in refused.stderr
    assert refused.stdout == b""
    # The squatter takes a port of the kernel's choosing (a free port picked here could be
    # taken by another xdist worker before it binds) and says which.
    listen = (
        "import socket, sys, time\n"
        "s = socket.socket()\n"
        "s.bind(('127.0.0.1', 0))\n"
        "s.listen()\n"
        "print(f'listening {s.getsockname()[1]}', flush=True)\n"
        f"time.sleep({2 * HUNG})\n"
    )
    squatter = await trio.lowlevel.open_process(
        as_user(65534, "-c", listen), stdout=subprocess.PIPE, env=client_env()
    )
    try:
        assert squatter.stdout is not None
        said = b""
        with trio.fail_after(HUNG):
            while not said.endswith(b"\n") and (more := await squatter.stdout.receive_some(100)):
                said += more
        assert said.startswith(b"listening "), said
        port = int(said.split()[1])
        config = config_for(port)
        refused = await embedded("console-url", "--config", str(config))
        assert refused.returncode == 2 and refused.stdout == b""
        assert b"is served by uid 65534" in refused.stderr
        assert not list((tmp_path / "journal.db.console-tokens").glob("*"))
    finally:
        squatter.kill()
        await squatter.wait()


async def test_root_minting_beside_another_user_s_journal_is_refused_before_it_makes_a_file(
    tmp_path: Path,
) -> None:
    """A root ``console-url`` (embedded) on the daemon's journal made ``<journal>.console-tokens/``
    and its token root's, 0700 and 0600: the daemon, their owner's, could then neither redeem
    nor mint a link, nor remove them.  Refused as a root one-off writer of that journal is
    (journal.lock), before anything is made -- even with root's own listener on the console's
    port, which let the link through before -- saying to run as the owner."""
    require_root()
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    journal = theirs / "journal.db"
    keys = tmp_path / "keys"  # configured elsewhere: root is told them too
    keys.mkdir()
    key, signing = keys / "broker.key", keys / "signing.key"
    for made in (key, signing):
        made.touch(mode=0o600)
        os.chown(made, NOBODY, NOBODY)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    config = write_daemon_config(
        tmp_path,
        {},
        socket=tmp_path / "s.sock",
        service={"console": f"127.0.0.1:{port}", "operator_uids": [0, NOBODY]},
        journal={"path": str(journal), "key_file": str(key), "signing_key": str(signing)},
    )
    with listener:
        for made in (False, True):  # no journal yet (its directory is judged), then the daemon's
            if made:
                journal.touch(mode=0o600)
                os.chown(journal, NOBODY, NOBODY)
            refused = await embedded("console-url", "--config", str(config))
            assert refused.returncode == 2 and refused.stdout == b"", refused
            said = refused.stderr.decode()
            assert "JOURNAL_UNUSABLE" in said and "and this process runs as root" in said, said
            assert f"run this as its owner, not as root (sudo -u '#{NOBODY}' affidavit" in said
            gives = f"chown -R 0 -- {theirs} && chown -h 0 -- {key} {signing}"
            assert said.rstrip().endswith(gives), said
            assert sorted(p.name for p in theirs.iterdir()) == (["journal.db"] if made else [])


async def _request_with_host(
    world: World, path: str, host: str, cookie: str, form: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """A GET (or with ``form``, a POST from ``http://HOST``) naming ``host`` in ``Host``."""
    import http.client
    from urllib.parse import urlencode

    def go() -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(world.origin.removeprefix("http://"), timeout=20)
        try:
            body = None if form is None else urlencode(form).encode()
            conn.putrequest("GET" if body is None else "POST", path, skip_host=True)
            conn.putheader("Host", host)
            conn.putheader("Cookie", cookie)
            if body is not None:
                conn.putheader("Origin", f"http://{host}")
                conn.putheader("Content-Type", "application/x-www-form-urlencoded")
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            conn.close()

    return await trio.to_thread.run_sync(go)


async def test_a_decision_or_reconcile_form_with_an_unknown_field_is_refused_naming_it(
    tmp_path: Path, token: str
) -> None:
    """A field the form does not take is refused (``INVALID_FIELD``, named), not dropped: a
    misspelt ``note`` would otherwise record a decision without the operator's words."""
    async with console_world(tmp_path, token, wait="0s") as world:
        iid = (await world.call(dict(CHARGE)))["invocation_id"]
        await world.one_pending()
        before = await _events(world, iid)
        cookie, csrf = await _session(world)
        same = {"Origin": world.origin, "Cookie": cookie}
        approve = f"{world.origin}/approvals/{iid}/approve"
        reconcile = f"{world.origin}/invocations/{iid}/reconcile"
        for url, form, field in (
            (approve, {"csrf": csrf, "notes": "typo"}, "notes"),
            (f"{world.origin}/approvals/{iid}/deny", {"csrf": csrf, "x": ""}, "x"),
            (approve, {"csrf": csrf, "a\nb": "1"}, "form"),
            (reconcile, {"csrf": csrf, "how": "query", "q": "1"}, "q"),
        ):
            status, _, page = await post(url, form, same)
            assert (status, refusal(page)) == (400, ("INVALID_FIELD", field)), (form, page)
            assert b"a\nb" not in page
        status, _, page = await post(reconcile, {"csrf": csrf, "how": "maybe"}, same)
        assert (status, refusal(page)) == (400, ("BAD_REQUEST", "how")), page
        assert await _events(world, iid) == before  # nothing recorded
        status, _, _ = await post(approve, {"csrf": csrf, "note": "ok"}, same)
        assert status == 303 and "APPROVAL_GRANTED" in await _events(world, iid)


async def test_a_query_parameter_or_form_field_given_twice_is_refused_naming_it(
    tmp_path: Path, token: str
) -> None:
    """Of a name given twice one value would be dropped unseen -- of ``how=query&how=committed``
    the last would attest what the pressed button did not say -- so it is refused
    (``INVALID_FIELD``, named), with a session or without, and nothing is recorded."""
    async with console_world(tmp_path, token, wait="0s") as world:
        iid = (await world.call(dict(CHARGE)))["invocation_id"]
        await world.one_pending()
        before = await _events(world, iid)
        cookie, csrf = await _session(world)
        same = {"Origin": world.origin, "Cookie": cookie}
        for path, field in (
            ("/actions?outcome=unknown&outcome=committed", "outcome"),
            ("/actions?outcome=&outcome=committed", "outcome"),
            ("/actions?live=1&%6Cive=0", "live"),
            (f"/invocations/{iid}?a%0Ab=1&a%0Ab=2", "query"),
        ):
            status, _, page = await get(world.origin + path, cookie=cookie)
            assert (status, refusal(page)) == (400, ("INVALID_FIELD", field)), (path, page)
        status, _, page = await get(f"{world.origin}/login?token=a&token=b")
        assert (status, refusal(page)) == (400, ("INVALID_FIELD", "token")), page
        approve = f"{world.origin}/approvals/{iid}/approve"
        reconcile = f"{world.origin}/invocations/{iid}/reconcile"
        for url, form, field in (
            (reconcile, [("csrf", csrf), ("how", "query"), ("how", "committed")], "how"),
            (approve, [("csrf", csrf), ("note", "a"), ("note", "b")], "note"),
        ):
            status, _, page = await post(url, form, same)
            assert (status, refusal(page)) == (400, ("INVALID_FIELD", field)), (form, page)
        assert await _events(world, iid) == before  # nothing recorded
        status, _, page = await get(f"{world.origin}/actions?outcome=unknown", cookie=cookie)
        assert status == 200, page
