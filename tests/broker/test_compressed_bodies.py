"""Compressed bodies are decoded before the redaction scan; one the broker cannot scan is
withheld, and the result says so (affidavit/protocols/http/decoding.py, docs/redaction.md).

Issue 9: httpbin's ``/gzip`` echoed ``Authorization: Bearer …`` inside a gzip body that came
back to the caller as ``body_base64`` -- no byte of the token for a scan of the wire bytes.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.protocols.http.decoding import MAX_RATIO, SIZE_FLOOR, BodyDecoder, Withheld
from affidavit.secrets.redaction import REDACTED, Redactor, tail_window
from tests.http.hostile import HostileServer, Received, Reply, scripts

from .helpers import assert_ok, assert_same_result, http_target, open_broker, write_config


def _raw_deflate(data: bytes) -> bytes:
    c = zlib.compressobj(wbits=-15)
    return c.compress(data) + c.flush()


def _echo(encode: Any, coding: str) -> Any:
    def reply(req: Received) -> Reply:
        text = f'{{"headers": {{"Authorization": "{req.header("authorization")}"}}}}'.encode()
        return Reply(200, headers=[("Content-Encoding", coding)], body=encode(text))

    return reply


async def _call(tmp: Path, reply: Any) -> tuple[Any, dict[str, Any]]:
    with trio.fail_after(20):
        async with HostileServer.running(scripts.serve(reply)) as srv:
            cfg = write_config(tmp, {"t": http_target(srv.url)})
            async with open_broker(cfg) as broker:
                env = await broker.call({"target": "t", "method": "GET", "path": "/gzip"})
                assert_ok(broker, env)
                fetched = await broker.fetch_result(env["invocation_id"])
                assert fetched is not None
                assert_same_result(env["result"], fetched["result"])
                return broker, env


@pytest.mark.parametrize(
    ("coding", "encode"),
    [
        ("gzip", gzip.compress),
        ("x-gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("deflate", _raw_deflate),
        ("gzip", lambda b: gzip.compress(b[:10]) + gzip.compress(b[10:])),  # two members
        ("deflate, gzip", lambda b: gzip.compress(zlib.compress(b))),
        ("identity, gzip", gzip.compress),
    ],
)
async def test_a_compressed_echo_is_decoded_then_redacted(
    tmp_path: Path, token: str, coding: str, encode: Any
) -> None:
    _, env = await _call(tmp_path, _echo(encode, coding))
    result = env["result"]
    assert result["body"] == '{"headers": {"Authorization": "[REDACTED]"}}'
    assert result["content_encoding_decoded"] == coding.replace("identity, ", "")
    assert token not in str(env)


@pytest.mark.parametrize(
    ("coding", "body", "reason", "kept"),
    # mtime=0: the same bytes, so the same test ids, in every process (pytest-xdist's workers
    # refuse to run when they collect different ids; the header's time once made them differ).
    [
        ("br", b"\x1b\x03\x00\xf8\xa5", "unsupported_content_encoding", b""),
        ("gzip, zstd", gzip.compress(b"x", mtime=0), "unsupported_content_encoding", b""),
        ("gzip", b"not gzip at all", "corrupt_encoding", b""),
        # no trailer:
        ("gzip", gzip.compress(b"A" * 1000, mtime=0)[:-8], "corrupt_encoding", b"A" * 1000),
        ("deflate", zlib.compress(b"hello") + b"trailing", "corrupt_encoding", b"hello"),
    ],
)
async def test_a_body_the_broker_cannot_scan_is_withheld_and_the_result_says_so(
    tmp_path: Path, token: str, coding: str, body: bytes, reason: str, kept: bytes
) -> None:
    _, env = await _call(tmp_path, Reply(200, headers=[("Content-Encoding", coding)], body=body))
    result = env["result"]
    withheld = result["body_withheld"]
    # No size of it: an unscanned body's size is an oracle on a secret it may echo
    # (tests/broker/test_unscanned_sizes.py).
    assert withheld == {"reason": reason, "content_encoding": withheld["content_encoding"]}
    # docs/redaction.md: the codings in order, each as itself if decoded here, else "other"
    named = {"br": "other", "gzip, zstd": "gzip, other"}.get(coding, coding)
    assert withheld["content_encoding"] == named
    # What decoded before the failure was scanned and is kept, marked as a prefix, but its
    # last ``tail_window`` bytes (all of "hello"), withheld as any cut stream's end is; the
    # rest (all of it for a coding the broker does not know) never reaches the caller.
    tail = tail_window(Redactor([token.encode(), f"Bearer {token}".encode()])._plan)
    shown = kept[: max(0, len(kept) - tail)] + REDACTED if kept else b""
    assert result.get("body", "").encode() == shown
    assert result.get("body_truncated", False) is bool(kept)
    assert "content_encoding_decoded" not in result


async def test_a_decompression_bomb_stops_at_the_ratio_limit(tmp_path: Path, token: str) -> None:
    bomb = gzip.compress(b"\0" * (64 << 20), compresslevel=9)  # ~64 KiB -> 64 MiB
    _, env = await _call(tmp_path, Reply(200, headers=[("Content-Encoding", "gzip")], body=bomb))
    withheld = env["result"]["body_withheld"]
    assert withheld["reason"] == "decoded_size_limit"
    # Past the inline limit: the decoded prefix kept (scanned, stored) is fetched by reference.
    assert 0 < env["result"]["by_reference"]["bytes"] <= SIZE_FLOOR + MAX_RATIO * len(bomb)
    assert env["result"]["body_truncated"] is True


async def test_an_empty_body_with_a_content_encoding_is_fine() -> None:
    decoder = BodyDecoder(["gzip"])
    out: list[bytes] = []

    async def keep(b: bytes) -> None:
        out.append(b)

    await decoder.finish(keep)
    assert out == []


async def test_a_stream_cut_inside_a_block_is_corrupt() -> None:
    decoder = BodyDecoder(["deflate"])

    async def keep(b: bytes) -> None:
        pass

    await decoder.feed(b"x", keep)  # one byte: not even a header
    with pytest.raises(Withheld, match="corrupt_encoding"):
        await decoder.finish(keep)
