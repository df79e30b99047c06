"""A console behind a proxy on this machine: ``[service] console_proxy_user``.

With ``console_public_origin`` the proxy is the TCP peer of the operators' requests, so the
kernel cannot name the operator there.  The loopback listener is still open to every local uid,
though: an agent holding a stolen cookie or login link could connect to it directly.  With the
proxy's user declared, only that uid's connections are the proxy (the cookie is their proof,
and they must name the public origin); every other uid -- and a peer the kernel cannot name --
is checked as on a plain loopback console (docs/console.md, "Security model").
"""

from __future__ import annotations

import json
import pwd
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from affidavit.approvals import Operator
from affidavit.config import ConfigError, config_from_dict
from affidavit.console import COOKIE, Console, TokenStore
from tests.daemon.kit import as_user, cli, client_env, run, write_daemon_config
from tests.external import free_port

from .kit import CHARGE, World, console_world, csrf_of, post, refusal

PUBLIC = "https://console.example:8443"
PUBLIC_HOST = "console.example:8443"
PROXY = 65534  # nobody: the proxy's user
AGENT = 4242  # another local uid: neither the proxy nor an operator
BEHIND_PROXY = {"console_public_origin": PUBLIC, "console_proxy_user": "nobody"}

# A client run as another uid: each step is (method, path, Host, Origin, form or None), sent
# with the cookie; the form's "csrf" is filled in from the last page that showed one, and a
# session cookie set by an answer is kept for the next steps.
_CLIENT = r"""
import http.client, json, re, sys, urllib.parse
address, cookie, steps = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
csrf, out = "", []
for method, path, host, origin, form in steps:
    conn = http.client.HTTPConnection(address, timeout=20)
    conn.putrequest(method, path, skip_host=True)
    conn.putheader("Host", host)
    conn.putheader("Origin", origin)
    if cookie:
        conn.putheader("Cookie", cookie)
    body = None
    if form is not None:
        body = urllib.parse.urlencode({k: csrf if v == "CSRF" else v for k, v in form.items()})
        body = body.encode()
        conn.putheader("Content-Type", "application/x-www-form-urlencoded")
        conn.putheader("Content-Length", str(len(body)))
    conn.endheaders(body)
    r = conn.getresponse()
    page = r.read().decode("utf-8", "replace")
    set_cookie = r.getheader("set-cookie")
    if set_cookie:
        cookie = set_cookie.split(";")[0]
    m = re.search(r'name="csrf" value="([^"]+)"', page)
    if m:
        csrf = m.group(1)
    out.append([r.status, page])
    conn.close()
print(json.dumps(out))
"""


async def _as(uid: int, world: World, cookie: str, steps: list[list[Any]]) -> list[list[Any]]:
    address = world.origin.removeprefix("http://")
    done = await run(
        as_user(uid, "-c", _CLIENT, address, cookie, json.dumps(steps)), env=client_env()
    )
    assert done.returncode == 0, done.stderr
    answers: list[list[Any]] = json.loads(done.stdout)
    return answers


async def _link(world: World) -> str:
    done = await cli(world.daemon, "console-url")
    assert done.returncode == 0, done.stderr
    url = done.stdout.decode().strip()
    assert url.startswith(f"{PUBLIC}/login?token="), url
    return url.split("=", 1)[1]


async def _operator_logs_in_directly(world: World) -> tuple[str, str]:
    """This test's uid (the operator) logs in over a direct connection: (Cookie, CSRF)."""
    status, headers, _ = await post(
        f"{world.origin}/login", {"token": await _link(world)}, {"Origin": world.origin}
    )
    assert status == 200, status
    cookie = headers["set-cookie"].split(";")[0]
    return cookie, await csrf_of(world.origin, cookie)


def _steps(iid: str, host: str, origin: str, csrf: str, link: str) -> list[list[Any]]:
    """Everything an agent holding the operator's cookie, CSRF token and link would try."""
    return [
        ["GET", "/approvals", host, origin, None],
        ["GET", f"/approvals/{iid}/content/body", host, origin, None],
        ["POST", f"/approvals/{iid}/approve", host, origin, {"csrf": csrf, "note": "agent"}],
        ["POST", f"/invocations/{iid}/reconcile", host, origin, {"csrf": csrf, "how": "x"}],
        ["POST", "/login", host, origin, {"token": link}],
    ]


