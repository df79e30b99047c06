"""A redirect never lets an answer to another request decide the caller's action.

Seed: "A redirect creates a second dispatch boundary.  A complete 307 or 308 response
determines the outcome of the first HTTP exchange, but following it creates a new request";
"A complete 401 proves that the server rejected these credentials for the request".  A 303 --
or a POST's 301/302 -- would be followed with a GET without content, so the GET's 404 would make
a payment that may have been made read ``rejected``/``after_correction``, and a caller that
corrects and resends pays twice; a PATCH's 301/302 would send the PATCH again.  A hop to another
origin is sent without the credential, so its 401 says nothing of the credential.  The 3xx that
stands is the server's complete answer; whether the server acted on the request is not recorded:
REMOTE_REDIRECTED, ``reconcile``.
"""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.adapters.http.redirects import (
    CHANGES_REQUEST,
    REFUSED_WITHOUT_CREDENTIAL,
    RESENDS_REQUEST,
)
from affidavit.statemachine import EventKind
from tests.http.hostile import HostileServer, Peer, Received, Reply, scripts

from .helpers import (
    assert_ok,
    assert_redirected,
    http_target,
    open_broker,
    stalled_call,
    write_config,
)
from .http_rows import LIMIT

PAY = {"target": "api", "method": "POST", "path": "/pay", "body": '{"amount":100}'}
BATCH = {
    "items": "json:/results",
    "request_items": "json:/items",
    "item_id": "json:/id",
    "item_status": "json:/status",
    "ok": [200, 201],
}
ITEMS = [{"id": n, "op": "set"} for n in (1, 2)]
REJECTED_ITEMS = json.dumps({"results": [{"id": n, "status": 422} for n in (1, 2)]}).encode()


def _routes(status: int, then: Reply) -> Any:
    """``/pay`` and ``/batch`` answer ``status`` to ``/receipt/1``, which answers ``then``."""

    def route(r: Received) -> Reply:
        if urllib.parse.urlsplit(r.target).path == "/receipt/1":
            return then
        return Reply(status, headers=[("Location", "/receipt/1")], body=b"see other")

    return scripts.serve(route)


async def _call(
    tmp_path: Path, url: str, action: dict[str, Any], *, redirected: bool = True, **target: Any
) -> Any:
    """``redirected``: the result is a 3xx -- committed, never rejected, and no success either
    (REMOTE_REDIRECTED / reconcile); else committed with no error."""
    cfg = write_config(tmp_path, {"api": http_target(url, follow_redirects=True, **target)})
    async with open_broker(cfg) as broker:
        with trio.fail_after(LIMIT):
            env = await broker.call(action)
        rec = assert_redirected(broker, env) if redirected else assert_ok(broker, env)
        return env, rec


@pytest.mark.parametrize("status", [303, 301, 302])
async def test_a_post_redirected_to_a_get_is_answered_by_its_own_3xx(
    tmp_path: Path, token: str, status: int
) -> None:
    async with HostileServer.running(_routes(status, Reply(404, body=b"gone"))) as srv:
        env, rec = await _call(tmp_path, srv.url, PAY)
    assert [r.method for r in srv.requests] == ["POST"]  # the GET was never sent
    assert env["result"]["status"] == status and env["result"]["body"] == "see other"
    assert env["evidence"]["redirect_not_followed"] == {
        "reason": CHANGES_REQUEST,
        "origin": srv.origin,
        "method": "GET",
    }
    assert rec.evidence["status"] == status


def _orders(status: int) -> Any:
    """Post/redirect/get: the first request to ``/orders/7`` is applied and answered ``status``
    to ``/orders/7``; the same request again conflicts (409)."""
    seen: list[str] = []

    def route(r: Received) -> Reply:
        seen.append(r.method)
        if r.method in ("GET", "HEAD") or len(seen) == 1:
            return Reply(status, headers=[("Location", "/orders/7")], body=b"applied")
        return Reply(409, body=b"already applied")

    return scripts.serve(route)


