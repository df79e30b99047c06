"""Proxy evidence end to end (issue 14, item 4): which hop produced the evidence, and the parsed
RFC 9209 Proxy-Status, reach the journal and the envelope; a response the broker cannot
attribute to the origin is never the origin's committed result (docs/proxies.md).

Seed, "Connection setup needs a precise end point": "A forwarding proxy may return a complete
error about its own attempt, and RFC 9209 can indicate where forwarding failed, yet the outcome
at the origin system may still remain unknown.  Record which hop produced the evidence.  Do not
pass off an intermediary's certainty about its own response as certainty about the effects on
the origin system."

The scripted proxy is tests/http/hostile.py's ``forward_proxy``; the real one is Debian's
tinyproxy, run on loopback with a config written here (tests/external.py: skipped with the
reason when it is not installed, a failure in CI).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.adapters.http.redirects import CLEARTEXT_REFUSED
from affidavit.config import load_config
from affidavit.schema import ConfigError
from affidavit.statemachine import EventKind
from tests.external import TINYPROXY, listening
from tests.http.hostile import HostileServer, Peer, Reply, scripts

from .helpers import (
    TOKEN_ENV,
    FakeResolver,
    assert_error,
    assert_ok,
    closed_port,
    custom_resolver,
    http_target,
    open_broker,
    write_config,
)
from .http_rows import GET, LIMIT, POST

E = EventKind
PROXY = "http://127.0.0.1:3128"


async def _call(
    tmp_path: Path, origin: str, proxy: str, action: dict[str, Any]
) -> tuple[dict[str, Any], list[Any]]:
    """One call to ``origin`` through ``proxy``; (envelope, the invocation's events)."""
    cfg = write_config(
        tmp_path, {"api": http_target(origin, proxy=proxy, trust_forward_proxy=True)}
    )
    async with open_broker(cfg) as broker:
        with trio.fail_after(LIMIT):
            env = await broker.call(action)
        if "error" in env:
            assert broker.record(env["invocation_id"]) is not None
        else:
            assert_ok(broker, env)
        return env, broker.events(env["invocation_id"])


def _attrs(events: list[Any], kind: EventKind) -> dict[str, Any]:
    return dict(next(e.attrs for e in events if e.kind is kind))


async def test_a_proxys_own_error_with_proxy_status_is_unknown_and_names_the_hop(
    tmp_path: Path, token: str
) -> None:
    ps = 'edge1; error=connection_timeout; details="origin did not answer"'
    async with (
        HostileServer.running(scripts.serve(Reply(201))) as origin,
        HostileServer.running(scripts.forward_proxy(error=502, proxy_status=ps)) as proxy,
    ):
        env, events = await _call(tmp_path, origin.url, proxy.url, POST)
    err = env["error"]
    assert (err["outcome"], err["code"], err["retry"]) == (
        "unknown",
        "REMOTE_OUTCOME_UNKNOWN",
        "reconcile",
    )
    hop = {
        "hop": "proxy",
        "proxy": proxy.hostport,
        "status": 502,
        "proxy_status": [
            {"proxy": "edge1", "error": "connection_timeout", "details": "origin did not answer"}
        ],
    }
    # In the envelope's evidence and in the journal's durable event behind it.
    assert env["evidence"]["evidence_from"] == hop
    interrupted = _attrs(events, E.ATTEMPT_INTERRUPTED)
    assert interrupted["evidence_from"] == hop
    assert interrupted["facts"]["via_proxy"] == proxy.hostport
    assert "result" not in env  # the proxy's page is not the origin's result
    assert origin.requests == []


@pytest.mark.parametrize(
    "framing",
    [
        b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n3\r\nbad\r\n0\r\n\r\n",
        b"Content-Length: 100\r\n\r\nbad",  # cut short: the proxy closes
    ],
    ids=["te-and-cl", "cut-short"],
)
async def test_a_proxys_own_error_that_ends_malformed_is_still_unknown_with_its_proxy_status(
    tmp_path: Path, token: str, framing: bytes
) -> None:
    """A proxy's own error is judged at its head: its body's framing (faulty, or cut short)
    decides nothing of the origin's outcome -- unknown, the Proxy-Status beside it, as for the
    whole error above; never ``REMOTE_RESULT_INCOMPLETE``, a result of the origin's cut short
    (fixF review #2: the framing fault was raised before the head was judged)."""

    async def proxy_script(peer: Peer) -> None:
        await peer.read_request()
        await peer.send_raw(
            b"HTTP/1.1 502 Bad Gateway\r\nProxy-Status: edge1; error=connection_timeout\r\n"
            + framing
        )
        await peer.close()

    async with (
        HostileServer.running(scripts.serve(Reply(201))) as origin,
        HostileServer.running(proxy_script) as proxy,
    ):
        env, events = await _call(tmp_path, origin.url, proxy.url, POST)
    err = env["error"]
    assert (err["outcome"], err["code"]) == ("unknown", "REMOTE_OUTCOME_UNKNOWN")
    hop = {
        "hop": "proxy",
        "proxy": proxy.hostport,
        "status": 502,
        "proxy_status": [{"proxy": "edge1", "error": "connection_timeout"}],
    }
    assert env["evidence"]["evidence_from"] == hop
    interrupted = _attrs(events, E.ATTEMPT_INTERRUPTED)
    assert interrupted["evidence_from"] == hop
    assert interrupted["facts"]["proxy_status"] == hop["proxy_status"]
    assert "result" not in env and origin.requests == []


async def test_a_forward_proxys_own_500_is_never_the_origins_committed_result(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.forward_proxy(error=500)) as proxy:
        env, events = await _call(tmp_path, "http://origin.invalid:8080", proxy.url, POST)
    assert env["error"]["code"] == "REMOTE_OUTCOME_UNKNOWN"  # not REMOTE_ERROR
    assert env["evidence"]["outcome"] == "unknown"
    assert env["evidence"]["evidence_from"] == {
        "hop": "proxy",
        "proxy": proxy.hostport,
        "status": 500,
    }
    assert E.REMOTE_RESPONSE_COMPLETE not in [e.kind for e in events]


@pytest.mark.parametrize("status", [403, 404, 429])
async def test_a_forward_proxys_own_4xx_is_never_the_origins_rejection(
    tmp_path: Path, token: str, status: int
) -> None:
    # Squid's access-denied 403, Privoxy's 404 for an unknown domain, an egress proxy's 429:
    # the origin never saw the request, yet nothing in the answer says whose it is.
    async with (
        HostileServer.running(scripts.serve(Reply(201))) as origin,
        HostileServer.running(scripts.forward_proxy(error=status)) as proxy,
    ):
        env, events = await _call(tmp_path, origin.url, proxy.url, POST)
    err = env["error"]
    # Not REMOTE_REJECTED / REMOTE_THROTTLED, not "rejected": only the proxy's answer is proven.
    assert (err["outcome"], err["code"], err["retry"]) == (
        "unknown",
        "REMOTE_OUTCOME_UNKNOWN",
        "reconcile",
    )
    hop = {"hop": "proxy", "proxy": proxy.hostport, "status": status}
    assert env["evidence"]["evidence_from"] == hop
    assert _attrs(events, E.ATTEMPT_INTERRUPTED)["evidence_from"] == hop
    assert E.REMOTE_RESPONSE_COMPLETE not in [e.kind for e in events]
    assert "result" not in env
    assert origin.requests == []


async def test_an_origins_4xx_the_proxy_attributes_is_the_origins_rejection(
    tmp_path: Path, token: str
) -> None:
    async with (
        HostileServer.running(scripts.serve(Reply(404, body=b"no such charge"))) as origin,
        HostileServer.running(scripts.forward_proxy(relayed_marker=True)) as proxy,
    ):
        env, _events = await _call(tmp_path, origin.url, proxy.url, POST)
    assert (env["error"]["outcome"], env["error"]["code"]) == ("rejected", "REMOTE_REJECTED")
    assert env["evidence"]["evidence_from"]["hop"] == "origin"


async def test_an_origins_error_the_proxy_attributes_is_the_origins_committed_result(
    tmp_path: Path, token: str
) -> None:
    async with (
        HostileServer.running(scripts.serve(Reply(502, body=b"origin says"))) as origin,
        HostileServer.running(scripts.forward_proxy(relayed_marker=True)) as proxy,
    ):
        env, events = await _call(tmp_path, origin.url, proxy.url, POST)
    err = env["error"]
    assert (err["outcome"], err["code"]) == ("committed", "REMOTE_ERROR")
    assert env["evidence"]["source"] == "remote_response"
    hop = {
        "hop": "origin",
        "proxy": proxy.hostport,
        "status": 502,
        "proxy_status": [{"proxy": "hostile", "received_status": 502}],
        "attribution": "received_status",
    }
    assert env["evidence"]["evidence_from"] == hop
    assert _attrs(events, E.REMOTE_RESPONSE_COMPLETE)["evidence_from"] == hop
    assert env["result"]["body"] == "origin says"
    assert len(origin.requests) == 1


async def test_a_received_status_a_secret_holds_still_attributes_the_origins_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recorded ``received_status`` is redacted when a secret holds its digits (``0502``
    here), but the attribution -- a word, on whose say-so the answer is the origin's -- is
    judged on what the proxy sent: redacting the number must not demote the evidence to the
    operator's trust."""
    monkeypatch.setenv(TOKEN_ENV, "tok-80502-not-a-status")
    async with (
        HostileServer.running(scripts.serve(Reply(502, body=b"origin says"))) as origin,
        HostileServer.running(scripts.forward_proxy(relayed_marker=True)) as proxy,
    ):
        env, _events = await _call(tmp_path, origin.url, proxy.url, POST)
    hop = env["evidence"]["evidence_from"]
    assert hop["proxy_status"] == [{"proxy": "hostile", "received_status": "[redacted]"}], hop
    assert hop["attribution"] == "received_status", hop


async def test_a_direct_response_names_the_origin(tmp_path: Path, token: str) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"hi"))) as origin:
        cfg = write_config(tmp_path, {"api": http_target(origin.url)})
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                env = await broker.call(GET)
            assert_ok(broker, env)
    assert env["evidence"]["evidence_from"] == {"hop": "origin", "status": 200}


