"""A path that leaves the target's base path in some server's reading is refused by the daemon
before dispatch: ``INVALID_FIELD`` at ``path``, phase ``validation``, ``not_attempted`` -- and
the remote sees no connection at all.  The audit's cases (audit48, finding 6: each reached the
remote verbatim), through the socket as a caller sends them; one name with dots and escapes is
sent, so the remote would have seen what got through.  The rule and its readings:
``affidavit/protocols/http/segments.py``, tests/broker/test_path_escapes.py."""

from __future__ import annotations

import json
from pathlib import Path

import trio

from affidavit.api.wire import blocking_request
from tests.http.hostile import HostileServer, Reply, scripts

from .kit import action_bytes, api_target, running_daemon

AUDIT48 = [
    "/a/..%20/x",
    "/a/..%09/x",
    "/a/..%00/x",
    "/a/%252e%252e/x",
    "/a/%c0%ae%c0%ae/x",
    "/a/%ef%bc%8e%ef%bc%8e/x",
]
KEPT = "/a/...%252541%20b/x"  # "...", then a literal "%2541 b": no way out


async def test_a_way_out_of_the_base_path_is_refused_and_nothing_is_sent(
    tmp_path: Path, token: str
) -> None:
    async with (
        HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv,
        running_daemon(tmp_path, api_target(srv.url + "/base"), token=token) as daemon,
    ):
        for path in AUDIT48:
            answer = await trio.to_thread.run_sync(
                blocking_request, str(daemon.socket), "POST", "/v1/calls", action_bytes(path)
            )
            error = answer.json().get("error") or {}
            assert (error.get("code"), error.get("field")) == ("INVALID_FIELD", "path"), answer
            assert (error["phase"], error["outcome"]) == ("validation", "not_attempted"), error
        assert (srv.connections, srv.requests) == (0, [])

        answer = await trio.to_thread.run_sync(
            blocking_request, str(daemon.socket), "POST", "/v1/calls", action_bytes(KEPT)
        )
        assert answer.json().get("error") is None, answer
    assert [r.target for r in srv.requests] == ["/base" + KEPT], json.dumps(
        [r.target for r in srv.requests]
    )