async def test_a_patch_answered_302_is_sent_once_and_answered_by_its_302(
    tmp_path: Path, token: str
) -> None:
    call = {"target": "api", "method": "PATCH", "path": "/orders/7", "body": '{"qty":2}'}
    async with HostileServer.running(_orders(302)) as srv:
        env, _rec = await _call(tmp_path, srv.url, call, methods=["GET", "PATCH"])
    assert [r.method for r in srv.requests] == ["PATCH"]  # never applied a second time
    assert env["result"]["status"] == 302 and env["result"]["body"] == "applied"
    assert env["evidence"]["redirect_not_followed"] == {
        "reason": RESENDS_REQUEST,
        "origin": srv.origin,
        "method": "PATCH",
    }


async def test_a_put_the_target_declares_idempotent_follows_a_301(
    tmp_path: Path, token: str
) -> None:
    routes = {"/a": Reply(301, headers=[("Location", "/b")]), "/b": Reply(200, body=b"put")}
    script = scripts.serve(lambda r: routes[urllib.parse.urlsplit(r.target).path])
    call = {"target": "api", "method": "PUT", "path": "/a", "body": "{}"}
    async with HostileServer.running(script) as srv:
        env, _rec = await _call(
            tmp_path, srv.url, call, redirected=False, idempotent=["GET", "PUT"]
        )
    assert [r.method for r in srv.requests] == ["PUT", "PUT"]
    assert env["result"]["status"] == 200 and env["result"]["body"] == "put"


async def test_a_batch_redirected_to_a_get_takes_no_item_outcome_from_the_get(
    tmp_path: Path, token: str
) -> None:
    call = {
        "target": "api",
        "method": "POST",
        "path": "/batch",
        "body": json.dumps({"items": ITEMS}),
    }
    script = _routes(303, Reply(200, body=REJECTED_ITEMS))
    async with HostileServer.running(script) as srv:
        env, _rec = await _call(tmp_path, srv.url, call, batch=BATCH)
    assert [r.method for r in srv.requests] == ["POST"]
    # The 303 names no item: each is unknown, to reconcile -- none "rejected", to resend.
    assert [(i["outcome"], i["code"], i["retry"]) for i in env["items"]] == [
        ("unknown", "REMOTE_RESULT_INCOMPLETE", "reconcile")
    ] * 2


@pytest.mark.parametrize("status", [401, 403, 429])
async def test_a_refusal_where_the_credential_was_not_sent_is_no_rejection(
    tmp_path: Path, token: str, status: int
) -> None:
    refusal = Reply(status, headers=[("Retry-After", "1")], body=b"who are you")
    async with HostileServer.running(scripts.serve(refusal)) as other:
        moved = scripts.redirect(other.url + "/pay", 307)
        async with HostileServer.running(moved) as srv:
            env, rec = await _call(
                tmp_path,
                srv.url,
                {**PAY, "method": "PUT"},
                redirect_origins=[other.origin],
            )
    assert token in str(srv.requests[0].headers)
    assert len(other.requests) == 1 and token not in str(other.requests[0].headers)
    assert env["result"]["status"] == 307 and env["result"]["body"] == "moved"
    assert env["evidence"]["redirect_not_followed"] == {
        "reason": REFUSED_WITHOUT_CREDENTIAL,
        "hop": 2,
        "method": "PUT",
        "origin": other.origin,
        "status": status,
    }
    assert rec.evidence["status"] == 307


