"""Canary secrets: the credential never reaches evidence, exceptions, logs, or another origin
(seed: "Do not put credential contents into either the error or the action record")."""

from __future__ import annotations

import logging
import urllib.parse
from typing import Any

import pytest
import trio

from affidavit.adapters.base import AttemptInterrupted, SetupError
from affidavit.adapters.http import HttpClient, HttpRequest, RedirectDecision, Timeouts
from affidavit.adapters.http.exchange import _Head
from affidavit.adapters.http.redirects import Plan, next_hop
from affidavit.adapters.http.urls import parse_url

from .fakes import FakeEngine
from .hostile import HostileServer, Peer, Reply, scripts

CANARY = "canary-7f3a9c1e5b2d"


def request(url: str, **kw: Any) -> HttpRequest:
    sep = "&" if "?" in url else "?"
    return HttpRequest(
        "POST",
        f"{url}{sep}api_key={CANARY}",
        [("X-Api-Key", CANARY), ("Authorization", f"Bearer {CANARY}")],
        b"{}",
        credential_headers=frozenset({"x-api-key", "authorization"}),
        credential_query="api_key",
        timeouts=Timeouts(connect=2.0, write=2.0, read=2.0),
        **kw,
    )


def same_origin_only(origin: str) -> Any:
    def policy(method: str, url: str) -> RedirectDecision:
        u = urllib.parse.urlsplit(url)
        return RedirectDecision(True, f"{u.scheme}://{u.hostname}:{u.port}" == origin)

    return policy


def assert_clean(*things: Any) -> None:
    for t in things:
        assert CANARY not in str(t), t
        assert CANARY not in repr(t), t


@pytest.fixture(autouse=True)
def _debug_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)


async def test_canary_never_leaks_through_a_hostile_cross_origin_redirect(
    client: HttpClient, caplog: pytest.LogCaptureFixture
) -> None:
    b_reply = Reply(
        200,
        headers=[("X-Request-Id", f"id-{CANARY}"), ("X-Echo", CANARY), ("Set-Cookie", "s=1")],
        body=b"done",
        reason=f"OK {CANARY}".encode(),
    )
    async with HostileServer.running(scripts.serve(b_reply)) as b:
        # The hostile origin echoes the credential back and asks the client to carry it on.
        a_reply = Reply(
            307,
            headers=[("Location", f"{b.url}/land?api_key={CANARY}"), ("X-Echo", CANARY)],
            body=CANARY.encode(),
            reason=f"Moved {CANARY}".encode(),
        )
        async with HostileServer.running(scripts.serve(a_reply)) as a:
            fe = FakeEngine()
            with trio.fail_after(10):
                res = await client.perform(
                    request(
                        a.url + "/start",
                        follow_redirects=True,
                        redirect_policy=same_origin_only(a.origin),
                    ),
                    fe.ctx,
                )
    assert res.facts["status"] == 200
    assert CANARY in a.requests[0].target  # sanity: the canary was really injected
    for r in b.requests:
        assert_clean(r.target, r.headers, r.body)
    assert_clean(fe.observed, fe.gates, res.facts, res.summary, caplog.text)
    assert res.facts["remote_request_id"] == "[redacted]"
    names = [n.lower() for n, _ in res.summary["headers"]]
    assert "x-echo" not in names and "set-cookie" not in names and "content-length" in names


async def test_canary_never_leaks_through_errors(
    client: HttpClient, caplog: pytest.LogCaptureFixture
) -> None:
    async def cut(peer: Peer) -> None:
        await peer.read_request()
        await peer.send_raw(
            f"HTTP/1.1 200 {CANARY}\r\nX-Echo: {CANARY}\r\n"
            f"Content-Length: 99\r\n\r\n{CANARY}".encode()
        )
        await peer.close()

    errors: list[BaseException] = []
    async with HostileServer.running(cut) as srv:
        fe = FakeEngine()
        with trio.fail_after(10), pytest.raises(AttemptInterrupted) as info:
            await client.perform(request(srv.url + "/"), fe.ctx)
        errors.append(info.value)
    ps = f'hostile; error=destination_unavailable; details="tried /?api_key={CANARY}"'
    async with HostileServer.running(scripts.forward_proxy(error=502, proxy_status=ps)) as proxy:
        fe2 = FakeEngine()
        with trio.fail_after(10), pytest.raises(AttemptInterrupted) as info2:
            await client.perform(request("http://origin.example/", proxy=proxy.url), fe2.ctx)
        errors.append(info2.value)
    assert CANARY in proxy.requests[0].target  # a forward proxy sees plain-HTTP requests
    fe3 = FakeEngine()
    with trio.fail_after(10), pytest.raises(SetupError) as info3:
        await client.perform(request("http://canary-host.invalid/"), fe3.ctx)
    errors.append(info3.value)
    for e in errors:
        assert_clean(e, e.args, getattr(e, "facts", None), getattr(e, "detail", None))
    assert_clean(fe.observed, fe2.observed, fe3.observed, caplog.text)
    assert info2.value.facts["proxy_status"][0]["details"] == "[redacted]"


@pytest.mark.parametrize(
    "authorization", [f"Bearer {CANARY}", "Basic Y2FuYXJ5OmNhbmFyeS03ZjNhOWMxZTViMmQ="]
)
async def test_the_scheme_word_of_the_credential_is_not_a_secret(authorization: str) -> None:
    """Only the credential is withheld: a 401's ``WWW-Authenticate: Bearer realm=...`` -- the
    evidence of why the call was refused -- stays in the result, and a redirect to a page named
    "Basic" is not taken for an echo of the credential."""
    challenge = ("WWW-Authenticate", 'Bearer realm="api", Basic realm="api"')
    async with HostileServer.running(scripts.serve(Reply(401, headers=[challenge]))) as srv:
        req = HttpRequest(
            "GET",
            srv.url + "/",
            [("Authorization", authorization)],
            credential_headers=frozenset({"authorization"}),
            timeouts=Timeouts(connect=2.0, write=2.0, read=2.0),
        )
        async with HttpClient() as client:
            with trio.fail_after(10):
                res = await client.perform(req, FakeEngine().ctx)
    assert list(challenge) in res.summary["headers"]


def test_no_driver_value_that_holds_the_credential_prints_it() -> None:
    """The driver's own values that carry the injected credential -- the parsed URL (its query),
    the request head as it will be written, a redirect's next request with the credential kept
    -- show none of it in ``repr``/``str``: a debug line, an assertion message or a traceback
    printer that shows locals would otherwise print it."""
    req = request("http://origin.example/p")
    url = parse_url(req.url)
    head = _Head(url.path_query, list(req.headers), True, False)
    plan = Plan(disposition="follow", next_url="http://origin.example/q", keep_credential=True)
    nxt = next_hop(req, plan, "POST", list(req.headers), b"{}")
    assert CANARY in url.path_query and CANARY in nxt.url  # sanity: they do hold it
    assert any(CANARY in v for _, v in nxt.headers)
    assert_clean(req, url, head, nxt, plan)
