"""A body past ``max_result`` leaves the same evidence whatever the read boundaries: whole in one
write (framing complete in the read that crosses the limit) or in many.  The exchange used to
fire h11's end of message before the driver saw the piece was over the limit: its path ended
``framing_complete``, with no ``closed_early`` step and no ``http.result_size_limit`` fact,
unlike the same body crossing the limit over several reads.  Loopback only, every wait bounded.
"""

from __future__ import annotations

import contextlib
import gzip
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.http.hostile import HostileServer, Peer, Script

from .helpers import TOKEN_ENV, assert_error, http_target, open_broker, write_config

LIMIT = 4096
BODY = bytes(range(256)) * 64  # 16 KiB: four times the limit


def _writes(body: bytes, pieces: int) -> Script:
    """The whole response in ``pieces`` writes, a pause between them (bounded: 16 x 20 ms)."""
    wire = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)

    async def script(peer: Peer) -> None:
        if await peer.read_request() is None:
            return
        size = -(-len(wire) // pieces)
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            for at in range(0, len(wire), size):
                await peer.stream.send_all(wire[at : at + size])
                if pieces > 1:
                    await trio.sleep(0.02)
            await trio.sleep(5)

    return script


async def _evidence(tmp: Path, body: bytes, pieces: int) -> dict[str, Any]:
    tmp.mkdir()
    with trio.fail_after(20):
        async with HostileServer.running(_writes(body, pieces)) as srv:
            target = http_target(srv.url, max_result=LIMIT)
            async with open_broker(write_config(tmp, {"api": target})) as broker:
                env = await broker.call({"target": "api", "method": "GET", "path": "/"})
                assert_error(broker, env, phase="remote_execution", outcome="unknown",
                             retry="after_correction", code="RESULT_SIZE_LIMIT")  # fmt: skip
    evidence: dict[str, Any] = env["evidence"]
    return evidence


@pytest.mark.parametrize("echo", [False, True])
async def test_one_write_or_many_the_abort_is_recorded_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, echo: bool
) -> None:
    # ``echo``: the body holds the credential, so the stream is redacted; either way its counts
    # are withheld -- in the exchange's fact as in the record's (engine/echoed.py).
    token = "tok-boundaries-" + "q" * 16
    monkeypatch.setenv(TOKEN_ENV, token)
    body = token.encode() + BODY if echo else BODY
    one = await _evidence(tmp_path / "one", body, 1)
    many = await _evidence(tmp_path / "many", body, 16)
    for ev in (one, many):
        over = ev["result_size_limit"]
        assert ev["http"]["path"][-1] == "closed_early", ev["http"]["path"]
        assert "framing_complete" not in ev["http"]["path"]
        assert ev["http"]["result_size_limit"] == over
        assert ev["response_complete"] is False
        # Cut short: its end is withheld whatever it was, so its counts go either way.
        why = "redacted" if echo else "tail_redacted"
        assert over == {"limit": LIMIT, "received_withheld": why}
    assert one["http"]["path"][-2:] == many["http"]["path"][-2:] == ["body", "closed_early"]
    assert set(one["http"]["result_size_limit"]) == set(many["http"]["result_size_limit"])


def _chunked(body: bytes, trailer: bytes = b"") -> bytes:
    return b"%x\r\n%s\r\n0\r\n%s\r\n" % (len(body), body, trailer)


_GZIPPED = gzip.compress(BODY, mtime=0)  # well under the limit; decoded, four times over it
assert len(_GZIPPED) < LIMIT

# Each shape in one write: the end of message (or the bytes past it) arrives in the read that
# crosses the limit.  ``follow``: the over-limit body is a followed redirect's (read past, not
# stored), which is held to ``max_result`` all the same.
_SHAPES = {
    "chunked_trailers": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + _chunked(BODY, b"X-Checksum: 1\r\n"),
        False,
    ),
    "informational_then_final": (
        b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY),
        False,
    ),
    "bytes_past_the_message": (
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
        + b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
        False,
    ),
    "close_delimited": (b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + BODY, False),
    "gzip_decoded_past_the_limit": (
        b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s"
        % (len(_GZIPPED), _GZIPPED),
        False,
    ),
    "redirect_followed": (
        b"HTTP/1.1 307 Moved\r\nLocation: /final\r\nContent-Length: %d\r\n\r\n%s"
        % (len(BODY), BODY),
        True,
    ),
}


def _one_write(wire: bytes, *, close: bool) -> Script:
    async def script(peer: Peer) -> None:
        if await peer.read_request() is None:
            return
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await peer.stream.send_all(wire)
            if close:
                await peer.stream.aclose()
                return
            await trio.sleep(5)

    return script


@pytest.mark.parametrize("shape", sorted(_SHAPES))
async def test_every_shape_in_one_write_records_the_abort(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shape: str
) -> None:
    monkeypatch.setenv(TOKEN_ENV, "tok-shapes-" + "s" * 16)
    wire, follow = _SHAPES[shape]
    with trio.fail_after(20):
        async with HostileServer.running(_one_write(wire, close=shape == "close_delimited")) as srv:
            target = http_target(srv.url, max_result=LIMIT, follow_redirects=follow or None)
            async with open_broker(write_config(tmp_path, {"api": target})) as broker:
                env = await broker.call({"target": "api", "method": "GET", "path": "/"})
                assert_error(broker, env, phase="remote_execution", outcome="unknown",
                             retry="after_correction", code="RESULT_SIZE_LIMIT")  # fmt: skip
    ev = env["evidence"]
    assert ev["http"]["path"][-2:] == ["body", "closed_early"], ev["http"]["path"]
    assert "framing_complete" not in ev["http"]["path"]
    assert ev["http"]["result_size_limit"] == ev["result_size_limit"]
    assert ev["result_size_limit"]["limit"] == LIMIT
    assert [r.target for r in srv.requests] == ["/"]