async def test_a_direct_cleartext_answer_names_the_operators_trust(
    tmp_path: Path, token: str
) -> None:
    """Straight from an http:// origin off the machine, nothing authenticates the answer: it
    counts as the origin's on the operator's ``trust_cleartext``, and says so."""
    async with HostileServer.running(scripts.serve(Reply(200, body=b"hi"))) as origin:
        url = f"http://api.test:{origin.port}"
        cfg = write_config(tmp_path, {"api": http_target(url, trust_cleartext=True)})
        with custom_resolver(FakeResolver({"api.test": "127.0.0.1"})):
            async with open_broker(cfg) as broker:
                with trio.fail_after(LIMIT):
                    env = await broker.call(GET)
                assert_ok(broker, env)
    assert env["evidence"]["evidence_from"] == {
        "hop": "origin",
        "status": 200,
        "attribution": "trusted_cleartext",
    }


@pytest.mark.parametrize("trusted", [False, True], ids=["untrusted", "trust_cleartext"])
async def test_a_redirect_to_cleartext_off_the_machine_claims_no_trust_it_was_not_given(
    tmp_path: Path, token: str, trusted: bool
) -> None:
    """A loopback target whose listed redirect origin is http:// off the machine: without
    ``trust_cleartext`` the redirect is not followed (the 3xx stands, nothing is asked of that
    origin) -- it was followed and its answer recorded ``trusted_cleartext``, a trust the
    operator never gave; with it, followed and attributed so."""
    async with (
        HostileServer.running(scripts.serve(Reply(200, body=b"forged"))) as other,
        HostileServer.running(scripts.serve(Reply(200))) as first,
    ):
        first.script = scripts.redirect(f"http://other.test:{other.port}/x")
        more = {"trust_cleartext": True} if trusted else {}
        target = http_target(
            first.url,
            follow_redirects=True,
            redirect_origins=[f"http://other.test:{other.port}"],
            **more,
        )
        cfg = write_config(tmp_path, {"api": target})
        with custom_resolver(FakeResolver({"other.test": "127.0.0.1"})):
            async with open_broker(cfg) as broker:
                with trio.fail_after(LIMIT):
                    env = await broker.call(GET)
    if trusted:
        assert env["evidence"]["evidence_from"]["attribution"] == "trusted_cleartext"
        assert env["result"]["status"] == 200 and len(other.requests) == 1
    else:
        assert env["error"]["code"] == "REMOTE_REDIRECTED", env
        assert env["evidence"]["evidence_from"] == {"hop": "origin", "status": 307}
        assert env["evidence"]["redirect_not_followed"]["reason"] == CLEARTEXT_REFUSED
        assert other.requests == []


