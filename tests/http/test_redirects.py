"""Redirects: every hop is its own dispatch boundary, re-validated, and the credential never
follows to another origin (seed, "A redirect creates a second dispatch boundary")."""

from __future__ import annotations

import urllib.parse
from typing import Any

import pytest
import trio

from affidavit.adapters.base import RemoteResult
from affidavit.adapters.http import HttpClient, HttpRequest, RedirectDecision, Timeouts
from affidavit.adapters.http.classify import NOT_CONDITIONAL
from affidavit.adapters.http.redirects import (
    CHANGES_REQUEST,
    REFUSED_WITHOUT_CREDENTIAL,
    RESENDS_REQUEST,
    Plan,
    next_hop,
)
from affidavit.protocols.http.params import credential_spelling
from affidavit.statemachine import Code, Outcome

from .fakes import FakeEngine
from .hostile import HostileServer, Received, Reply, scripts

FAST = Timeouts(connect=2.0, write=2.0, read=2.0)
TOKEN = "Bearer redirect-secret-0001"
REDIRECTED = (Outcome.COMMITTED, Code.REMOTE_REDIRECTED)
QTOKEN = "qsecret-0002"


class Policy:
    """Allows any http(s) target; keeps the credential only on the original origin."""

    def __init__(self, origin: str, allow: bool = True) -> None:
        self.origin = origin
        self.allow = allow
        self.calls: list[tuple[str, str]] = []

    def __call__(self, method: str, url: str) -> RedirectDecision:
        self.calls.append((method, url))
        u = urllib.parse.urlsplit(url)
        same = f"{u.scheme}://{u.hostname}:{u.port}" == self.origin
        return RedirectDecision(self.allow, same, "" if self.allow else "target not allowed")


def req(url: str, policy: Policy, method: str = "GET", body: bytes = b"", **kw: Any) -> HttpRequest:
    return HttpRequest(
        method,
        url + ("&" if "?" in url else "?") + f"api_key={QTOKEN}",
        [("Authorization", TOKEN), ("Content-Type", "application/json")],
        body,
        credential_headers=frozenset({"authorization"}),
        credential_query="api_key",
        follow_redirects=True,
        redirect_policy=policy,
        timeouts=FAST,
        **kw,
    )


async def perform(client: HttpClient, request: HttpRequest) -> tuple[FakeEngine, RemoteResult]:
    fe = FakeEngine()
    with trio.fail_after(10):
        res = await client.perform(request, fe.ctx)
    return fe, res


def carries_credential(r: Received) -> bool:
    raw = r.target + " ".join(f"{n}: {v}" for n, v in r.headers)
    return "redirect-secret-0001" in raw or QTOKEN in raw


def by_path(routes: dict[str, Reply]) -> Any:
    return scripts.serve(lambda r: routes[urllib.parse.urlsplit(r.target).path])


async def test_redirect_within_origin_keeps_the_credential(client: HttpClient) -> None:
    routes = {
        "/old": Reply(308, headers=[("Location", "/new?x=1")]),
        "/new": Reply(200, body=b"new"),
    }
    async with HostileServer.running(by_path(routes)) as srv:
        policy = Policy(srv.origin)
        fe, res = await perform(client, req(srv.url + "/old", policy, "PUT", b"{}"))
    assert (res.outcome, res.facts["status"]) == (Outcome.COMMITTED, 200)
    assert [r.method for r in srv.requests] == ["PUT", "PUT"]  # 308 keeps method and body
    assert srv.requests[1].body == b"{}"
    assert all(carries_credential(r) for r in srv.requests)
    assert urllib.parse.parse_qs(urllib.parse.urlsplit(srv.requests[1].target).query) == {
        "x": ["1"],
        "api_key": [QTOKEN],
    }
    assert [g["hop"] for g in fe.gates] == [1, 2]
    assert fe.gates[1]["reused_connection"] is True
    assert fe.dispatched_at_gate == [False, True]
    assert policy.calls == [("PUT", srv.url + "/new?x=1")]  # credential query not shown to it
    assert [h["status"] for h in res.summary["hops"]] == [308, 200]
    assert fe.body == b"new"  # the 3xx body is not mixed into the result's stream


