"""A body the broker could not scan says nothing of its size or hash to a caller
(docs/redaction.md, "Compressed bodies"; ``engine/echoed.py``).

CRIME-style oracle: a server that echoes the request's headers in a compressed body puts the
injected credential beside bytes the agent chose; the compressed size then tells whether the
agent's guess matches the credential.  A ``br``/``zstd`` body is never scanned, so redaction
cannot notice -- its received size, decoded size, ``Content-Length``, the protocol facts' byte
counts and the hash of its bytes must all go, as for a stream redaction replaced something in.
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.views import record_view
from tests.http.hostile import HostileServer, Received, Reply, scripts

from .helpers import TOKEN_ENV, assert_ok, http_target, open_broker, write_config

_SIZE = re.compile(r"bytes|sha256|total|length|digest|hash|md5|etag|range", re.I)
_RUN = frozenset({"config_hash", "account_hash", "summary_sha256", "sealed_summary_sha256"})
"""Hashes that differ between runs for reasons other than the body: the config, the account (a
keyed hash of the target's origin and credential reference) and the summary name the server's
port (a summary the caller reads whole anyway), a sealed blob's nonce."""


def _sizes(value: Any, path: str = "") -> list[tuple[str, Any]]:
    """Every (path, value) a caller could measure the body by: keys naming a size or hash,
    and the headers that measure or digest it."""
    out: list[tuple[str, Any]] = []
    if isinstance(value, dict):
        for k, v in value.items():
            if _SIZE.search(str(k)) and k not in _RUN and not isinstance(v, dict | list):
                out.append((f"{path}.{k}", v))
            out.extend(_sizes(v, f"{path}.{k}"))
    elif isinstance(value, list):
        if len(value) == 2 and isinstance(value[0], str) and _SIZE.search(value[0]):
            out.append((f"{path}[{value[0].lower()}]", value[1]))
        for i, v in enumerate(value):
            out.extend(_sizes(v, f"{path}[{i}]"))
    return out


def _echo(coding: str, pad: int) -> Any:
    def reply(req: Received) -> Reply:
        # Not real brotli/zstd: the broker decodes neither, and its bytes' length is the oracle.
        text = f'{{"a": "{req.header("authorization")}", "pad": "{"x" * pad}"}}'.encode()
        return Reply(200, headers=[("Content-Encoding", coding)], body=text)

    return reply


async def _seen(tmp: Path, coding: str, pad: int) -> list[tuple[str, Any]]:
    """What a caller reads of one call: the envelope, and the record view as the caller path
    renders it (``Broker.record``/``events``, caller's holder tag)."""
    with trio.fail_after(20):
        async with HostileServer.running(scripts.serve(_echo(coding, pad))) as srv:
            cfg = write_config(tmp, {"t": http_target(srv.url)})
            async with open_broker(cfg) as broker:
                env = await broker.call({"target": "t", "method": "GET", "path": "/"})
                assert_ok(broker, env)
                iid = env["invocation_id"]
                assert env["result"]["body_withheld"]["reason"] == "unsupported_content_encoding"
                rec = broker.record(iid)
                assert rec is not None
                tag = broker.journal.holder_tag
                view = record_view(rec, broker.events(iid), holder=tag)
                return _sizes({"envelope": env, "view": view})


@pytest.mark.parametrize("coding", ["br", "zstd", "gzip, br"])
async def test_no_size_or_hash_of_an_unscanned_body_reaches_a_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, coding: str
) -> None:
    seen = []
    for n, (token, pad) in enumerate([("tok-" + "a" * 8, 3), ("tok-" + "b" * 40, 50)]):
        monkeypatch.setenv(TOKEN_ENV, token)
        (tmp_path / str(n)).mkdir()
        seen.append(await _seen(tmp_path / str(n), coding, pad))
    # Same request, bodies of two lengths holding credentials of two lengths: nothing a caller
    # reads differs in any size or hash.
    assert seen[0] == seen[1]


