"""What a caller reads never depends on the credential's length.

The project keeps a secret's length out of every record a caller reads (a ``file:``
credential's version is not its size: ``affidavit.secrets.credentials.resolve``).  The request
head's size is the caller's own bytes plus the injected credential: recorded, the credential's
length is one subtraction away.  So is the size of an answer that echoed the credential, beside
its redacted copy (docs/redaction.md, "What was received"): the counts go, complete answer or
cut short, and so do the headers that measure or digest such a body.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.statemachine import EventKind
from affidavit.views.records import record_view
from tests.http.hostile import HostileServer, Peer, Received, Reply, scripts

from .helpers import assert_ok, http_target, open_broker, write_config


def _numbers(value: Any, path: str = "") -> dict[str, Any]:
    """Every number in a protocol summary's facts, by its path."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_numbers(v, f"{path}.{k}"))
        return out
    if isinstance(value, list):
        out = {}
        for i, v in enumerate(value):
            out.update(_numbers(v, f"{path}[{i}]"))
        return out
    if isinstance(value, int | float) and not isinstance(value, bool):
        return {path: value}
    return {}


@pytest.mark.parametrize("inject", ["bearer", "basic", "header:X-Api-Key", "query:api_key"])
async def test_the_protocol_facts_a_caller_reads_do_not_measure_the_credential(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inject: str
) -> None:
    monkeypatch.setenv("SHORT_SECRET", "svc:s3cret")
    monkeypatch.setenv("LONG_SECRET", "svc:" + "L" * 41)
    # One server each: both calls open a connection (a reused one records other facts).
    async with (
        HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as one,
        HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as other,
    ):
        targets = {
            "short": http_target(one.url, credential="env:SHORT_SECRET", inject=inject),
            "long": http_target(other.url, credential="env:LONG_SECRET", inject=inject),
        }
        cfg = write_config(tmp_path, targets)
        facts: dict[str, dict[str, Any]] = {}
        async with open_broker(cfg) as broker:
            for name in targets:
                with trio.fail_after(20):
                    env = await broker.call({"target": name, "method": "GET", "path": "/p"})
                rec = assert_ok(broker, env)
                view = record_view(rec, broker.events(env["invocation_id"]))
                kind = EventKind.PROTOCOL_OBSERVED.value
                observed = [e["attrs"]["facts"] for e in view["events"] if e["kind"] == kind]
                assert observed
                facts[name] = _numbers(observed)
    # Sent (the injected values differ in length by 35 bytes), and measured nowhere:
    assert len(one.requests) == len(other.requests) == 1
    assert facts["short"] == facts["long"]


def _echo(req: Received) -> Reply:
    """An endpoint that echoes the credential it was sent (a debug page, a login error)."""
    said = req.header("authorization") or req.header("x-api-key") or req.target
    return Reply(
        200,
        headers=[("ETag", f'"{hashlib.md5(said.encode()).hexdigest()}"')],
        body=f"you sent: {said}".encode(),
    )