async def test_redirect_to_another_origin_strips_the_credential(client: HttpClient) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"other"))) as other:
        location = other.url + "/landing?from=a"
        async with HostileServer.running(scripts.redirect(location, 307)) as first:
            policy = Policy(first.origin)
            fe, res = await perform(client, req(first.url + "/start", policy, "POST", b"{}"))
    assert res.facts["status"] == 200 and fe.body == b"other"
    assert carries_credential(first.requests[0])
    assert len(other.requests) == 1 and not carries_credential(other.requests[0])
    assert other.requests[0].method == "POST" and other.requests[0].body == b"{}"
    assert policy.calls == [("POST", location)]
    assert [(g["hop"], g["origin"]) for g in fe.gates] == [(1, first.origin), (2, other.origin)]
    assert fe.gates[1]["reused_connection"] is False
    follow = fe.facts_of("follow_redirect")[0]
    assert follow["to_origin"] == other.origin and follow["credential_kept"] is False


@pytest.mark.parametrize(
    ("method", "status"),
    [("POST", 303), ("PUT", 303), ("DELETE", 303), ("PATCH", 303), ("POST", 301), ("POST", 302)],
)
async def test_a_redirect_that_would_change_the_request_is_not_followed(
    client: HttpClient, method: str, status: int
) -> None:
    """RFC 9110 would have the next hop GET without content: another request, whose 404 would
    have been read as this one's rejection (seed: "A complete ... response determines the
    outcome of the first HTTP exchange").  The 3xx is the result."""
    routes = {
        "/pay": Reply(status, headers=[("Location", "/receipt/1")], body=b"see"),
        "/receipt/1": Reply(404, body=b"no such receipt"),
    }
    async with HostileServer.running(by_path(routes)) as srv:
        policy = Policy(srv.origin)
        fe, res = await perform(client, req(srv.url + "/pay", policy, method, b'{"a":1}'))
    assert [r.method for r in srv.requests] == [method]  # no GET was sent
    assert (res.outcome, res.code, res.facts["status"]) == (*REDIRECTED, status)
    assert res.facts["redirect_not_followed"] == {
        "reason": CHANGES_REQUEST,
        "origin": srv.origin,
        "method": "GET",
    }
    assert policy.calls == [] and len(fe.gates) == 1 and fe.body == b"see"
    assert ["Location", "/receipt/1"] in res.summary["headers"]


@pytest.mark.parametrize(
    ("method", "status", "idempotent"),
    [
        ("GET", 303, ()),
        ("HEAD", 303, ()),
        ("GET", 301, ()),
        ("HEAD", 302, ()),
        ("PUT", 301, ("PUT",)),  # the target declares it idempotent: safe to send again
        ("PATCH", 307, ()),  # 307/308 ask for the same request at the Location
        ("DELETE", 308, ()),
    ],
)
async def test_a_redirect_that_keeps_the_request_is_followed(
    client: HttpClient, method: str, status: int, idempotent: tuple[str, ...]
) -> None:
    routes = {"/a": Reply(status, headers=[("Location", "/b")]), "/b": Reply(200)}
    async with HostileServer.running(by_path(routes)) as srv:
        body = b"{}" if method in ("PUT", "PATCH") else b""
        request = req(
            srv.url + "/a",
            Policy(srv.origin),
            method,
            body,
            idempotent_methods=frozenset(idempotent),
        )
        _fe, res = await perform(client, request)
    assert [(r.method, r.body) for r in srv.requests] == [(method, body)] * 2
    assert res.facts["status"] == 200 and "redirect_not_followed" not in res.facts


@pytest.mark.parametrize(
    ("method", "status"),
    [("PATCH", 302), ("PATCH", 301), ("PUT", 301), ("PUT", 302), ("DELETE", 302)],
)
async def test_a_301_or_302_is_not_followed_with_a_request_unsafe_to_send_again(
    client: HttpClient, method: str, status: int
) -> None:
    """Post/redirect/get: the PATCH was applied and answered 302 to the resource.  Sent again,
    it applies twice, and the second answer (409) would decide the first request's outcome."""
    routes = {
        "/orders/7": Reply(status, headers=[("Location", "/orders/7")], body=b"applied"),
    }
    async with HostileServer.running(by_path(routes)) as srv:
        policy = Policy(srv.origin)
        request = req(
            srv.url + "/orders/7",
            policy,
            method,
            b'{"qty":2}',
            idempotent_methods=frozenset({"GET"}),
        )
        fe, res = await perform(client, request)
    assert [r.method for r in srv.requests] == [method]  # sent once
    assert (res.outcome, res.code, res.facts["status"]) == (
        Outcome.COMMITTED,
        Code.REMOTE_REDIRECTED,
        status,
    )
    assert fe.body == b"applied"
    assert res.facts["redirect_not_followed"] == {
        "reason": RESENDS_REQUEST,
        "origin": srv.origin,
        "method": method,
    }
    assert policy.calls == [] and len(fe.gates) == 1