@pytest.mark.parametrize(
    ("coding", "body", "reason"),
    # mtime=0: the same bytes, so the same test ids, in every process (pytest-xdist's workers
    # refuse to run when they collect different ids; the header's time once made them differ).
    [
        ("gzip", gzip.compress(b"A" * 1000, mtime=0)[:-8], "corrupt_encoding"),  # no trailer
        ("gzip", gzip.compress(b"\0" * (8 << 20), compresslevel=9, mtime=0), "decoded_size_limit"),
    ],
)
async def test_a_corrupt_or_bomb_body_is_measured_nowhere_a_caller_reads(
    tmp_path: Path, token: str, coding: str, body: bytes, reason: str
) -> None:
    reply = Reply(200, headers=[("Content-Encoding", coding), ("ETag", '"e"')], body=body)
    with trio.fail_after(20):
        async with HostileServer.running(scripts.serve(reply)) as srv:
            cfg = write_config(tmp_path, {"t": http_target(srv.url)})
            async with open_broker(cfg) as broker:
                env = await broker.call({"target": "t", "method": "GET", "path": "/"})
                assert_ok(broker, env)
                iid = env["invocation_id"]
                view = record_view(broker.record(iid), broker.events(iid), holder=None)
    result = env["result"]
    assert result["body_withheld"] == {"reason": reason, "content_encoding": coding}
    assert result["body_truncated"] is True  # the scanned prefix is kept
    assert [h[0] for h in result["headers"]] == ["Content-Encoding"]
    assert env["evidence"]["http"]["received_withheld"] == "unscanned"
    for where in (env["evidence"]["http"], view["record"]["evidence"]["http"]):
        assert [where[k] for k in ("bytes", "body_bytes", "total")] == [None] * 3  # null
    complete = [e for e in view["events"] if e["kind"] == "REMOTE_RESPONSE_COMPLETE"]
    assert complete[0]["attrs"]["body_received_withheld"] == "unscanned"
    assert "body_sha256" not in complete[0]["attrs"]


_GZIP_HEAD = gzip.compress(b"")[:10]


def _cut(how: str, coding: str, pad: int) -> Any:
    """A body echoing the Authorization -- ``br``, or ``gzip`` whose deflate data is corrupt
    (block type 3) --, its head promising one byte more than is sent, then a stall past the
    target's total timeout or a close: the attempt ends without a result
    (ATTEMPT_INTERRUPTED), never committed."""

    async def script(peer: Any) -> None:
        req = await peer.read_request()
        if req is None:
            return
        text = f'{{"a": "{req.header("authorization")}", "pad": "{"x" * pad}"}}'.encode()
        if coding == "gzip":
            text = _GZIP_HEAD + b"\xff" + text
        head = (
            f"HTTP/1.1 200 OK\r\nContent-Encoding: {coding}\r\nContent-Length: {len(text) + 1}\r\n"
        )
        await peer.send_raw(head.encode() + b"\r\n" + text)
        if how == "close":
            await peer.close()
        else:
            await trio.sleep_forever()

    return script


async def _seen_cut(tmp: Path, how: str, coding: str, pad: int) -> list[tuple[str, Any]]:
    with trio.fail_after(20):
        async with HostileServer.running(_cut(how, coding, pad)) as srv:
            target = http_target(srv.url, timeout={"connect": 0.5, "total": 0.5})
            cfg = write_config(tmp, {"t": target})
            async with open_broker(cfg) as broker:
                env = await broker.call({"target": "t", "method": "GET", "path": "/"})
                assert env["error"]["outcome"] == "unknown", env
                iid = env["invocation_id"]
                rec = broker.record(iid)
                assert rec is not None
                events = broker.events(iid)
                assert "ATTEMPT_INTERRUPTED" in {e.kind.value for e in events}
                view = record_view(rec, events, holder=broker.journal.holder_tag)
                for where in (env["evidence"]["http"], view["record"]["evidence"]["http"]):
                    assert where["received_withheld"] == "unscanned"
                return _sizes({"envelope": env, "view": view})


@pytest.mark.parametrize("coding", ["br", "gzip"])
@pytest.mark.parametrize("how", ["stall", "close"])
async def test_an_interrupted_unscanned_body_is_measured_nowhere_a_caller_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str, coding: str
) -> None:
    seen = []
    for n, (token, pad) in enumerate([("tok-" + "a" * 8, 3), ("tok-" + "b" * 40, 50)]):
        monkeypatch.setenv(TOKEN_ENV, token)
        (tmp_path / str(n)).mkdir()
        seen.append(await _seen_cut(tmp_path / str(n), how, coding, pad))
    # The bytes received were counted as they arrived; nothing of them may differ now.
    assert seen[0] == seen[1]
