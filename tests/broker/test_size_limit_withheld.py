"""A result cut at ``max_result`` says nothing of its size to a caller when the stream echoed
the credential or was not scanned whole (docs/redaction.md, "What was received";
``engine/echoed.py``).

``evidence.result_size_limit`` (and ATTEMPT_INTERRUPTED's ``result_size_limit`` attr, its
message) said ``received_bytes`` and ``decoded_bytes``: the bytes that had arrived when the
broker stopped.  A body echoing the credential then measures it -- the same request under a
credential 32 bytes longer read 32 bytes more --, and a compressed one is a CRIME-style
oracle (its size tells whether bytes the caller chose match the credential).  The piece that
crossed the limit counts too, so it is scanned before the count is told; a compressed body
stopped at the limit was not decoded whole, so it is not measured either.  Nor is a clean
body: an answer cut short withholds its last bytes whatever they are (``Redactor.ending``),
so its counts go too -- ``tail_redacted`` -- and whether they are told never depends on what
the bytes were; a target with no credential to redact keeps them
(tests/broker/test_result_size_limit.py).
"""

from __future__ import annotations

import contextlib
import gzip
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import trio

from affidavit.adapters.base import ResultTooLarge
from affidavit.engine.sink import StreamSink
from affidavit.statemachine import envelope_schema
from affidavit.views import record_view
from tests.http.hostile import HostileServer, Peer, Received, Reply, Script, scripts

from .helpers import TOKEN_ENV, assert_error, http_target, open_broker, write_config
from .test_result_size_limit import _Journal
from .test_unscanned_sizes import _sizes

LIMIT = 4096
TOKENS = ("tok-" + "a" * 8, "tok-" + "b" * 40)


def _echo(coding: str) -> Any:
    """A body that echoes the Authorization it was sent and then passes ``max_result``: whole
    in one write, so the piece that crosses the limit holds the echo."""

    def reply(req: Received) -> Reply:
        text = f'{{"a": "{req.header("authorization")}", "pad": "'.encode()
        pad = bytes(range(256)) * 40  # 10 KiB, not compressible to nothing
        if coding == "identity":
            return Reply(200, body=text + pad)
        if coding == "gzip":
            return Reply(
                200, headers=[("Content-Encoding", "gzip")], body=gzip.compress(text + pad)
            )
        # Not real brotli: never decoded, its length is the oracle.
        return Reply(200, headers=[("Content-Encoding", "br")], body=text + pad)

    return reply


def _streamed(echo: bool, head: bytes = b"HTTP/1.1 200 OK\r\n") -> Script:
    """A chunked body: the Authorization echoed first (``echo``) or not, then 1 KiB chunks past
    the limit (at most 64 KiB, then the script waits): the piece that crosses the limit is
    clean, the echo was stored -- redacted -- before it."""

    async def script(peer: Peer) -> None:
        req = await peer.read_request()
        if req is None:
            return
        said = (req.header("authorization") or "") if echo else "no echo"
        first = f"you sent {said}\n".encode()
        wire = head + b"Transfer-Encoding: chunked\r\n\r\n"
        wire += b"%x\r\n%s\r\n" % (len(first), first)
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await peer.stream.send_all(wire)
            for _ in range(64):
                await peer.stream.send_all(b"400\r\n" + b"z" * 1024 + b"\r\n")
            await trio.sleep_forever()

    return script


