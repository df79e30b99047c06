"""Where the binding's redirect policy lets the credential go: a redirect's host is compared
as it is connected to, and its path must stay in the base path.

Seed: "Do not forward authorization credentials across origins."  The binding's redirect policy
compares a Location's origin with the target's after normalizing its host (``check_host``:
Python's IDNA 2003 codec), and keeps the credential when they match.  The driver connects to the
host as the Location spelled it, and trio encodes a non-ASCII name with UTS 46 (IDNA 2008): for
``faß`` the two disagree (``fass`` vs ``xn--fa-hia``), so a hostile remote could send the
credential to a host other than the one the policy approved.
"""

from __future__ import annotations

import socket
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.adapters.http import HttpClient
from affidavit.config import load_config
from affidavit.protocols.actions import parse_action
from affidavit.protocols.http import HttpBinding
from affidavit.secrets.credentials import Credential

from ..http.fakes import FakeEngine
from ..http.hostile import HostileServer, Reply, scripts
from .helpers import http_target, write_config

SECRET = "idna-canary-7f3e0c2a91"


class PortResolver(trio.abc.HostnameResolver):
    """Maps test names to loopback servers (address and port); every other name fails."""

    def __init__(self, names: dict[str, int]) -> None:
        self.names = names
        self.lookups: list[str] = []

    async def getaddrinfo(self, host: Any, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        name = host.decode("ascii") if isinstance(host, bytes) else str(host)
        self.lookups.append(name)
        if name not in self.names:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return socket.getaddrinfo("127.0.0.1", self.names[name], type=socket.SOCK_STREAM)

    async def getnameinfo(self, sockaddr: Any, flags: int) -> tuple[str, str]:
        raise NotImplementedError


async def test_a_non_ascii_redirect_host_never_takes_the_credential_elsewhere(
    tmp_path: Path,
) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"elsewhere"))) as other:
        port_holder: dict[str, int] = {}

        def route(r: Any) -> Reply:
            if urllib.parse.urlsplit(r.target).path == "/api/start":
                # Header values are bytes on the wire; the driver reads them as Latin-1.
                location: Any = f"http://fa\u00df.test:{port_holder['port']}/api/next"
                return Reply(302, headers=[("Location", location.encode("latin-1"))])
            return Reply(200, body=b"same host")

        async with HostileServer.running(scripts.serve(route)) as first:
            port_holder["port"] = first.port
            resolver = PortResolver(
                {"fass.test": first.port, "xn--fa-hia.test": other.port},
            )
            cfg = load_config(
                write_config(
                    tmp_path,
                    {
                        "t": http_target(
                            f"http://fass.test:{first.port}/api",
                            credential="env:X",
                            follow_redirects=True,
                            trust_cleartext=True,
                        )
                    },
                )
            )
            action = parse_action({"target": "t", "method": "GET", "path": "/start"}, cfg)
            prepared = HttpBinding().prepare(
                action, cfg.targets["t"], Credential("env:X", SECRET.encode(), "v1"), None, {}
            )
            previous = trio.socket.set_custom_hostname_resolver(resolver)
            try:
                async with HttpClient() as client:
                    fe = FakeEngine()
                    with trio.fail_after(10):
                        res = await client.perform(prepared.request, fe.ctx)
            finally:
                trio.socket.set_custom_hostname_resolver(previous)
    sent = [" ".join(f"{n}: {v}" for n, v in r.headers) + r.target for r in other.requests]
    assert not any(SECRET in s for s in sent), "credential sent to a host the policy never saw"
    assert res.facts["status"] == 302
    assert res.facts["redirect_not_followed"]["reason"] == "URL must be visible ASCII"
    assert resolver.lookups == ["fass.test"] and other.connections == 0


async def test_a_trailing_dot_redirect_host_never_takes_the_credential_elsewhere(
    tmp_path: Path,
) -> None:
    """``http://intranet.:PORT`` is the target's origin to a comparison without the dot, but
    another DNS query (no search list) to the connection: the resolver here answers it with
    another server.  Not followed: the 307 is the result."""
    async with (
        HostileServer.running(scripts.serve(Reply(200, body=b"elsewhere"))) as other,
        HostileServer.running(scripts.serve(Reply(200))) as first,
    ):
        first.script = scripts.redirect(f"http://intranet.:{first.port}/api/next")
        resolver = PortResolver({"intranet": first.port, "intranet.": other.port})
        target = http_target(
            f"http://intranet:{first.port}/api",
            credential="env:X",
            follow_redirects=True,
            trust_cleartext=True,
        )
        cfg = load_config(write_config(tmp_path, {"t": target}))
        action = parse_action({"target": "t", "method": "GET", "path": "/start"}, cfg)
        prepared = HttpBinding().prepare(
            action, cfg.targets["t"], Credential("env:X", SECRET.encode(), "v1"), None, {}
        )
        previous = trio.socket.set_custom_hostname_resolver(resolver)
        try:
            async with HttpClient() as client:
                with trio.fail_after(10):
                    res = await client.perform(prepared.request, FakeEngine().ctx)
        finally:
            trio.socket.set_custom_hostname_resolver(previous)
    assert res.facts["status"] == 307
    assert res.facts["redirect_not_followed"]["reason"] == "URL host must not end in a dot"
    assert resolver.lookups == ["intranet"] and other.connections == 0
    # and the binding's own policy does not count it as the target's origin either
    assert prepared.request.redirect_policy is not None
    assert not prepared.request.redirect_policy(
        "GET", f"http://intranet.:{first.port}/api/x"
    ).allowed