async def test_behind_a_declared_proxy_another_uid_s_direct_connection_is_refused(
    tmp_path: Path, token: str
) -> None:
    async with console_world(tmp_path, token, service=BEHIND_PROXY, wait="0s") as world:
        iid = (await world.call(dict(CHARGE)))["invocation_id"]
        cookie, csrf = await _operator_logs_in_directly(world)  # the operator's uid: served
        stolen_link = await _link(world)
        before = (await world.record(iid))["events"]
        bound = world.origin.removeprefix("http://")
        for host, origin in ((bound, world.origin), (PUBLIC_HOST, PUBLIC)):
            steps = _steps(iid, host, origin, csrf, stolen_link)
            answers = await _as(AGENT, world, cookie, steps)
            for (status, page), step in zip(answers, steps, strict=True):
                assert status == 403, (host, step, status)
                assert refusal(page) == ("PEER_REFUSED", None), (host, step)
        assert (await world.record(iid))["events"] == before  # nothing recorded
        assert await world.pending() != []
        log = world.daemon.log_text()
        assert f"a session cookie of uid 0 presented by uid {AGENT}" in log
        assert f"a login token of uid 0 presented by uid {AGENT}" in log
        assert "not owner-checked" not in log  # the setting is there: no warning
        # The link the agent presented was not used up: through the proxy its operator logs in.
        [(status, _)] = await _as(
            PROXY, world, "", [["POST", "/login", PUBLIC_HOST, PUBLIC, {"token": stolen_link}]]
        )
        assert status == 200


async def test_the_declared_proxy_is_served_under_the_public_origin_only(
    tmp_path: Path, token: str
) -> None:
    async with console_world(tmp_path, token, service=BEHIND_PROXY, wait="0s") as world:
        iid = (await world.call(dict(CHARGE)))["invocation_id"]
        bound = world.origin.removeprefix("http://")
        # Under the bound name, or posting from the bound origin, the proxy is refused.
        answers = await _as(
            PROXY,
            world,
            "",
            [
                ["GET", "/login", bound, world.origin, None],
                ["POST", "/login", PUBLIC_HOST, world.origin, {"token": await _link(world)}],
            ],
        )
        assert [a[0] for a in answers] == [421, 403], answers
        assert "only as its public origin" in answers[0][1]
        assert f"the proxy's uid {PROXY} named {bound!r}" in world.daemon.log_text()
        # Under the public name: the cookie is the proof (the proxy is not the operator).
        answers = await _as(
            PROXY,
            world,
            "",
            [
                ["POST", "/login", PUBLIC_HOST, PUBLIC, {"token": await _link(world)}],
                ["GET", "/approvals", PUBLIC_HOST, PUBLIC, None],
                ["POST", f"/approvals/{iid}/approve", bound, PUBLIC, {"csrf": "CSRF"}],
                ["POST", f"/approvals/{iid}/approve", PUBLIC_HOST, PUBLIC, {"csrf": "CSRF"}],
            ],
        )
        assert [a[0] for a in answers] == [200, 200, 421, 303], [a[0] for a in answers]
        assert f"approval-{iid}" in answers[1][1]
        kinds = [e["kind"] for e in (await world.record(iid))["events"]]
        assert kinds.count("APPROVAL_GRANTED") == 1


async def test_without_the_proxy_s_user_the_daemon_warns_that_nothing_is_checked(
    tmp_path: Path, token: str
) -> None:
    public = {"console_public_origin": PUBLIC}
    async with console_world(tmp_path, token, service=public) as world:
        log = world.daemon.log_text()
        assert "are not owner-checked" in log
        assert "set [service] console_proxy_user" in log


