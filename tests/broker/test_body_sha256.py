"""The HTTP result's ``body_sha256`` fact is the SHA-256 of the body bytes received -- the wire
bytes, before decoding and redaction -- whoever computes it: the exchange itself, or the result
sink, which hashes what it is given anyway (``AttemptContext.fed``, issue 15).  Checked against
the bytes the server sent, for bodies the redactor leaves alone and bodies it changes (mid-stream,
and at the very end, where only ``flush`` decides), plain, chunked and compressed.

The journal keeps that wire evidence on REMOTE_RESPONSE_COMPLETE (``body_bytes``,
``body_sha256``) only when it says nothing of a secret: for a body in which redaction replaced
something, or that no scan saw whole (a coding the broker cannot decode), the hash of the bytes
received would let a reader of the record test guesses of the secret offline, so
``body_received_withheld`` says why it is not there."""

from __future__ import annotations

import gzip
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.engine import RESULT_CHUNK
from affidavit.protocols.http.binding import HttpBinding
from affidavit.statemachine import EventKind
from tests.http.hostile import HostileServer, Received, Reply, scripts

from .helpers import assert_ok, closed_port, http_target, open_broker, write_config

FILL = b"0123456789abcdef" * (RESULT_CHUNK // 8)  # two stored chunks' worth


def _body(shape: str, auth: bytes) -> bytes:
    return {
        "plain": FILL * 3 + b"tail",
        "echo_mid": FILL + auth + FILL,
        "echo_end": FILL + auth,
        "echo_escaped": FILL + auth.replace(b"o", b"\\u006f") + FILL,
    }[shape]


def _reply(shape: str, encoding: str, sent: list[bytes]) -> Callable[[Received], Reply]:
    def reply(req: Received) -> Reply:
        body = _body(shape, (req.header("authorization") or "").encode())
        headers: list[tuple[str, str]] = []
        if encoding == "gzip":
            body = gzip.compress(body)
            headers.append(("Content-Encoding", "gzip"))
        sent.append(body)
        return Reply(200, headers=headers, body=body, chunked=encoding == "chunked")

    return reply


@pytest.mark.parametrize("encoding", ["length", "chunked", "gzip"])
@pytest.mark.parametrize("shape", ["plain", "echo_mid", "echo_end", "echo_escaped"])
async def test_body_sha256_is_the_hash_of_the_bytes_received(
    tmp_path: Path, token: str, shape: str, encoding: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[bytes] = []
    facts: list[dict[str, Any]] = []
    perform = HttpBinding.perform

    async def recorded(self: HttpBinding, prepared: Any, ctx: Any) -> Any:
        result = await perform(self, prepared, ctx)
        facts.append(dict(result.facts))
        return result

    monkeypatch.setattr(HttpBinding, "perform", recorded)
    with trio.fail_after(20):
        async with HostileServer.running(scripts.serve(_reply(shape, encoding, sent))) as srv:
            cfg = write_config(tmp_path, {"api": http_target(srv.url)})
            async with open_broker(cfg) as broker:
                env = await broker.call({"target": "api", "method": "GET", "path": "/x"})
                assert_ok(broker, env)
                complete = _complete(broker, env["invocation_id"])
                events = str(list(broker.events(env["invocation_id"])))
    assert len(sent) == 1 and len(facts) == 1
    assert facts[0]["body_bytes"] == len(sent[0])
    assert facts[0]["body_sha256"] == hashlib.sha256(sent[0]).hexdigest()
    if shape != "plain":
        assert token not in str(env) and "[REDACTED]" in str(env)
    wire = hashlib.sha256(sent[0]).hexdigest()
    if shape == "plain":
        assert complete["body_sha256"] == "sha256:" + wire
        assert complete["body_bytes"] == len(sent[0])
        assert "body_received_withheld" not in complete
    else:
        assert complete["body_received_withheld"] == "redacted"
        assert "body_bytes" not in complete and "body_sha256" not in complete
        assert wire not in events and token not in events


def _complete(broker: Any, iid: str) -> dict[str, Any]:
    [event] = [e for e in broker.events(iid) if e.kind is EventKind.REMOTE_RESPONSE_COMPLETE]
    return dict(event.attrs)


async def test_a_body_no_scan_saw_keeps_no_wire_hash(tmp_path: Path, token: str) -> None:
    """A coding the broker cannot decode (``br``): the body is withheld unscanned, and so is
    the hash of its bytes -- they may hold the secret in a form no scan looked for."""
    body = b"\x8b\x02\x80" + token.encode() + b"\x03"

    def reply(req: Received) -> Reply:
        return Reply(200, headers=[("Content-Encoding", "br")], body=body)

    with trio.fail_after(20):
        async with HostileServer.running(scripts.serve(reply)) as srv:
            cfg = write_config(tmp_path, {"api": http_target(srv.url)})
            async with open_broker(cfg) as broker:
                env = await broker.call({"target": "api", "method": "GET", "path": "/x"})
                assert_ok(broker, env)
                complete = _complete(broker, env["invocation_id"])
                events = str(list(broker.events(env["invocation_id"])))
    assert env["result"]["body_withheld"]["reason"] == "unsupported_content_encoding"
    assert complete["body_received_withheld"] == "unscanned"
    assert hashlib.sha256(body).hexdigest() not in events and token not in events


async def test_a_3xx_body_cut_to_its_buffer_keeps_no_wire_hash(tmp_path: Path, token: str) -> None:
    """A 3xx to be followed is buffered only up to ``REDIRECT_BODY_BUFFER``; when the next hop
    cannot be set up, that 3xx is the result, its stored body cut short (``body_truncated``).
    The scan saw only the buffered part, so the hash (and size) of the whole body received is
    an oracle for a secret echoed past it: it must be withheld as unscanned."""
    port = closed_port()
    echoed = b"x" * (70 * 1024) + b"echo: " + token.encode() + b"\n"

    def reply(req: Received) -> Reply:
        return Reply(307, headers=[("Location", f"http://127.0.0.1:{port}/x")], body=echoed)

    with trio.fail_after(20):
        async with HostileServer.running(scripts.serve(reply)) as srv:
            target = http_target(
                srv.url, follow_redirects=True, redirect_origins=[f"http://127.0.0.1:{port}"]
            )
            cfg = write_config(tmp_path, {"api": target})
            async with open_broker(cfg) as broker:
                env = await broker.call({"target": "api", "method": "GET", "path": "/x"})
                iid = env["invocation_id"]
                complete = _complete(broker, iid)
                events = str(list(broker.events(iid)))
    assert env["result"]["status"] == 307 and env["result"]["body_truncated"] is True
    assert token not in str(env)
    wire = hashlib.sha256(echoed).hexdigest()
    assert wire not in events and token not in events
    assert "body_sha256" not in complete and "body_bytes" not in complete
    assert complete["body_received_withheld"] == "unscanned"