async def _seen(tmp: Path, coding: str) -> tuple[list[tuple[str, Any]], dict[str, Any]]:
    """What a caller reads of one call cut at the limit: the envelope, the envelope fetched
    again, and the record and events views as the caller paths render them."""
    script = _streamed(coding == "streamed") if coding.startswith("stream") else None
    follow = {}
    if coding == "redirect":  # a 307 to follow, whose body echoes and runs past the limit
        script = _streamed(True, b"HTTP/1.1 307 Moved\r\nLocation: /next\r\n")
        follow = {"follow_redirects": True}
    with trio.fail_after(20):
        async with HostileServer.running(script or scripts.serve(_echo(coding))) as srv:
            target = http_target(srv.url, max_result=LIMIT, **follow)
            cfg = write_config(tmp, {"t": target})
            async with open_broker(cfg) as broker:
                env = await broker.call({"target": "t", "method": "GET", "path": "/"})
                assert_error(broker, env, phase="remote_execution", outcome="unknown",
                             retry="after_correction", code="RESULT_SIZE_LIMIT")  # fmt: skip
                iid = env["invocation_id"]
                fetched = await broker.fetch_result(iid)
                rec = broker.record(iid)
                assert rec is not None
                view = record_view(rec, broker.events(iid), holder=broker.journal.holder_tag)
    jsonschema.Draft202012Validator(envelope_schema()).validate(env)
    shown = {"envelope": env, "fetched": fetched, "view": view}
    messages = [env["error"]["message"], view["record"]["message"]]
    messages += [e["attrs"].get("message") for e in view["events"]]
    return [*_sizes(shown), ("messages", messages)], env


@pytest.mark.parametrize(
    ("coding", "reason"),
    [
        ("identity", "redacted"),
        ("gzip", "unscanned"),
        ("br", "unscanned"),
        ("streamed", "redacted"),
        ("redirect", "unscanned"),  # a followed 3xx's body is read past, never scanned
    ],
)
async def test_a_withheld_body_cut_at_max_result_does_not_measure_the_credential(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, coding: str, reason: str
) -> None:
    seen, envs = [], []
    for n, token in enumerate(TOKENS):
        monkeypatch.setenv(TOKEN_ENV, token)
        (tmp_path / str(n)).mkdir()
        numbers, env = await _seen(tmp_path / str(n), coding)
        seen.append(numbers)
        envs.append(env)
    # Credentials 32 bytes apart, the same request and padding: nothing a caller reads differs.
    assert seen[0] == seen[1]
    for env in envs:
        over = env["evidence"]["result_size_limit"]
        assert over == {"limit": LIMIT, "received_withheld": reason}
        # Whole in one piece or cut mid-body, the abort step's facts hold it too, withheld
        # alike (the exchange decides on a piece before an end read with it fires).
        assert env["evidence"]["http"]["result_size_limit"] == over
        assert env["evidence"]["http"]["received_withheld"] == reason


async def test_a_clean_body_cut_at_max_result_withholds_its_counts_as_any_cut_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, TOKENS[0])
    _, env = await _seen(tmp_path, "stream, clean")
    over = env["evidence"]["result_size_limit"]
    assert over == {"limit": LIMIT, "received_withheld": "tail_redacted"}
    assert env["evidence"]["http"]["result_size_limit"] == over
    assert "bytes received are not told: the result was cut short" in env["error"]["message"]


@pytest.mark.parametrize("echo", [b"", b"tok-secret-value"])
async def test_the_piece_that_crosses_max_result_is_scanned_not_stored(echo: bytes) -> None:
    """Any protocol's streams (SSH's stdout and stderr too): an echo in the piece the sink
    refuses marks its stream, whose counts the attempt's record then withholds."""
    journal = _Journal()
    sink = StreamSink(journal, "act_1", (b"tok-secret-value",), 1 << 20, max_result=100)  # type: ignore[arg-type]
    await sink("stdout", b"o" * 90)
    with pytest.raises(ResultTooLarge):
        await sink("stderr", b"e" * 5 + echo + b"e" * 10)
    # Both streams were cut short: their held-back ends withheld (``tail_redacted``) -- an
    # echo in the refused piece makes the reason ``redacted``.
    assert sink.withheld() == (["stdout", "stderr"], "redacted" if echo else "tail_redacted")
    await sink.writer.flush()
    assert journal.writer.stored <= 90
