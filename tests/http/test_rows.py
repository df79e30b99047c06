"""One test per classification row of the HTTP driver, against real loopback sockets and the
scripted hostile server.  Names follow the seed's evidence rules."""

from __future__ import annotations

import email.utils
import socket
import time
from collections.abc import Mapping
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from affidavit.adapters.base import AttemptInterrupted, RemoteResult, SetupError
from affidavit.adapters.http import HttpClient, HttpRequest, Timeouts
from affidavit.adapters.http.classify import NOT_CONDITIONAL
from affidavit.statemachine import Code, Outcome

from .fakes import FakeEngine
from .hostile import HostileServer, Peer, Reply, TlsFixture, scripts, unresponsive_listener

FAST = Timeouts(connect=2.0, write=2.0, read=2.0)


def req(url: str, method: str = "GET", body: bytes = b"", **kw: Any) -> HttpRequest:
    kw.setdefault("timeouts", FAST)
    return HttpRequest(method, url, [("Authorization", "Bearer tok-abcdef")], body, **kw)


async def setup_error(client: HttpClient, request: HttpRequest) -> tuple[FakeEngine, SetupError]:
    fe = FakeEngine()
    with trio.fail_after(10), pytest.raises(SetupError) as info:
        await client.perform(request, fe.ctx)
    # Rule: a setup error is only possible before the gate, and the machine proves it.
    assert fe.gates == []
    assert not fe.machine.dispatched
    assert fe.machine.state == "setup_failed"
    return fe, info.value


async def interrupted(
    client: HttpClient, request: HttpRequest, state: str = "closed_early", **kw: Any
) -> tuple[FakeEngine, AttemptInterrupted]:
    fe = FakeEngine(**kw)
    with trio.fail_after(10), pytest.raises(AttemptInterrupted) as info:
        await client.perform(request, fe.ctx)
    assert len(fe.gates) >= 1 and fe.dispatched_at_gate[0] is False
    assert fe.machine.dispatched and fe.machine.state == state
    assert not fe.machine.complete
    return fe, info.value


async def result(
    client: HttpClient, request: HttpRequest, **kw: Any
) -> tuple[FakeEngine, RemoteResult]:
    fe = FakeEngine(**kw)
    with trio.fail_after(10):
        res = await client.perform(request, fe.ctx)
    assert fe.machine.complete and fe.machine.state == "framing_complete"
    return fe, res


# -- connection setup: not_attempted, before the gate -----------------------------------------


async def test_dns_failure_is_setup_error_before_the_gate(client: HttpClient) -> None:
    _fe, err = await setup_error(client, req("http://no-such-host.invalid/"))
    assert (err.code, err.stage) == (Code.DNS_FAILED, "dns")


async def test_connection_refused_is_setup_error_before_the_gate(client: HttpClient) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    fe, err = await setup_error(client, req(f"http://127.0.0.1:{port}/"))
    assert (err.code, err.stage) == (Code.CONNECTION_REFUSED, "tcp_connect")
    assert fe.events == ["resolve", "setup_fail"]


async def test_connect_timeout_is_setup_error_before_the_gate(client: HttpClient) -> None:
    async with unresponsive_listener() as port:
        t0 = trio.current_time()
        _fe, err = await setup_error(
            client, req(f"http://127.0.0.1:{port}/", timeouts=Timeouts(connect=0.3))
        )
    assert (err.code, err.stage) == (Code.CONNECT_TIMEOUT, "tcp_connect")
    assert trio.current_time() - t0 < 3


async def test_wrong_host_certificate_is_certificate_invalid_before_the_gate(
    client: HttpClient, tls: TlsFixture
) -> None:
    async with HostileServer.running(scripts.serve(Reply(200)), tls=tls.wrong_host) as srv:
        fe, err = await setup_error(client, req(srv.url + "/", ca_file=tls.ca_file))
    assert (err.code, err.stage) == (Code.CERTIFICATE_INVALID, "tls_handshake")
    assert srv.requests == []
    assert "setup_fail" in fe.events and "tls" not in fe.events


async def test_untrusted_ca_is_certificate_invalid(client: HttpClient, tls: TlsFixture) -> None:
    async with HostileServer.running(scripts.serve(Reply(200)), tls=tls.good) as srv:
        _fe, err = await setup_error(client, req(srv.url + "/"))  # system store only
    assert err.code is Code.CERTIFICATE_INVALID
    assert srv.requests == []


