"""The writer lock removed beside a running ``affidavit serve``: the daemon writes nothing more.

Its flock is the file it locked; once ``<journal>.lock`` is deleted (an operator clearing "stale"
lock files, a tmp reaper) the next writer makes a new file there and takes it -- a second owner
beside the live one, whose start-up recovery closed the daemon's call in flight.  The daemon now
checks at each writer transaction that its lock is still the file at the path (as it checks the
journal file): every call is refused 503 ``JOURNAL_REPLACED`` before anything is sent, and
``GET /v1/health`` says so -- the daemon must be restarted (it then takes the lock at the path, or
is told who holds it).  A real daemon process; the remote is loopback."""

from __future__ import annotations

import json
import os
from pathlib import Path

import trio

from tests.http.hostile import Reply, scripts

from .kit import WAIT, action_bytes, ask, serving


async def test_a_daemon_whose_lock_was_removed_sends_and_writes_nothing_more(
    tmp_path: Path, token: str
) -> None:
    async with serving(tmp_path, scripts.serve(Reply(200, body=b"ok")), token=token) as (
        srv,
        daemon,
    ):
        with trio.fail_after(WAIT):
            first = await ask(daemon.socket, "POST", "/v1/calls", action_bytes())
            assert first[0] == 200, first
            os.unlink(f"{daemon.journal}.lock")
            call = await ask(daemon.socket, "POST", "/v1/calls", action_bytes())
            health = await ask(daemon.socket, "GET", "/v1/health")
    for status, headers, body in (call, health):
        assert status == 503, (status, body)
        assert "retry-after" not in headers
        error = json.loads(body)["api_error"]
        assert error["code"] == "JOURNAL_REPLACED", error
        assert "writer lock" in error["message"], error
        assert str(tmp_path) not in error["message"]  # (a caller is never told where it lives)
    assert len(srv.requests) == 1  # the refused call sent nothing