@pytest.mark.parametrize("inject", ["bearer", "header:X-Api-Key", "query:api_key"])
async def test_an_echoed_credential_is_not_measured_by_what_the_caller_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inject: str
) -> None:
    """The echo is redacted; the size of what was received (the driver's counts, the remote's
    Content-Length) and a header digesting it (ETag) would still give the credential's length
    -- or let a guess be checked offline -- so they are withheld (docs/redaction.md)."""
    monkeypatch.setenv("SHORT_SECRET", "s3cret-value-1")
    monkeypatch.setenv("LONG_SECRET", "s3cret-" + "L" * 41)
    async with (
        HostileServer.running(scripts.serve(_echo)) as one,
        HostileServer.running(scripts.serve(_echo)) as other,
    ):
        targets = {
            "short": http_target(one.url, credential="env:SHORT_SECRET", inject=inject),
            "long": http_target(other.url, credential="env:LONG_SECRET", inject=inject),
        }
        cfg = write_config(tmp_path, targets)
        seen: dict[str, Any] = {}
        async with open_broker(cfg) as broker:
            for name in targets:
                with trio.fail_after(20):
                    env = await broker.call({"target": name, "method": "GET", "path": "/p"})
                rec = assert_ok(broker, env)
                view = record_view(rec, broker.events(env["invocation_id"]))
                kind = EventKind.PROTOCOL_OBSERVED.value
                observed = [e["attrs"]["facts"] for e in view["events"] if e["kind"] == kind]
                fetched = await broker.fetch_result(env["invocation_id"])
                seen[name] = {
                    "facts": _numbers(observed),
                    "evidence": _numbers(env["evidence"]["http"]),
                    "headers": [env["result"]["headers"], fetched["result"]["headers"]],
                    "body": env["result"]["body"],
                }
    assert len(one.requests) == len(other.requests) == 1
    assert "[REDACTED]" in seen["short"]["body"]  # sanity: it was echoed, and redacted
    for part in seen["short"]:
        assert seen["short"][part] == seen["long"][part], part
    names = {n.lower() for n, _ in seen["short"]["headers"][0]}
    assert not names & {"content-length", "etag"}


async def _echo_bytewise(peer: Peer) -> None:
    """Echo the credential in a chunked body of 1-byte chunks: every chunk is a ``body`` step,
    so the run's count in ``path_repeats`` is the body's size."""
    while (req := await peer.read_request()) is not None:
        body = f"you sent: {req.header('authorization')}".encode()
        wire = b"".join(b"1\r\n%c\r\n" % c for c in body)
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        await peer.send_raw(head + wire + b"0\r\n\r\n")


async def test_an_echo_in_one_byte_chunks_is_not_measured_by_its_step_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The body's size is withheld, and so is its run's count of steps: the path still says
    the ``body`` run repeated, not how often."""
    monkeypatch.setenv("SHORT_SECRET", "s3cret-value-1")
    monkeypatch.setenv("LONG_SECRET", "s3cret-" + "L" * 41)
    async with (
        HostileServer.running(_echo_bytewise) as one,
        HostileServer.running(_echo_bytewise) as other,
    ):
        targets = {
            "short": http_target(one.url, credential="env:SHORT_SECRET"),
            "long": http_target(other.url, credential="env:LONG_SECRET"),
        }
        cfg = write_config(tmp_path, targets)
        seen: dict[str, Any] = {}
        async with open_broker(cfg) as broker:
            for name in targets:
                with trio.fail_after(20):
                    env = await broker.call({"target": name, "method": "GET", "path": "/p"})
                rec = assert_ok(broker, env)
                view = record_view(rec, broker.events(env["invocation_id"]))
                kind = EventKind.PROTOCOL_OBSERVED.value
                [facts] = [e["attrs"]["facts"] for e in view["events"] if e["kind"] == kind]
                assert "[REDACTED]" in env["result"]["body"]  # sanity: echoed, and redacted
                seen[name] = {"facts": _numbers(facts), "http": _numbers(env["evidence"]["http"])}
    _assert_same(seen)
    assert facts["received_withheld"] == "redacted"
    assert [facts["path"][i] for i, n in facts["path_repeats"] if n is None] == ["body"]


async def _cut_echo(peer: Peer) -> None:
    """Echo the credential in a body cut short: the attempt ends without a result."""
    req = await peer.read_request()
    if req is None:
        return
    said = req.header("authorization") or ""
    await peer.send_raw(
        b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\nyou sent: " + said.encode() + b"\n"
    )
    await peer.close()


async def _cut_short_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, serve: Any
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """One call to ``serve`` under a short and under a long credential, each cut short: their
    envelopes and the numbers a caller reads in their PROTOCOL_OBSERVED and ATTEMPT_INTERRUPTED
    events (``generation`` aside), by the credential's name."""
    monkeypatch.setenv("SHORT_SECRET", "s3cret-value-1")
    monkeypatch.setenv("LONG_SECRET", "s3cret-" + "L" * 41)
    async with HostileServer.running(serve) as one, HostileServer.running(serve) as other:
        targets = {
            "short": http_target(one.url, credential="env:SHORT_SECRET"),
            "long": http_target(other.url, credential="env:LONG_SECRET"),
        }
        cfg = write_config(tmp_path, targets)
        envs: dict[str, dict[str, Any]] = {}
        seen: dict[str, dict[str, Any]] = {}
        async with open_broker(cfg) as broker:
            for name in targets:
                with trio.fail_after(20):
                    env = await broker.call({"target": name, "method": "GET", "path": "/p"})
                assert env["error"]["outcome"] == "unknown", env
                rec = broker.record(env["invocation_id"])
                assert rec is not None
                view = record_view(rec, broker.events(env["invocation_id"]))
                kinds = (EventKind.PROTOCOL_OBSERVED.value, EventKind.ATTEMPT_INTERRUPTED.value)
                attrs = [e["attrs"] for e in view["events"] if e["kind"] in kinds]
                assert attrs
                envs[name] = env
                seen[name] = _numbers(
                    [{k: v for k, v in a.items() if k not in ("generation", "boot")} for a in attrs]
                )
    assert len(one.requests) == len(other.requests) == 1
    return envs, seen