async def test_a_refusal_framed_two_ways_where_the_credential_was_not_sent_still_stops_there(
    tmp_path: Path, token: str
) -> None:
    """The refusal is decided at its head, before its framing (Transfer-Encoding beside
    Content-Length) ends the exchange malformed: the 307 to the request that carried the
    credential stands, as for any refusal (fixF review #2: the framing fault was raised first,
    and the call ended ``REMOTE_RESULT_INCOMPLETE``)."""

    async def refuses(peer: Peer) -> None:
        await peer.read_request()
        await peer.send_raw(
            b"HTTP/1.1 401 Unauthorized\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n"
            b"\r\n2\r\nno\r\n0\r\n\r\n"
        )
        await peer.close()

    async with HostileServer.running(refuses) as other:
        moved = scripts.redirect(other.url + "/pay", 307)
        async with HostileServer.running(moved) as srv:
            env, rec = await _call(
                tmp_path, srv.url, {**PAY, "method": "PUT"}, redirect_origins=[other.origin]
            )
    assert len(other.requests) == 1 and token not in str(other.requests[0].headers)
    assert env["result"]["status"] == 307 and env["result"]["body"] == "moved"
    refused = env["evidence"]["redirect_not_followed"]
    assert (refused["reason"], refused["hop"], refused["status"]) == (
        REFUSED_WITHOUT_CREDENTIAL,
        2,
        401,
    )
    assert rec.evidence["status"] == 307 and rec.evidence["http"]["path"][-1] == "redirect_refused"


async def test_a_batch_answered_from_another_origin_takes_no_item_outcome_from_it(
    tmp_path: Path, token: str
) -> None:
    """engine/readable.py: another origin's answer says nothing of the target's state."""
    applied = json.dumps({"results": [{"id": n, "status": 200} for n in (1, 2)]}).encode()
    call = {
        "target": "api",
        "method": "POST",
        "path": "/batch",
        "body": json.dumps({"items": ITEMS}),
    }
    async with HostileServer.running(scripts.serve(Reply(200, body=applied))) as other:
        moved = scripts.redirect(other.url + "/batch", 307)
        async with HostileServer.running(moved) as srv:
            env, _rec = await _call(
                tmp_path,
                srv.url,
                call,
                redirected=False,
                batch=BATCH,
                redirect_origins=[other.origin],
            )
    assert len(other.requests) == 1 and env["result"]["status"] == 200
    assert [(i["outcome"], i["code"]) for i in env["items"]] == [
        ("unknown", "REMOTE_RESULT_INCOMPLETE")
    ] * 2


async def _interrupted(tmp_path: Path, script: Any) -> tuple[dict[str, Any], Any, Any]:
    """A PUT answered 307 to another origin, whose hop ends as ``script`` ends it: (envelope,
    record, the invocation's events)."""
    async with HostileServer.running(script) as other:
        moved = scripts.redirect(other.url + "/put", 307)
        async with HostileServer.running(moved) as srv:
            target = http_target(srv.url, follow_redirects=True, redirect_origins=[other.origin])
            cfg = write_config(tmp_path, {"api": target})
            async with open_broker(cfg) as broker:
                with trio.fail_after(LIMIT):
                    env = await broker.call({**PAY, "method": "PUT"})
                rec = broker.record(env["invocation_id"])
                events = broker.events(env["invocation_id"])
    assert len(other.requests) == 1  # the second hop was dispatched
    return env, rec, events


async def test_a_next_hop_closed_unanswered_claims_no_response(tmp_path: Path, token: str) -> None:
    """The first hop's 307 is no response of the hop that decided: the evidence shows none."""
    env, rec, events = await _interrupted(tmp_path, scripts.apply_then_close())
    assert env["error"]["code"] == "REMOTE_OUTCOME_UNKNOWN"
    for evidence in (env["evidence"], rec.evidence):
        assert "status" not in evidence
        assert evidence["response_headers_received"] is False
    assert [e.kind for e in events].count(EventKind.REMOTE_RESPONSE_STARTED) == 0
    assert [e.kind for e in events].count(EventKind.REQUEST_SENT) == 1  # the second hop's