# -- a real forward proxy: Debian's tinyproxy ---------------------------------------------------


def _tinyproxy(tmp_path: Path, extra: str = "") -> Iterator[str]:
    """tinyproxy listening on a loopback port, with a config written here; yields its URL."""
    exe = TINYPROXY.require()
    conf = tmp_path / "tinyproxy.conf"

    def argv_at(port: int) -> list[str]:
        conf.write_text(
            f"Port {port}\nListen 127.0.0.1\nTimeout 5\nMaxClients 8\nAllow 127.0.0.1\n"
            "LogLevel Info\n" + extra
        )
        return [exe, "-d", "-c", str(conf)]

    with listening(argv_at, tmp_path / "tinyproxy.log") as served:
        yield f"http://127.0.0.1:{served.port}"


@pytest.fixture
def tinyproxy(tmp_path: Path) -> Iterator[str]:
    yield from _tinyproxy(tmp_path)


@pytest.fixture
def filtering_tinyproxy(tmp_path: Path) -> Iterator[str]:
    """tinyproxy that refuses, itself, any request to 127.0.0.1 (its ``Filter``: ``403``)."""
    rules = tmp_path / "tinyproxy.filter"
    rules.write_text("127\\.0\\.0\\.1\n")
    yield from _tinyproxy(tmp_path, f'Filter "{rules}"\n')