def _assert_same(seen: dict[str, dict[str, Any]]) -> None:
    a, b = seen["short"], seen["long"]
    assert a == b, {k: (a.get(k), b.get(k)) for k in a.keys() | b.keys() if a.get(k) != b.get(k)}


async def test_an_echo_in_an_answer_cut_short_is_not_measured_either(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    envs, seen = await _cut_short_numbers(tmp_path, monkeypatch, _cut_echo)
    assert {env["error"]["code"] for env in envs.values()} == {"REMOTE_RESULT_INCOMPLETE"}
    _assert_same(seen)


async def _cut_head_echo(peer: Peer) -> None:
    """Echo the credential in a response header, then cut the body: the attempt ends without
    a result, and the echo is in no stream (the head is parsed, never sunk)."""
    req = await peer.read_request()
    if req is None:
        return
    said = req.header("authorization") or ""
    await peer.send_raw(
        b"HTTP/1.1 200 OK\r\nX-Echo: " + said.encode() + b"\r\nContent-Length: 100000\r\n\r\nok"
    )
    await peer.close()


async def _cut_in_head_echo(peer: Peer) -> None:
    """Echo the credential in a response head cut before its end: nothing of it is parsed."""
    req = await peer.read_request()
    if req is None:
        return
    said = req.header("authorization") or ""
    await peer.send_raw(b"HTTP/1.1 200 OK\r\nX-Echo: " + said.encode() + b"\r\n")
    await peer.close()


@pytest.mark.parametrize("serve", [_cut_head_echo, _cut_in_head_echo])
async def test_an_echo_in_the_head_of_an_answer_cut_short_is_not_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, serve: Any
) -> None:
    """The bytes received (``response_bytes``) count the head: a header echoing the credential
    would give its length by subtraction from what the caller expects of the rest."""
    _, seen = await _cut_short_numbers(tmp_path, monkeypatch, serve)
    _assert_same(seen)


def _echo_then(tail: bytes, status: bytes = b"200 OK") -> Any:
    """A peer whose head echoes the credential in ``X-Echo``, followed (in the same write) by
    ``tail``: the rest of a head or a body that ends the exchange before a result."""

    async def serve(peer: Peer) -> None:
        req = await peer.read_request()
        if req is None:
            return
        said = (req.header("authorization") or "").encode()
        await peer.send_raw(b"HTTP/1.1 " + status + b"\r\nX-Echo: " + said + b"\r\n" + tail)
        await peer.close()

    return serve


