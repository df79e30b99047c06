"""A read (a view, ``fetch_result``, approvals) is bounded before its first byte: a stopped
daemon is told within ``wire.read_wait()`` -- the longest ``[journal] reconnect``
(``bounds.MAX_RECONNECT``) plus the delivery budget twice over -- not waited for (the constants
patched small here)."""

from __future__ import annotations

import functools
import signal
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api import wire
from affidavit.api.client import Client
from affidavit.api.wire import AnswerLost
from tests.broker.approvalkit import reconcile_target
from tests.daemon.kit import running_daemon


async def test_a_stopped_daemon_answers_no_fetch_result_and_it_is_told(
    tmp_path: Path, token: str, monkeypatch: Any
) -> None:
    monkeypatch.setattr(wire, "DELIVERY_WAIT", 0.5)
    monkeypatch.setattr(wire, "MAX_RECONNECT", 1.0)
    target = reconcile_target("http://127.0.0.1:9", timeout={"connect": 2, "total": 5})
    async with running_daemon(tmp_path, target, token=token) as daemon:
        async with Client.open(daemon.socket) as c:
            assert await c.fetch_result("act_" + "0" * 26) is None
        daemon.signal(signal.SIGSTOP)
        try:
            async with Client.open(daemon.socket) as c:
                with trio.fail_after(20):  # far past read_wait() = 2 s: the bound, not this
                    with pytest.raises(AnswerLost, match="within 2 s"):
                        await c.fetch_result("act_" + "0" * 26)
                    with pytest.raises(AnswerLost):
                        await c.approvals()
            # The command line's (``blocking_request``: ``affidavit actions``, ``result``, ...)
            with trio.fail_after(20), pytest.raises(AnswerLost):
                ask = functools.partial(wire.blocking_request, str(daemon.socket))
                await trio.to_thread.run_sync(ask, "GET", "/v1/actions", abandon_on_cancel=True)
        finally:
            daemon.signal(signal.SIGCONT)