async def test_tinyproxys_own_500_for_a_closed_origin_is_not_the_origins_result(
    tmp_path: Path, token: str, tinyproxy: str
) -> None:
    # The origin was never contacted: tinyproxy answers "500 Unable to connect" itself.
    origin = f"http://127.0.0.1:{closed_port()}"
    cfg = write_config(
        tmp_path, {"api": http_target(origin, proxy=tinyproxy, trust_forward_proxy=True)}
    )
    async with open_broker(cfg) as broker:
        with trio.fail_after(LIMIT):
            env = await broker.call(GET)
        rec = assert_error(
            broker,
            env,
            phase="remote_execution",
            outcome="unknown",
            retry="backoff",  # GET is configured idempotent here
            code="REMOTE_OUTCOME_UNKNOWN",
        )
        kinds = [e.kind for e in broker.events(env["invocation_id"])]
    assert env["evidence"]["evidence_from"] == {
        "hop": "proxy",
        "proxy": tinyproxy.removeprefix("http://"),
        "status": 500,
    }
    assert rec.evidence.get("source") != "remote_response"
    assert E.REMOTE_RESPONSE_COMPLETE not in kinds and E.RESULT_COMMITTED not in kinds


async def test_an_origins_answer_relayed_by_tinyproxy_is_committed_from_the_origin(
    tmp_path: Path, token: str, tinyproxy: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"via proxy"))) as origin:
        env, _events = await _call(tmp_path, origin.url, tinyproxy, GET)
    assert env["result"]["body"] == "via proxy"
    # Only tinyproxy's socket was observed: the 200 is the origin's on the operator's word
    # (trust_forward_proxy), and the record says so.
    assert env["evidence"]["evidence_from"] == {
        "hop": "origin",
        "proxy": tinyproxy.removeprefix("http://"),
        "status": 200,
        "attribution": "trusted_forward_proxy",
    }
    assert origin.requests[0].header("Authorization") == f"Bearer {token}"