async def test_policy_refusal_returns_the_3xx_as_committed(client: HttpClient) -> None:
    async with HostileServer.running(scripts.redirect("http://127.0.0.1:9/x", 302)) as srv:
        policy = Policy(srv.origin, allow=False)
        fe, res = await perform(client, req(srv.url + "/", policy))
    assert (res.outcome, res.code, res.facts["status"]) == (*REDIRECTED, 302)
    assert res.facts["redirect_not_followed"]["reason"] == "target not allowed"
    assert len(fe.gates) == 1 and fe.body == b"moved"


async def test_too_many_redirects_returns_the_last_3xx_noting_the_limit(client: HttpClient) -> None:
    async with HostileServer.running(scripts.redirect("/again", 307)) as srv:
        policy = Policy(srv.origin)
        fe, res = await perform(client, req(srv.url + "/", policy, max_redirects=2))
    assert (res.outcome, res.code, res.facts["status"]) == (
        Outcome.COMMITTED,
        Code.REMOTE_REDIRECTED,
        307,
    )
    assert res.facts["redirect_limit"] == 2
    assert len(srv.requests) == 3 and len(fe.gates) == 3


async def test_redirect_hop_setup_failure_keeps_the_complete_3xx(client: HttpClient) -> None:
    async with HostileServer.running(scripts.redirect("http://127.0.0.1:1/x", 307)) as srv:
        fe, res = await perform(client, req(srv.url + "/", Policy(srv.origin)))
    assert (res.outcome, res.code, res.facts["status"]) == (
        Outcome.COMMITTED,
        Code.REMOTE_REDIRECTED,
        307,
    )
    assert res.facts["redirect_not_followed"] == {
        "hop": 2,
        "code": "CONNECTION_REFUSED",
        "stage": "tcp_connect",
    }
    assert fe.machine.state == "redirect_setup_failed" and len(fe.gates) == 1
    assert fe.body == b"moved"


async def test_after_a_hop_setup_failure_the_result_is_the_last_3xx_the_credential_reached(
    client: HttpClient,
) -> None:
    """Target 307 -> other origin 307 (sent without the credential) -> a hop that cannot be set
    up: as after a refusal, the target's own 307 is the result -- the other origin's answered a
    request without the credential, no request the caller made (one rule for both, client.py)."""
    routes = {"/a": Reply(307, headers=[("Location", "/placeholder")], body=b"first")}
    async with (
        HostileServer.running(by_path(routes)) as first,
        HostileServer.running(scripts.redirect("http://127.0.0.1:1/x", 307)) as other,
    ):
        routes["/a"] = Reply(307, headers=[("Location", other.url + "/x")], body=b"first")
        fe, res = await perform(client, req(first.url + "/a", Policy(first.origin), "PUT"))
    assert len(other.requests) == 1 and not carries_credential(other.requests[0])
    assert (res.outcome, res.code, res.facts["status"]) == (*REDIRECTED, 307)
    assert res.hop == 1 and fe.body == b"first"
    assert [h["origin"] for h in res.summary["hops"]] == [first.origin]
    assert res.facts["redirects"] == 0
    assert res.facts["redirect_not_followed"] == {
        "hop": 3,
        "code": "CONNECTION_REFUSED",
        "stage": "tcp_connect",
    }


async def test_without_a_policy_redirects_are_not_followed(client: HttpClient) -> None:
    async with HostileServer.running(scripts.redirect("/next", 301)) as srv:
        request = req(srv.url + "/", Policy(srv.origin))
        request.redirect_policy = None
        _fe, res = await perform(client, request)
    assert res.facts["status"] == 301
    assert res.facts["redirect_not_followed"]["reason"] == "no redirect policy"


@pytest.mark.parametrize("location", ["ftp://127.0.0.1/x", "http://user:pw@127.0.0.1:1/"])
async def test_unsupported_redirect_targets_are_not_followed(
    client: HttpClient, location: str
) -> None:
    async with HostileServer.running(scripts.redirect(location, 302)) as srv:
        policy = Policy(srv.origin)
        _fe, res = await perform(client, req(srv.url + "/", policy))
    assert res.facts["status"] == 302 and policy.calls == []
    assert "redirect_not_followed" in res.facts