async def test_a_next_hop_cut_mid_body_shows_its_own_status(tmp_path: Path, token: str) -> None:
    env, rec, events = await _interrupted(tmp_path, scripts.cut_mid_body())
    assert env["error"]["code"] == "REMOTE_RESULT_INCOMPLETE"
    for evidence in (env["evidence"], rec.evidence):
        assert evidence["status"] == evidence["evidence_from"]["status"] == 200
        assert evidence["response_headers_received"] is True
    started = [e.attrs for e in events if e.kind is EventKind.REMOTE_RESPONSE_STARTED]
    assert [a["status"] for a in started] == [200]


async def test_a_3xx_that_stands_is_journaled_with_its_own_hop_s_milestones(
    tmp_path: Path, token: str
) -> None:
    """Hop 2's gate set hop 1's milestones aside; hop 2 was refused, so hop 1's 307 is the
    result and its request and head are what the journal says -- never hop 2's REQUEST_SENT and
    401 beside a REMOTE_RESPONSE_COMPLETE of 307."""
    refusal = scripts.serve(Reply(401, body=b"who are you"))
    env, rec, events = await _interrupted(tmp_path, refusal)
    assert env["error"]["code"] == "REMOTE_REDIRECTED"
    of = {
        kind: [e.attrs.get("status") for e in events if e.kind is kind]
        for kind in (
            EventKind.REQUEST_SENT,
            EventKind.REMOTE_RESPONSE_STARTED,
            EventKind.REMOTE_RESPONSE_COMPLETE,
        )
    }
    assert of == {
        EventKind.REQUEST_SENT: [None],
        EventKind.REMOTE_RESPONSE_STARTED: [307],
        EventKind.REMOTE_RESPONSE_COMPLETE: [307],
    }
    for evidence in (env["evidence"], rec.evidence):
        assert evidence["status"] == 307 and evidence["response_headers_received"] is True


@pytest.mark.parametrize("location", ["/other", "/api-evil/x", "/api/../x"])
async def test_a_refusal_outside_the_base_path_where_the_credential_was_not_sent_is_no_rejection(
    tmp_path: Path, token: str, location: str
) -> None:
    """Same origin, outside the base path ``/api`` (a sibling sharing its prefix, a dot segment
    climbing out -- resolved to ``/x`` when the Location is joined, RFC 3986 §5.2.4, before the
    policy sees it): the hop goes without the bearer, so its 401 decides nothing."""

    def route(r: Received) -> Reply:
        if urllib.parse.urlsplit(r.target).path == "/api/start":
            return Reply(307, headers=[("Location", location)], body=b"moved")
        return Reply(401, body=b"who are you")

    call = {"target": "api", "method": "PUT", "path": "/start", "body": "{}"}
    async with HostileServer.running(scripts.serve(route)) as srv:
        env, _rec = await _call(tmp_path, srv.url + "/api", call)
    assert len(srv.requests) == 2
    assert token in str(srv.requests[0].headers) and token not in str(srv.requests[1].headers)
    assert env["result"]["status"] == 307 and env["result"]["body"] == "moved"
    refused = env["evidence"]["redirect_not_followed"]
    assert (refused["reason"], refused["hop"], refused["status"]) == (
        REFUSED_WITHOUT_CREDENTIAL,
        2,
        401,
    )