# Each ended the exchange in the sans-IO core (or, the first, once the driver saw the head)
# before the driver recorded the head: the head's echo went unseen and ``response_bytes``,
# which counts it, measured the credential (fixF review #1).
_HEAD_ECHO_ENDS = {
    # Framed by both Transfer-Encoding and Content-Length: malformed at its head.
    "te-and-cl": _echo_then(b"Transfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n2\r\nok"),
    # The head and a broken chunk in one read: h11 refuses the chunk after yielding the head.
    "broken-chunk": _echo_then(b"Transfer-Encoding: chunked\r\n\r\nzz\r\nok\r\n"),
    # A 101 no request asked for: h11 refuses it after taking its bytes from its buffer.
    "unasked-101": _echo_then(b"Upgrade: x\r\n\r\n", b"101 Switching Protocols"),
    # A field line h11 refuses: the head's bytes are gone from its buffer, nothing parsed.
    "refused-field": _echo_then(b"no colon here\r\n\r\n"),
}


@pytest.mark.parametrize("serve", list(_HEAD_ECHO_ENDS.values()), ids=list(_HEAD_ECHO_ENDS))
async def test_an_echo_in_a_head_that_ends_the_exchange_is_not_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, serve: Any
) -> None:
    _, seen = await _cut_short_numbers(tmp_path, monkeypatch, serve)
    _assert_same(seen)


async def _cut_after_informational_echo(peer: Peer) -> None:
    """Echo the credential in an informational (1xx) head, then close: no final response."""
    req = await peer.read_request()
    if req is None:
        return
    said = req.header("authorization") or ""
    await peer.send_raw(b"HTTP/1.1 103 Early Hints\r\nX-Echo: " + said.encode() + b"\r\n\r\n")
    await peer.close()


async def test_an_echo_in_an_informational_head_is_not_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, seen = await _cut_short_numbers(tmp_path, monkeypatch, _cut_after_informational_echo)
    _assert_same(seen)


def _echo_last(req: Received) -> Reply:
    """The credential echoed as the body's last bytes: still held back by the redactor when the
    adapter is done reading, replaced only when the sink finishes."""
    return Reply(200, body=b"you sent: " + (req.header("authorization") or "").encode())


async def test_a_committed_result_is_withheld_from_once_without_a_scan_of_held_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A complete answer's received sizes are withheld once, by ``delivery._commit`` after the
    sink finished (it then knows which streams echoed a secret): not also before, by scanning
    the bytes each redactor still holds back (``StreamSink.redacted_streams``: ``Redactor.sub``
    per stream per call, issue 15).  An echo in the held-back tail is withheld all the same."""
    import affidavit.engine.attempt as attempt_mod
    import affidavit.engine.delivery as delivery_mod
    from affidavit.engine.echoed import without_received_size as withheld
    from affidavit.secrets.redaction import Redactor

    calls = {"withheld": 0, "sub": 0}
    sub = Redactor.sub

    def counted(*args: Any) -> Any:
        calls["withheld"] += 1
        return withheld(*args)

    def counted_sub(self: Redactor, data: bytes) -> bytes:
        calls["sub"] += 1
        return sub(self, data)

    monkeypatch.setattr(delivery_mod, "without_received_size", counted, raising=False)
    monkeypatch.setattr(attempt_mod, "without_received_size", counted)
    monkeypatch.setattr(Redactor, "sub", counted_sub)
    monkeypatch.setenv("ECHO_SECRET", "s3cret-value-1")
    async with HostileServer.running(scripts.serve(_echo_last)) as server:
        cfg = write_config(tmp_path, {"api": http_target(server.url, credential="env:ECHO_SECRET")})
        async with open_broker(cfg) as broker:
            for path in ("/a", "/b"):
                calls.update(withheld=0, sub=0)
                with trio.fail_after(20):
                    env = await broker.call({"target": "api", "method": "GET", "path": path})
                rec = assert_ok(broker, env)
                assert calls == {"withheld": 1, "sub": 0}, path
                assert env["result"]["body"].endswith("[REDACTED]")
                view = record_view(rec, broker.events(env["invocation_id"]))
                kind = EventKind.PROTOCOL_OBSERVED.value
                (facts,) = [e["attrs"]["facts"] for e in view["events"] if e["kind"] == kind]
                assert facts["received_withheld"] == "redacted"
                counts = ("body_bytes", "response_bytes", "total")
                assert [facts[k] for k in counts] == [None] * 3  # null: a retry merges