@pytest.mark.parametrize(
    "location",
    [
        b"/caf\xe9",  # a raw Latin-1 / UTF-8 path, as some servers send
        b"/a b",
        b"http://fa\xdf.test/x",  # a name whose IDNA encodings disagree (fass / xn--fa-hia)
        b"/x\x7f",
    ],
)
async def test_a_location_that_is_not_visible_ascii_is_not_followed(
    client: HttpClient, location: bytes
) -> None:
    header: Any = ("Location", location)
    async with HostileServer.running(scripts.serve(Reply(302, headers=[header]))) as srv:
        policy = Policy(srv.origin)
        _fe, res = await perform(client, req(srv.url + "/", policy))
    assert res.facts["status"] == 302 and policy.calls == []
    assert len(srv.requests) == 1
    assert res.facts["redirect_not_followed"]["reason"] == "URL must be visible ASCII"


@pytest.mark.parametrize(
    "echo",
    [
        # A login redirect that quotes the whole request URL back (query injection).
        lambda first: (
            "return_to=" + urllib.parse.quote(f"{first.url}/start?api_key={QTOKEN}", safe="")
        ),
        lambda first: (
            "return_to="
            + urllib.parse.quote(urllib.parse.quote(f"/start?api_key={QTOKEN}", safe=""), safe="")
        ),
        lambda first: "token=redirect-secret-0001",  # the Authorization value echoed
        lambda first: f"API_KEY={QTOKEN}",  # another spelling of the credential parameter
    ],
)
async def test_a_location_that_carries_the_credential_is_not_followed_elsewhere(
    client: HttpClient, echo: Any
) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"other"))) as other:
        first_box: list[HostileServer] = []

        def route(r: Any) -> Reply:
            location = f"{other.url}/login?{echo(first_box[0])}"
            return Reply(302, headers=[("Location", location)])

        async with HostileServer.running(scripts.serve(route)) as first:
            first_box.append(first)
            policy = Policy(first.origin)
            _fe, res = await perform(client, req(first.url + "/start", policy))
    assert other.requests == [] and other.connections == 0
    assert res.facts["status"] == 302
    assert res.facts["redirect_not_followed"]["reason"] == "the Location carries the credential"


@pytest.mark.parametrize("status", [401, 403, 404, 429, 503])
async def test_a_refusal_of_a_hop_sent_without_the_credential_leaves_the_3xx_as_the_result(
    client: HttpClient, status: int
) -> None:
    """The other origin was sent the request without the credential: its 401 does not say
    these credentials were rejected, nor its 429 that this request was throttled."""
    refusal = Reply(status, headers=[("Retry-After", "1")], body=b"who are you")
    async with HostileServer.running(scripts.serve(refusal)) as other:
        location = other.url + "/elsewhere"
        async with HostileServer.running(scripts.redirect(location, 307)) as first:
            fe, res = await perform(client, req(first.url + "/start", Policy(first.origin), "PUT"))
    assert len(other.requests) == 1 and not carries_credential(other.requests[0])
    assert (res.outcome, res.code, res.facts["status"]) == (*REDIRECTED, 307)
    assert res.facts["redirect_not_followed"] == {
        "reason": REFUSED_WITHOUT_CREDENTIAL,
        "hop": 2,
        "method": "PUT",
        "origin": other.origin,
        "status": status,
    }
    assert [h["origin"] for h in res.summary["hops"]] == [first.origin]
    assert fe.body == b"moved"  # the refusal's body is read past, never stored


async def test_a_refusal_of_a_hop_that_kept_the_credential_is_the_result(
    client: HttpClient,
) -> None:
    routes = {"/a": Reply(307, headers=[("Location", "/b")]), "/b": Reply(401, body=b"no")}
    async with HostileServer.running(by_path(routes)) as srv:
        fe, res = await perform(client, req(srv.url + "/a", Policy(srv.origin), "PUT"))
    assert all(carries_credential(r) for r in srv.requests) and len(srv.requests) == 2
    assert (res.outcome, res.facts["status"]) == (Outcome.REJECTED, 401)
    assert "redirect_not_followed" not in res.facts and fe.body == b"no"