def test_a_redirect_from_https_to_http_on_the_same_host_drops_the_credential(
    tmp_path: Path,
) -> None:
    """The scheme is part of the origin: ``http://`` on the target's host is another origin --
    followed only when listed in ``redirect_origins``, and never with the credential (the
    policy's part, as main had it: pinned here).  New on this branch: off the machine, that
    listed origin is reached only on the operator's ``trust_cleartext``, which the binding hands
    the driver (``HttpRequest.trust_cleartext``; the driver refuses the hop without it:
    tests/http/test_network_trust.py, tests/broker/test_proxy_evidence.py)."""
    rows = (
        ([], {}, False),
        (["http://api.example.com"], {}, True),
        (["http://api.example.com"], {"trust_cleartext": True}, True),
    )
    for listed, more, allowed in rows:
        target = http_target(
            "https://api.example.com/api",
            credential="env:X",
            follow_redirects=True,
            redirect_origins=listed,
            **more,
        )
        cfg = load_config(write_config(tmp_path, {"t": target}))
        action = parse_action({"target": "t", "method": "GET", "path": "/x"}, cfg)
        request = (
            HttpBinding()
            .prepare(action, cfg.targets["t"], Credential("env:X", SECRET.encode(), "v1"), None, {})
            .request
        )
        policy = request.redirect_policy
        assert policy is not None
        decision = policy("GET", "http://api.example.com/api/next")
        assert (decision.allowed, decision.keep_credential) == (allowed, False)
        assert policy("GET", "https://api.example.com/api/next").keep_credential
        assert request.trust_cleartext is bool(more)


def _policy(tmp_path: Path) -> Any:
    cfg = load_config(
        write_config(
            tmp_path,
            {"t": http_target("http://127.0.0.1:9/api", credential="env:X", follow_redirects=True)},
        )
    )
    action = parse_action({"target": "t", "method": "GET", "path": "/x"}, cfg)
    prepared = HttpBinding().prepare(
        action, cfg.targets["t"], Credential("env:X", SECRET.encode(), "v1"), None, {}
    )
    return prepared.request.redirect_policy


@pytest.mark.parametrize(
    "path",
    [
        "/api/%2e%2e/admin",
        "/api/%2E%2E",
        "/api/..%2fadmin",
        "/api/x/..%5C..%5Cadmin",
        "/api/./x",
        "/api/..;/admin",  # ".." to a server that drops path parameters first (Tomcat)
        "/api/x/..;y=1/..;/admin",
        "/api/..%3B/admin",
        # the readings segments.py takes (audit48 #6): padded, decoded twice, overlong,
        # full-width, IIS's %u -- each is a way out of /api to some server
        "/api/..%20/admin",
        "/api/..%00/admin",
        "/api/%252e%252e/admin",
        "/api/%c0%ae%c0%ae/admin",
        "/api/%ef%bc%8e%ef%bc%8e/admin",
        "/api/%u002e%u002e/admin",
        # a decoded "?" or "#" ends the name: mod_rewrite's [P] forwards "..?x" unescaped
        "/api/..%3F",
        "/api/..%3Fx",
        "/api/..%23",
        "/api/%252e%252e%253F",
    ],
)
def test_a_same_origin_redirect_that_climbs_out_of_the_base_path_drops_the_credential(
    tmp_path: Path, path: str
) -> None:
    """The caller may not send "." or ".." segments, also percent-encoded (a server normalizes
    them away, RFC 3986 §5.2.4); a redirect inside the origin may, but then it is not in the
    base path the credential is scoped to."""
    decision = _policy(tmp_path)("GET", "http://127.0.0.1:9" + path)
    assert decision.allowed and not decision.keep_credential


def test_a_same_origin_redirect_inside_the_base_path_keeps_the_credential(tmp_path: Path) -> None:
    policy = _policy(tmp_path)
    for path in ("/api", "/api/", "/api/v1/items?x=%2e%2e", "/api/a%2Fb", "/api/a;..=1/b"):
        assert policy("GET", "http://127.0.0.1:9" + path).keep_credential, path
    assert not policy("GET", "http://127.0.0.1:9/apix").keep_credential
