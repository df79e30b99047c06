"""A call's answer, rendered right after the barrier that made its record final, is that
commit's snapshot (``Journal.record(as_committed=True)``, issue 15: no read of the journal's
head on the call's critical path) -- from both places that render it: the result's commit
(``engine.delivery``) and a closing event (``Recorder.finish``).  Every other read asks for
the journal's state as usual."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.journal import Journal

from .helpers import http_target, open_broker, write_config
from .test_dispatch_overlap import POST, RawServer, broker_on

LIMIT = 20


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    seen: list[tuple[str, bool]] = []
    real = Journal.record

    def record(self: Journal, iid: str, now: float | None = None, **kw: Any) -> Any:
        got = real(self, iid, now, **kw)
        seen.append((iid, bool(kw.get("as_committed")) and got is not None and got.final))
        return got

    monkeypatch.setattr(Journal, "record", record)
    return seen


async def test_a_stored_result_is_answered_from_its_commits_snapshot(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with trio.fail_after(LIMIT):
        async with broker_on(RawServer(), tmp_path) as broker:
            seen = _spy(monkeypatch)
            env = await broker.call(POST)
    assert env.get("error") is None, env
    assert (env["invocation_id"], True) in seen, seen


async def test_a_closing_event_is_answered_from_its_commits_snapshot(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing listens at the target: the call closes (``Recorder.finish``) unsent."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: the connect is refused
        cfg = write_config(tmp_path, {"api": http_target(f"http://127.0.0.1:{port}")})
        with trio.fail_after(LIMIT):
            async with open_broker(cfg) as broker:
                seen = _spy(monkeypatch)
                env = await broker.call(POST)
    assert env.get("error") is not None, env
    assert (env["invocation_id"], True) in seen, (env, seen)