async def test_tls_handshake_failure_is_tls_failed(client: HttpClient) -> None:
    async def not_tls(peer: Peer) -> None:
        await peer.send_raw(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        await peer.close()

    async with HostileServer.running(not_tls) as srv:
        _fe, err = await setup_error(client, req(f"https://{srv.hostport}/"))
    assert (err.code, err.stage) == (Code.TLS_FAILED, "tls_handshake")


async def test_connect_tunnel_refused_by_proxy_is_proxy_failed(client: HttpClient) -> None:
    proxy_script = scripts.connect_proxy(
        refuse=403, proxy_status="hostile; error=http_request_denied"
    )
    async with HostileServer.running(proxy_script) as proxy:
        fe, err = await setup_error(
            client, req("https://origin.example:8443/x?q=1", proxy=proxy.url)
        )
    assert (err.code, err.stage) == (Code.PROXY_FAILED, "proxy_connect")
    assert [r.method for r in proxy.requests] == ["CONNECT"]
    assert proxy.requests[0].target == "origin.example:8443"
    assert proxy.requests[0].header("authorization") is None  # the credential stays end-to-end
    fail = fe.facts_of("setup_fail")[0]
    assert fail["status"] == 403
    assert fail["proxy_status"] == [{"proxy": "hostile", "error": "http_request_denied"}]


# -- after dispatch without a complete result: unknown -----------------------------------------


async def test_peer_closes_after_reading_request_is_outcome_unknown(client: HttpClient) -> None:
    async with HostileServer.running(scripts.apply_then_close()) as srv:
        fe, err = await interrupted(client, req(srv.url + "/pay", "POST", b'{"amount":1}'))
    assert err.code is Code.REMOTE_OUTCOME_UNKNOWN
    assert srv.event("applied").is_set()  # the remote did apply it: unknown is the truth
    assert srv.requests[0].body == b'{"amount":1}'
    assert fe.events[-1] == "peer_closed"
    assert err.facts["final_response_started"] is False


@pytest.mark.parametrize(
    "script",
    [scripts.cut_mid_headers(), scripts.cut_mid_body(), scripts.cut_mid_body(chunked=True)],
    ids=["mid-headers", "mid-body-content-length", "mid-body-chunked"],
)
async def test_cut_response_is_result_incomplete_and_never_a_result(
    client: HttpClient, script: Any
) -> None:
    async with HostileServer.running(script) as srv:
        fe, err = await interrupted(client, req(srv.url + "/"))
    assert err.code is Code.REMOTE_RESULT_INCOMPLETE
    assert err.facts["final_response_started"] is True
    assert not fe.machine.complete


async def test_malformed_framing_is_result_incomplete(client: HttpClient) -> None:
    async with HostileServer.running(scripts.malformed()) as srv:
        fe, err = await interrupted(client, req(srv.url + "/"))
    assert err.code is Code.REMOTE_RESULT_INCOMPLETE
    assert fe.events[-1] == "malformed"


async def test_100_continue_then_close_is_outcome_unknown(client: HttpClient) -> None:
    async with HostileServer.running(scripts.continue_then_close()) as srv:
        fe, err = await interrupted(
            client, req(srv.url + "/", "PUT", b"payload", expect_continue=True)
        )
    assert err.code is Code.REMOTE_OUTCOME_UNKNOWN
    assert "informational" in fe.events
    assert srv.requests[0].header("expect") == "100-continue"


async def test_pooled_connection_reset_before_reuse_is_unknown_after_the_gate(
    client: HttpClient,
) -> None:
    async with HostileServer.running(scripts.keep_alive_then_reset()) as srv:
        await result(client, req(srv.url + "/one"))

        async def reset_now(facts: Mapping[str, Any]) -> None:
            # The race, made deterministic: the server resets the idle connection after the
            # pool's staleness check passed and the gate was called, just before the write.
            srv.event("reset").set()
            await srv.event("reset.done").wait()
            await trio.sleep(0.05)

        fe, err = await interrupted(client, req(srv.url + "/two", "POST", b"x"), on_gate=reset_now)
    assert err.code is Code.REMOTE_OUTCOME_UNKNOWN
    assert fe.gates[0]["reused_connection"] is True
    assert err.facts["reused_connection"] is True
    assert fe.events[0] == "reuse"
    assert fe.events[-1] in {"transport_error", "peer_closed"}


async def test_caller_cancellation_after_the_gate_propagates_and_stays_dispatched(
    client: HttpClient, autojump_clock: MockClock
) -> None:
    async with HostileServer.running(scripts.slow(5.0)) as srv:
        fe = FakeEngine()
        with trio.fail_after(10):
            with trio.move_on_after(0.3) as cs:
                await client.perform(req(srv.url + "/", "POST", b"x"), fe.ctx)
    assert cs.cancelled_caught
    assert fe.machine.dispatched and len(fe.gates) == 1
    assert fe.events[-1] == "cancelled" and fe.machine.state == "closed_early"
    assert client.idle_connections() == 0


# -- complete results ---------------------------------------------------------------------------


async def test_complete_2xx_is_committed(client: HttpClient) -> None:
    reply = Reply(201, headers=[("X-Request-Id", "req-42")], body=b'{"id":1}')
    async with HostileServer.running(scripts.serve(reply)) as srv:
        fe, res = await result(client, req(srv.url + "/items", "POST", b"{}"))
    assert (res.outcome, res.code) == (Outcome.COMMITTED, None)
    assert res.facts["status"] == 201 and res.facts["hop"] == "origin"
    assert res.facts["remote_request_id"] == "req-42"
    assert res.summary["status"] == 201 and res.summary["http_version"] == "1.1"
    assert fe.body == b'{"id":1}'
    assert [c[0] for c in fe.chunks] == ["body"]


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
async def test_unfollowed_3xx_is_committed_and_no_success(client: HttpClient, status: int) -> None:
    """The server's complete answer, which does not say whether it acted on the request (RFC
    9110 §15.4: further action is needed to fulfil it): REMOTE_REDIRECTED, never error-free."""
    async with HostileServer.running(scripts.redirect("/elsewhere", status)) as srv:
        fe, res = await result(client, req(srv.url + "/"))
    assert (res.outcome, res.code, res.facts["status"]) == (
        Outcome.COMMITTED,
        Code.REMOTE_REDIRECTED,
        status,
    )
    assert len(srv.requests) == 1 and len(fe.gates) == 1


@pytest.mark.parametrize(
    ("method", "extra", "clean"),
    [
        ("GET", [("If-None-Match", '"v1"')], True),
        ("HEAD", [("If-Modified-Since", "Sun, 06 Nov 1994 08:49:37 GMT")], True),
        ("GET", [], False),
        ("GET", [("If-Match", '"v1"')], False),
        ("POST", [], False),
        ("POST", [("If-None-Match", '"v1"')], False),
    ],
)
async def test_a_304_is_a_clean_result_only_for_a_conditional_get_or_head(
    client: HttpClient, method: str, extra: list[tuple[str, str]], clean: bool
) -> None:
    """RFC 9110 §15.4.5: a 304 answers a conditional GET or HEAD (the caller's copy is
    current).  To any other request it is no answer: committed (complete, the origin's) but
    REMOTE_REDIRECTED, ``redirect_not_followed.reason`` saying why -- judged on the request as
    written (the server saw the same headers)."""
    async with HostileServer.running(scripts.serve(Reply(304))) as srv:
        body = b"{}" if method == "POST" else b""
        request = HttpRequest(
            method,
            srv.url + "/doc",
            [("Authorization", "Bearer tok-abcdef"), *extra],
            body,
            timeouts=FAST,
        )
        _fe, res = await result(client, request)
    (got,) = srv.requests
    assert got.method == method and {(n.lower(), v) for n, v in extra} <= {
        (n.lower(), v) for n, v in got.headers
    }
    assert res.outcome is Outcome.COMMITTED and res.facts["status"] == 304
    if clean:
        assert res.code is None and "redirect_not_followed" not in res.facts
    else:
        assert res.code is Code.REMOTE_REDIRECTED
        assert res.facts["redirect_not_followed"] == {"reason": NOT_CONDITIONAL}


@pytest.mark.parametrize("status", [401, 403, 404, 409])
async def test_complete_4xx_is_rejected(client: HttpClient, status: int) -> None:
    async with HostileServer.running(scripts.serve(Reply(status, body=b"no"))) as srv:
        _fe, res = await result(client, req(srv.url + "/"))
    assert (res.outcome, res.code) == (Outcome.REJECTED, Code.REMOTE_REJECTED)


async def test_429_with_delta_seconds_is_throttled(client: HttpClient) -> None:
    reply = Reply(429, headers=[("Retry-After", "17")])
    async with HostileServer.running(scripts.serve(reply)) as srv:
        _fe, res = await result(client, req(srv.url + "/"))
    assert (res.outcome, res.code, res.retry_after) == (
        Outcome.REJECTED,
        Code.REMOTE_THROTTLED,
        17.0,
    )


async def test_503_with_http_date_is_throttled(client: HttpClient) -> None:
    date = email.utils.formatdate(time.time() + 60, usegmt=True)
    async with HostileServer.running(
        scripts.serve(Reply(503, headers=[("Retry-After", date)]))
    ) as srv:
        _fe, res = await result(client, req(srv.url + "/"))
    assert (res.outcome, res.code) == (Outcome.REJECTED, Code.REMOTE_THROTTLED)
    assert res.retry_after is not None and 50 < res.retry_after <= 60


async def test_500_after_commit_is_committed_remote_error(client: HttpClient) -> None:
    async with HostileServer.running(scripts.error_after_commit(500)) as srv:
        fe, res = await result(client, req(srv.url + "/pay", "POST", b"{}"))
    assert (res.outcome, res.code) == (Outcome.COMMITTED, Code.REMOTE_ERROR)
    assert srv.event("applied").is_set()
    assert fe.body == b'{"error":"after commit"}'


# -- proxies --------------------------------------------------------------------------------------


async def test_forward_proxy_own_502_is_unknown_attributed_to_the_proxy(
    client: HttpClient,
) -> None:
    async with HostileServer.running(scripts.forward_proxy(error=502)) as proxy:
        fe, err = await interrupted(
            client,
            req("http://origin.example/pay", "POST", b"{}", proxy=proxy.url),
            state="proxy_error_complete",
        )
    assert err.code is Code.REMOTE_OUTCOME_UNKNOWN
    assert err.facts["hop"] == "proxy" and err.facts["proxy_status"] is None
    assert err.facts["via_proxy"] == proxy.hostport
    assert fe.body == b""  # the proxy's page is not the origin's result
    assert "proxy_end" in fe.events and "end" not in fe.events


async def test_proxy_status_error_is_unknown_with_parsed_proxy_status(client: HttpClient) -> None:
    ps = 'hostile; error=connection_timeout; details="origin did not answer"'
    async with HostileServer.running(scripts.forward_proxy(error=503, proxy_status=ps)) as proxy:
        fe = FakeEngine()
        with trio.fail_after(10), pytest.raises(AttemptInterrupted) as info:
            await client.perform(req("http://origin.example/", proxy=proxy.url), fe.ctx)
    err = info.value
    assert err.code is Code.REMOTE_OUTCOME_UNKNOWN
    assert not fe.machine.complete and fe.machine.dispatched
    assert err.facts["hop"] == "proxy"
    assert err.facts["proxy_status"] == [
        {"proxy": "hostile", "error": "connection_timeout", "details": "origin did not answer"}
    ]


async def test_forward_proxy_relaying_origin_502_is_the_origins_result(client: HttpClient) -> None:
    async with (
        HostileServer.running(scripts.serve(Reply(502, body=b"origin says"))) as origin,
        HostileServer.running(scripts.forward_proxy(relayed_marker=True)) as proxy,
    ):
        fe, res = await result(client, req(origin.url + "/x", proxy=proxy.url))
    assert (res.outcome, res.code) == (Outcome.COMMITTED, Code.REMOTE_ERROR)
    assert res.facts["hop"] == "origin"
    assert res.facts["proxy_status"] == [{"proxy": "hostile", "received_status": 502}]
    assert proxy.requests[0].target == origin.url + "/x"  # absolute-form to a forward proxy
    assert origin.requests[0].target == "/x"
    assert fe.gates[0]["via_proxy"] == proxy.hostport


async def test_forward_proxy_closing_without_answer_is_unknown_from_the_proxy_hop(
    client: HttpClient,
) -> None:
    async with HostileServer.running(scripts.apply_then_close()) as proxy:
        _fe, err = await interrupted(
            client, req("http://origin.example/pay", "POST", b"{}", proxy=proxy.url)
        )
    assert err.code is Code.REMOTE_OUTCOME_UNKNOWN
    assert (err.facts["hop"], err.facts["via_proxy"]) == ("proxy", proxy.hostport)