async def test_a_3xx_that_stands_after_the_next_hop_failed_past_its_gate_keeps_its_milestones(
    tmp_path: Path, token: str
) -> None:
    """Hop 2's peer speaks first: its bytes are in the socket when hop 2's gate returns, so the
    request is never written (peer_spoke_first) and hop 1's 307 is the result -- journaled with
    hop 1's REQUEST_SENT and REMOTE_RESPONSE_STARTED, set aside at hop 2's gate, not with none."""

    async def speaks_first(peer: Peer) -> None:
        await peer.send_raw(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}")
        peer.server.event("sent").set()
        await peer.read_request()

    async with HostileServer.running(speaks_first) as other:
        moved = scripts.redirect(other.url + "/put", 307)
        async with HostileServer.running(moved) as srv:
            target = http_target(srv.url, follow_redirects=True, redirect_origins=[other.origin])
            async with open_broker(write_config(tmp_path, {"api": target})) as broker:
                async with stalled_call(broker, {**PAY, "method": "PUT"}, limit=LIMIT, hop=2) as c:
                    await other.event("sent").wait()
                    await trio.sleep(0.1)  # the bytes reach the broker's socket
                env = c.envelope
                assert env is not None
                assert_redirected(broker, env)
                events = broker.events(env["invocation_id"])
    assert other.requests == []  # never written
    assert env["evidence"]["redirect_not_followed"]["stage"] == "peer_spoke_first"
    of = {
        kind: [e.attrs.get("status") for e in events if e.kind is kind]
        for kind in (EventKind.REQUEST_SENT, EventKind.REMOTE_RESPONSE_STARTED)
    }
    assert of == {EventKind.REQUEST_SENT: [None], EventKind.REMOTE_RESPONSE_STARTED: [307]}


async def test_a_3xx_that_stands_two_hops_back_is_journaled_with_hop_1_s_milestones(
    tmp_path: Path, token: str
) -> None:
    """Target 307 -> other origin 308 -> back to the target without the bearer (dropped at the
    other origin; in scope again, only a query credential is put back): hop 3's 401 is refused
    and hop 1's 307 -- the last 3xx the credential reached -- is the result.  Hop 2's and hop
    3's gates each set the hop before's milestones aside: hop 1's are the ones journaled, never
    hop 2's (its 308) beside a REMOTE_RESPONSE_COMPLETE of 307.  Hop 2 answers 308 so the
    milestones say whose they are: they hold only a status."""
    routes = {"/b": Reply(401, body=b"who are you")}

    def route(r: Received) -> Reply:
        return routes[urllib.parse.urlsplit(r.target).path]

    call = {"target": "api", "method": "PUT", "path": "/a", "body": "{}"}
    async with (
        HostileServer.running(scripts.serve(route)) as srv,
        HostileServer.running(scripts.redirect(srv.url + "/b", 308)) as other,
    ):
        routes["/a"] = Reply(307, headers=[("Location", other.url + "/x")], body=b"first")
        target = http_target(srv.url, follow_redirects=True, redirect_origins=[other.origin])
        async with open_broker(write_config(tmp_path, {"api": target})) as broker:
            with trio.fail_after(LIMIT):
                env = await broker.call(call)
            rec = assert_redirected(broker, env)
            events = broker.events(env["invocation_id"])
    assert [urllib.parse.urlsplit(r.target).path for r in srv.requests] == ["/a", "/b"]
    assert token not in str(srv.requests[1].headers) and len(other.requests) == 1
    assert env["result"]["status"] == 307 and env["result"]["body"] == "first"
    first = env["result"]["hops"]
    assert [(h["hop"], h["origin"], h["status"]) for h in first] == [(1, srv.origin, 307)]
    refused = env["evidence"]["redirect_not_followed"]
    assert (refused["hop"], refused["origin"], refused["status"]) == (3, srv.origin, 401)
    of = {
        kind: [e.attrs.get("status") for e in events if e.kind is kind]
        for kind in (
            EventKind.REQUEST_SENT,
            EventKind.REMOTE_RESPONSE_STARTED,
            EventKind.REMOTE_RESPONSE_COMPLETE,
        )
    }
    assert of == {
        EventKind.REQUEST_SENT: [None],
        EventKind.REMOTE_RESPONSE_STARTED: [307],
        EventKind.REMOTE_RESPONSE_COMPLETE: [307],
    }
    for evidence in (env["evidence"], rec.evidence):
        assert (evidence["hop"], evidence["connection"]) == (1, first[0]["connection"])
        assert evidence["status"] == 307 and evidence["response_headers_received"] is True