async def test_tinyproxys_own_403_for_a_filtered_request_is_not_the_origins_rejection(
    tmp_path: Path, token: str, filtering_tinyproxy: str
) -> None:
    # tinyproxy's Filter refuses the request itself ("403 Filtered"): the origin never sees it.
    # (A GET: tinyproxy closes without reading a refused request's body, and the reset may cut
    # its answer -- unknown either way, but then not attributable to any hop.)
    async with HostileServer.running(scripts.serve(Reply(200))) as origin:
        env, events = await _call(tmp_path, origin.url, filtering_tinyproxy, GET)
    err = env["error"]
    assert (err["outcome"], err["code"], err["retry"]) == (
        "unknown",
        "REMOTE_OUTCOME_UNKNOWN",
        "backoff",  # GET is configured idempotent here
    )
    assert env["evidence"]["evidence_from"] == {
        "hop": "proxy",
        "proxy": filtering_tinyproxy.removeprefix("http://"),
        "status": 403,
    }
    assert E.REMOTE_RESPONSE_COMPLETE not in [e.kind for e in events]
    assert origin.requests == []


# -- a forward proxy is the operator's explicit choice -----------------------------------------


def test_an_http_target_with_a_proxy_needs_the_operators_trust(tmp_path: Path) -> None:
    """Through a forward proxy nothing authenticates the answer: the proxy could write any 2xx
    itself (a cache, a filter's block page) and sees the credential in clear.  So a 2xx/3xx
    through it counts as the origin's only when the operator said so."""
    cfg = write_config(tmp_path, {"api": http_target("http://127.0.0.1:1", proxy=PROXY)})
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    assert info.value.field == "targets.api.proxy"
    assert "trust_forward_proxy" in info.value.message


@pytest.mark.parametrize(
    "target",
    [
        {"url": "https://127.0.0.1:1", "proxy": PROXY},  # a CONNECT tunnel needs no trust
        {"url": "http://127.0.0.1:1"},  # no proxy at all
    ],
)
def test_trust_forward_proxy_applies_only_to_an_http_target_with_a_proxy(
    tmp_path: Path, target: dict[str, Any]
) -> None:
    url = target.pop("url")
    cfg = write_config(tmp_path, {"api": http_target(url, trust_forward_proxy=True, **target)})
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    assert info.value.field == "targets.api.trust_forward_proxy"


def test_a_redirect_origin_reached_through_a_forward_proxy_needs_the_same_trust(
    tmp_path: Path,
) -> None:
    """An https:// target's proxy is a CONNECT tunnel, but a redirect to an http:// origin it
    lists goes through that proxy as a forward proxy: the same trust, or the config fails."""
    target = http_target(
        "https://127.0.0.1:1",
        proxy=PROXY,
        follow_redirects=True,
        redirect_origins=["https://127.0.0.2:1", "http://127.0.0.3:1"],
    )
    cfg = write_config(tmp_path, {"api": target})
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    assert info.value.field == "targets.api.redirect_origins[1]"
    assert "trust_forward_proxy" in info.value.message
    # the target's url is https://: the fault is the redirect origin, not "an http:// target"
    assert "redirect to this http:// origin" in info.value.message, info.value.message
    assert "http:// target" not in info.value.message, info.value.message
    cfg = write_config(tmp_path, {"api": {**target, "trust_forward_proxy": True}})
    assert load_config(cfg).targets["api"].trust_forward_proxy is True


async def test_a_200_a_trusted_forward_proxy_wrote_itself_says_on_whose_word_it_counts(
    tmp_path: Path, token: str
) -> None:
    """A filtering proxy's block page as a 200: the origin never saw the request, and the broker
    cannot tell.  The record may only claim what the operator vouched for: the answer is
    attributed to the origin by ``trust_forward_proxy``, and the snapshot binds that trust."""

    async def block_page(peer: Peer) -> None:
        while await peer.read_request() is not None:
            await peer.respond(Reply(200, body=b"<h1>blocked by policy</h1>"))

    async with (
        HostileServer.running(scripts.serve(Reply(201))) as origin,
        HostileServer.running(block_page) as proxy,
    ):
        env, events = await _call(tmp_path, origin.url, proxy.url, GET)
    assert origin.connections == 0
    hop = {
        "hop": "origin",
        "proxy": proxy.hostport,
        "status": 200,
        "attribution": "trusted_forward_proxy",
    }
    assert env["evidence"]["evidence_from"] == hop
    assert _attrs(events, E.REMOTE_RESPONSE_COMPLETE)["evidence_from"] == hop
