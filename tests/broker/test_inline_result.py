"""The envelope of a call carries the result the sink just stored without reading it back
(affidavit/engine/sink.py, ``StreamSink.kept``): it must be exactly what ``fetch_result`` -- a real
read of the stored, verified result -- returns, for small, multi-chunk, binary, redacted and
too-large-to-keep results alike (seed, "A result delivery error must not repeat execution":
the delivered result and the retrievable one are the same result)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api import Broker
from affidavit.config import load_config
from affidavit.engine import RESULT_CHUNK, EngineSettings
from affidavit.journal import ResultStream
from tests.http.hostile import HostileServer, Received, Reply, scripts

from .helpers import assert_ok, http_target, open_broker, write_config

LIMIT = 10
GET = {"target": "api", "method": "GET", "path": "/thing"}
KEYED = {"header": "Idempotency-Key", "scope": "things.read", "retention": "24h"}


@pytest.fixture
def stored_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The invocations whose stored result was read back (chunks fetched, verified, decrypted):
    every such read goes through ``ResultStream.read``."""
    reads: list[str] = []
    real = ResultStream.read

    def counted(self: ResultStream, from_chunk: int = 0) -> Any:
        reads.append(self.invocation_id)
        return real(self, from_chunk)

    monkeypatch.setattr(ResultStream, "read", counted)
    return reads


async def _call_and_fetch(tmp_path: Path, reply: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    async with HostileServer.running(scripts.serve(reply)) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                env = await broker.call(GET)
                assert_ok(broker, env)
                fetched = await broker.fetch_result(env["invocation_id"])
    assert fetched is not None
    return env, fetched


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b'{"ok":true}',
        bytes(range(256)) * 3,  # not UTF-8: delivered as body_base64
        b"x" * (RESULT_CHUNK * 2 + 17),  # several stored chunks, kept in memory
    ],
    ids=["empty", "small", "binary", "multi-chunk"],
)
async def test_the_delivered_result_is_the_stored_result(tmp_path: Path, token: str, body: bytes):
    env, fetched = await _call_and_fetch(
        tmp_path, Reply(200, headers=[("x-request-id", "r-1")], body=body)
    )
    assert env["result"] == fetched["result"]
    assert env["result"]["sha256"] == env["evidence"]["result"]["sha256"]
    if body:
        assert env["result"]["sha256"] != ""


async def test_a_result_over_the_inline_limit_is_returned_by_reference_not_read_back(
    tmp_path: Path, token: str, stored_reads: list[str]
) -> None:
    """Issue 15: above the inline limit the call's envelope carries the result's size, hash and
    a fetch reference -- not the body, and without reading it back; ``fetch_result`` (what the
    reference names) returns the body, whose size and hash are the referenced ones."""
    settings = EngineSettings(inline_result_limit=RESULT_CHUNK)
    body = b"y" * (RESULT_CHUNK * 2 + 5)

    async with HostileServer.running(scripts.serve(Reply(200, body=body))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with Broker.open(config=load_config(cfg), settings=settings) as broker:
            with trio.fail_after(LIMIT):
                env = await broker.call(GET)
                assert_ok(broker, env)
                assert stored_reads == []  # not read back
                fetched = await broker.fetch_result(env["invocation_id"])
    assert fetched is not None
    result = env["result"]
    assert "body" not in result and "body_base64" not in result
    ref = result["by_reference"]
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    assert ref["bytes"] == len(body)
    chunks = env["evidence"]["result"]["chunks"]["body"]
    assert chunks >= 2
    assert ref["streams"] == {"body": {"bytes": len(body), "chunks": chunks, "sha256": digest}}
    assert ref["fetch"] == {"invocation_id": env["invocation_id"], "from_chunk": 0}
    assert str(RESULT_CHUNK) in ref["reason"]
    # The rest of the result is the stored one, and the reference's whole hash is the record's.
    assert fetched["result"]["body"].encode() == body
    assert result["sha256"] == fetched["result"]["sha256"] == env["evidence"]["result"]["sha256"]
    assert result["status"] == fetched["result"]["status"] == 200
    assert {k: v for k, v in result.items() if k != "by_reference"} == {
        k: v for k, v in fetched["result"].items() if k != "body"
    }


async def test_a_small_result_is_not_read_back_but_fetch_result_still_reads(
    tmp_path: Path, token: str, stored_reads: list[str]
) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                env = await broker.call(GET)
                assert stored_reads == []
                fetched = await broker.fetch_result(env["invocation_id"])
                assert stored_reads == [env["invocation_id"]]  # fetch_result is a real read
    assert fetched is not None and fetched["result"] == env["result"]


async def test_an_echoed_credential_is_redacted_in_the_kept_copy_too(
    tmp_path: Path, token: str
) -> None:
    def echo(req: Received) -> Reply:
        auth = req.header("authorization") or ""
        # Split across what a reader might see as two reads, and repeated.
        return Reply(200, body=(f"before {auth} middle {auth.split()[-1]} after").encode())

    env, fetched = await _call_and_fetch(tmp_path, echo)
    assert token not in repr(env) and token not in repr(fetched)
    assert "[REDACTED]" in env["result"]["body"]
    assert env["result"] == fetched["result"]


async def test_a_same_key_call_answers_a_large_result_by_reference_as_the_first_did(
    tmp_path: Path, token: str, stored_reads: list[str]
) -> None:
    """The same idempotency key again returns the recorded result (nothing sent): above the
    inline limit by the same reference the first call answered with, without reading the
    chunks; a fetch still returns the body the reference names."""
    settings = EngineSettings(inline_result_limit=RESULT_CHUNK)
    body = b"z" * (RESULT_CHUNK * 3 + 1)
    action = {**GET, "idempotency_key": "k-large"}
    async with HostileServer.running(scripts.serve(Reply(200, body=body))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url, idempotency=KEYED)})
        async with Broker.open(config=load_config(cfg), settings=settings) as broker:
            with trio.fail_after(LIMIT):
                first = await broker.call(action)
                assert_ok(broker, first)
                again = await broker.call(action)
                assert stored_reads == []  # answered from the marker, chunks not read
                fetched = await broker.fetch_result(first["invocation_id"])
                assert stored_reads == [first["invocation_id"]]
        requests = len(srv.requests)
    assert requests == 1  # the same key never reached the remote again
    assert again["invocation_id"] == first["invocation_id"]
    assert again["result"] == first["result"] and "by_reference" in again["result"]
    assert fetched is not None and fetched["result"]["body"].encode() == body


async def test_a_same_key_call_answers_a_small_result_whole(tmp_path: Path, token: str) -> None:
    action = {**GET, "idempotency_key": "k-small"}
    async with HostileServer.running(scripts.serve(Reply(200, body=b"small"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url, idempotency=KEYED)})
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                first = await broker.call(action)
                again = await broker.call(action)
    assert again["result"] == first["result"] and again["result"]["body"] == "small"
