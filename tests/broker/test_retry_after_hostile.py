"""A ``Retry-After`` the broker cannot read is no Retry-After, never a failed call: "²" (a
latin-1 byte h11 passes, ``str.isdigit`` took and ``int`` refused), digit runs ``float``
overflowed or ``int`` refused (400, 5000 digits) and an HTTP-date whose year overflows made
the classification of a complete response raise, so a recorded 200 or 503 came back
REMOTE_OUTCOME_UNKNOWN -- less than the record proves.  Served raw on loopback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from tests.http.hostile import HostileServer, Peer

from .helpers import TOKEN_ENV, http_target, open_broker, write_config

HOSTILE = (
    b"\xb2",
    b"\xb9\xb2\xb3",
    b"9" * 400,
    b"1" * 5000,
    b"Sun, 06 Nov 99999999999999 08:49:37 GMT",
)


async def _answer(peer: Peer) -> None:
    """A request ``/<status>/<i>`` answered ``<status>`` with ``Retry-After: HOSTILE[i]``, bytes
    h11 would not send; one a connection (h11's state knows nothing of them)."""
    req = await peer.read_request()
    assert req is not None
    _, status, i = req.target.split("/")
    head = b"HTTP/1.1 %s X\r\nRetry-After: %s\r\n" % (status.encode(), HOSTILE[int(i)])
    await peer.send_raw(head + b"Connection: close\r\nContent-Length: 2\r\n\r\nok")
    await peer.close()


async def _calls(tmp_path: Path) -> list[tuple[int, dict[str, Any]]]:
    async with HostileServer.running(_answer) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        seen = []
        async with open_broker(cfg) as broker:
            for status in (200, 503):
                for i in range(len(HOSTILE)):
                    with trio.fail_after(10):
                        env = await broker.call(
                            {"target": "api", "method": "GET", "path": f"/{status}/{i}"}
                        )
                    seen.append((status, env))
    return seen


def test_an_unreadable_retry_after_leaves_the_response_as_it_came(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, "tok-retry-after-hostile")
    seen = trio.run(_calls, tmp_path)
    assert len(seen) == 2 * len(HOSTILE)
    for status, env in seen:
        assert env["result"] is not None and env["result"]["status"] == status, env
        assert "retry_after" not in env["evidence"], env
        outcome = env["evidence"]["attempts"][-1]["outcome"]
        if status == 200:
            assert "error" not in env and outcome == "committed", env
        else:
            assert env["error"]["code"] == "REMOTE_THROTTLED" and outcome == "rejected", env
