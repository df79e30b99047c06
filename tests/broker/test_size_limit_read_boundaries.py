"""A body past ``max_result`` leaves the same evidence whatever the read boundaries: whole in one
write (framing complete in the read that crosses the limit) or in many.  The exchange used to
fire h11's end of message before the driver saw the piece was over the limit: its path ended
``framing_complete``, with no ``closed_early`` step and no ``http.result_size_limit`` fact,
unlike the same body crossing the limit over several reads.  Loopback only, every wait bounded.
"""

from __future__ import annotations

import contextlib
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
    # ``echo``: the body holds the credential, so the stream is redacted and its counts are
    # withheld -- in the exchange's fact as in the record's (engine/echoed.py).
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
        if echo:
            assert over == {"limit": LIMIT, "received_withheld": "redacted"}
        else:
            assert over["limit"] == LIMIT and over["received_bytes"] > LIMIT
    assert one["http"]["path"][-2:] == many["http"]["path"][-2:] == ["body", "closed_early"]
    assert set(one["http"]["result_size_limit"]) == set(many["http"]["result_size_limit"])