async def test_a_refusal_after_a_redirect_of_a_request_without_credential_is_the_result(
    client: HttpClient,
) -> None:
    """Nothing was dropped: the refusal answers the request as the caller made it."""
    async with HostileServer.running(scripts.serve(Reply(403, body=b"no"))) as other:
        location = other.url + "/x"
        async with HostileServer.running(scripts.redirect(location, 307)) as first:
            request = HttpRequest(
                "PUT",
                first.url + "/start",
                [],
                b"{}",
                follow_redirects=True,
                redirect_policy=Policy(first.origin),
                timeouts=FAST,
            )
            _fe, res = await perform(client, request)
    assert len(other.requests) == 1
    assert (res.outcome, res.facts["status"]) == (Outcome.REJECTED, 403)


def _refusing(head: bytes, body: bytes, *, then_stall: bool) -> Any:
    """Read the request, send ``head`` and ``body`` (a client that closes cuts it short), then
    stall with the connection open or close it."""

    async def script(peer: Any) -> None:
        if await peer.read_request() is None:
            return
        await peer.send_raw(head + body)
        if then_stall:
            await trio.sleep_forever()

    return script


@pytest.mark.parametrize(
    ("head", "body_size", "stall"),
    [
        # A body far past max_result: read to the end it was RESULT_SIZE_LIMIT (unknown) for
        # bytes never stored.
        (b"HTTP/1.1 404 Not Found\r\nContent-Length: 3145728\r\n\r\n", 3 << 20, False),
        # A body that stalls: read to the end it was unknown at the read deadline.
        (b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 1000\r\n\r\n", 7, True),
        # The whole refusal in the head's read: h11 has fired ``end`` (framing_complete) before
        # the exchange stops at the head; the record read the 401 as a complete response.
        (b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n", 0, False),
    ],
    ids=["404-body-past-max_result", "401-body-stalls", "401-empty-body-with-its-head"],
)
async def test_a_refused_hop_is_read_to_its_head_only_and_its_connection_closed(
    client: HttpClient, head: bytes, body_size: int, stall: bool
) -> None:
    body = b"x" * body_size
    async with HostileServer.running(_refusing(head, body, then_stall=stall)) as other:
        location = other.url + "/elsewhere"
        async with HostileServer.running(scripts.redirect(location, 307)) as first:
            fe = FakeEngine()
            fe.ctx.result_limit = 1 << 20
            request = req(first.url + "/start", Policy(first.origin), "PUT", b"{}")
            with trio.fail_after(10):
                res = await client.perform(request, fe.ctx)
    assert (res.outcome, res.code, res.facts["status"]) == (*REDIRECTED, 307)
    assert res.facts["redirect_not_followed"]["status"] == int(head.split()[1])
    assert fe.machine.state == "redirect_refused" and fe.body == b"moved"
    assert client.idle_connections() == 1  # the first origin's; the refusing one was closed


async def test_after_a_refusal_the_result_is_the_last_3xx_the_credential_reached(
    client: HttpClient,
) -> None:
    """Target 307 -> other origin 307 -> back to the target without the Authorization header
    (dropped at the other origin; only a query credential is put back): its 401 decides
    nothing, and the other origin's 307 answered no request the caller made -- the target's own
    307 is the result."""
    routes = {
        "/a": Reply(307, headers=[("Location", "/placeholder")], body=b"first"),
        "/b": Reply(401, body=b"who are you"),
    }
    async with HostileServer.running(by_path(routes)) as first:
        back = first.url + "/b"
        async with HostileServer.running(scripts.redirect(back, 307)) as other:
            routes["/a"] = Reply(307, headers=[("Location", other.url + "/x")], body=b"first")
            request = HttpRequest(
                "PUT",
                first.url + "/a",
                [("Authorization", TOKEN)],
                b"{}",
                credential_headers=frozenset({"authorization"}),
                follow_redirects=True,
                redirect_policy=Policy(first.origin),
                timeouts=FAST,
            )
            fe, res = await perform(client, request)
    assert [urllib.parse.urlsplit(r.target).path for r in first.requests] == ["/a", "/b"]
    assert carries_credential(first.requests[0]) and not carries_credential(first.requests[1])
    assert (res.outcome, res.code, res.facts["status"]) == (*REDIRECTED, 307)
    assert res.hop == 1 and fe.body == b"first"
    assert [h["origin"] for h in res.summary["hops"]] == [first.origin]
    assert res.facts["redirects"] == 0
    assert res.facts["redirect_not_followed"] == {
        "reason": REFUSED_WITHOUT_CREDENTIAL,
        "hop": 3,
        "method": "PUT",
        "origin": first.origin,
        "status": 401,
    }


async def test_a_hop_back_into_scope_carrying_only_the_query_credential_decides(
    client: HttpClient,
) -> None:
    """The header was dropped at the other origin, the query credential put back: the hop
    carried the credential (``_carries``, its query half), so its 401 is the result."""
    routes = {"/b": Reply(401, body=b"rejected")}
    async with (
        HostileServer.running(by_path(routes)) as first,
        HostileServer.running(scripts.redirect(first.url + "/b", 307)) as other,
    ):
        routes["/a"] = Reply(307, headers=[("Location", other.url + "/x")])
        fe, res = await perform(client, req(first.url + "/a", Policy(first.origin), "PUT"))
    back = first.requests[1]
    assert QTOKEN in back.target and "redirect-secret-0001" not in str(back.headers)
    assert (res.outcome, res.code, res.facts["status"]) == (
        Outcome.REJECTED,
        Code.REMOTE_REJECTED,
        401,
    )
    assert "redirect_not_followed" not in res.facts and fe.body == b"rejected"


async def test_a_query_credential_dropped_on_the_way_makes_a_refusal_decide_nothing(
    client: HttpClient,
) -> None:
    """Only a query credential: the hop to another origin goes without it (``_carries``
    computes that from the URL), so that origin's 401 is no rejection of it."""
    async with (
        HostileServer.running(scripts.serve(Reply(401, body=b"no"))) as other,
        HostileServer.running(scripts.redirect(other.url + "/x", 307)) as first,
    ):
        request = HttpRequest(
            "PUT",
            first.url + f"/a?api_key={QTOKEN}",
            [],
            b"{}",
            credential_query="api_key",
            follow_redirects=True,
            redirect_policy=Policy(first.origin),
            timeouts=FAST,
        )
        _fe, res = await perform(client, request)
    assert QTOKEN not in other.requests[0].target
    assert (res.outcome, res.code, res.facts["status"]) == (*REDIRECTED, 307)
    assert res.facts["redirect_not_followed"]["status"] == 401


@pytest.mark.parametrize("status", [301, 302, 307, 308])
async def test_a_304_on_a_followed_hop_is_no_answer_to_the_callers_validators(
    client: HttpClient, status: int
) -> None:
    """The caller's ``If-None-Match`` names its copy of ``/doc``; followed to ``/moved`` it is
    sent on, and a 304 there would say the caller's copy of another resource is current.
    Only the caller's own request (the first hop) makes a 304 a clean result."""
    routes = {
        "/doc": Reply(status, headers=[("Location", "/moved")]),
        "/moved": Reply(304),
        "/plain": Reply(304),
    }
    async with HostileServer.running(by_path(routes)) as srv:
        policy = Policy(srv.url)
        conditional = req(srv.url + "/doc", policy)
        conditional.headers.append(("If-None-Match", '"v1"'))
        _fe, res = await perform(client, conditional)
        first = req(srv.url + "/plain", policy)
        first.headers.append(("If-None-Match", '"v1"'))
        _fe, direct = await perform(client, first)
    hops = [urllib.parse.urlsplit(r.target).path for r in srv.requests]
    assert hops == ["/doc", "/moved", "/plain"]
    assert ("If-None-Match", '"v1"') in srv.requests[1].headers  # sent on with the hop
    assert (res.outcome, res.code, res.facts["status"]) == (*REDIRECTED, 304)
    assert res.facts["redirect_not_followed"] == {"reason": NOT_CONDITIONAL}
    assert (direct.outcome, direct.code, direct.facts["status"]) == (Outcome.COMMITTED, None, 304)


@pytest.mark.parametrize("names", [True, False])
def test_a_followed_hop_loses_every_spelling_of_the_credential_parameter(names: bool) -> None:
    """``HttpRequest.credential_query_names``: the binding's policy refuses such a Location to
    the target's origin before this (``params.check_request_query``), but the driver used with
    another policy puts the credential back beside a caller's spelling only without it."""
    request = HttpRequest(
        method="GET",
        url="https://h.example/api/x?api_key=SECRET",
        headers=[],
        credential_query="api_key",
        credential_query_names=credential_spelling("api_key") if names else None,
    )
    plan = Plan(next_url="https://h.example/api/y?API_KEY=attacker&a=1", keep_credential=True)
    hop = next_hop(request, plan, "GET", [], b"")
    query = urllib.parse.parse_qsl(urllib.parse.urlsplit(hop.url).query)
    if names:
        assert query == [("a", "1"), ("api_key", "SECRET")]
    else:  # the exact name only: the shadowing spelling stays beside the credential
        assert ("API_KEY", "attacker") in query