async def test_a_peer_the_kernel_cannot_name_is_not_the_proxy(tmp_path: Path) -> None:
    """No established socket of this machine is the client's end (it closed it, or it is in
    another network namespace): the connection is not the proxy's, and is checked -- refused
    with a cookie or a login link, and the link is not used up."""
    policy = SimpleNamespace(is_operator=lambda _who: True)
    tokens = TokenStore(tmp_path / "tokens")
    console = Console(
        SimpleNamespace(operator_policy=policy),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]  # nothing is read: refused before
        tokens,
        origin="http://127.0.0.1:8470",
        public_origin=PUBLIC,
        proxy_uid=PROXY,
    )
    me = Operator.current()
    session = console.sessions.start(me)
    link, _ = tokens.mint(me)
    for host in (PUBLIC_HOST, "127.0.0.1:8470"):
        status, page = await _ask(console, "GET", "/approvals", host, cookie=session.id)
        assert (status, refusal(page)) == (403, ("PEER_REFUSED", None)), host
        status, page = await _ask(
            console, "POST", "/login", host, body=f"token={link}".encode(), origin=PUBLIC
        )
        assert (status, refusal(page)) == (403, ("PEER_REFUSED", None)), host
    who = tokens.redeem(link)  # not used up by the refusals
    assert who is not None and who.uid == me.uid


async def _ask(
    console: Console,
    method: str,
    path: str,
    host: str,
    *,
    cookie: str = "",
    body: bytes = b"",
    origin: str = "",
) -> tuple[int, bytes]:
    headers = [(b"host", host.encode())]
    if cookie:
        headers.append((b"cookie", f"{COOKIE}={cookie}".encode()))
    if origin:
        headers.append((b"origin", origin.encode()))
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 1),  # nobody's: no socket of this machine has that port
        "server": ("127.0.0.1", 8470),
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await console(scope, receive, send)
    return int(sent[0]["status"]), b"".join(m.get("body", b"") for m in sent[1:])


def _unused_uid() -> int:
    uid = 4242
    while True:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
        uid += 1


def test_the_proxy_s_user_is_resolved_when_the_config_is_loaded(tmp_path: Path) -> None:
    base = {"journal": {"path": str(tmp_path / "j.db")}}

    def load(**service: Any) -> Any:
        settings = {"console": "127.0.0.1:8470", "console_public_origin": PUBLIC, **service}
        return config_from_dict({**base, "service": settings}, base_dir=tmp_path)

    assert load(console_proxy_user="nobody").service.console_proxy_user == 65534
    assert load(console_proxy_user=65534).service.console_proxy_user == 65534
    assert load().service.console_proxy_user is None
    refusals = {
        "no-such-user-here": "no such user on this machine",
        _unused_uid(): "no such user on this machine",
        "65534": "a uid is a number",
        True: "a user name or a numeric uid",
        "": "a user name or a numeric uid",
        -1: "a user name or a numeric uid",
    }
    for value, why in refusals.items():
        with pytest.raises(ConfigError) as info:
            load(console_proxy_user=value)
        assert info.value.field == "service.console_proxy_user", value
        assert why in info.value.message, (value, info.value.message)
    # Only for a console behind a proxy, and only on loopback: a peer on another machine has
    # no row in this machine's socket table, so nothing could be told from the proxy there.
    with pytest.raises(ConfigError) as info:
        load(console_public_origin=None, console_proxy_user="nobody")
    assert info.value.field == "service.console_proxy_user"
    assert "needs console_public_origin" in info.value.message
    with pytest.raises(ConfigError) as info:
        load(console="0.0.0.0:8470", console_allow_remote=True, console_proxy_user="nobody")
    assert info.value.field == "service.console_proxy_user"
    assert "loopback console only" in info.value.message


def test_a_console_takes_a_proxy_s_user_only_on_loopback_behind_a_proxy(tmp_path: Path) -> None:
    for origin, public in (("http://0.0.0.0:8470", PUBLIC), ("http://127.0.0.1:8470", None)):
        with pytest.raises(ValueError, match="loopback console behind a proxy"):
            Console(
                None,  # type: ignore[arg-type]
                None,  # type: ignore[arg-type]
                TokenStore(tmp_path / "t"),
                origin=origin,
                public_origin=public,
                proxy_uid=PROXY,
            )


async def test_serve_refuses_the_proxy_s_user_with_a_non_loopback_console_flag(
    tmp_path: Path,
) -> None:
    config = write_daemon_config(
        tmp_path,
        {},
        socket=tmp_path / "s.sock",
        service={"console_allow_remote": True, **BEHIND_PROXY},
    )
    flag = f"0.0.0.0:{free_port()}"
    done = await run(
        [sys.executable, "-m", "affidavit", "serve", "--config", str(config), "--console", flag]
    )
    assert done.returncode == 2, done.stderr
    assert re.search(rb"console_proxy_user applies to a loopback console only", done.stderr)
    assert not (tmp_path / "s.sock").exists()
