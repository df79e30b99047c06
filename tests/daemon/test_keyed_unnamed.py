"""A keyed call the journal ended before it named an invocation never says "nothing was sent":
an earlier call under its idempotency_key may have run (its binding unread).  The daemon's 503
and ``CallNotRecorded`` (the engine's, which ``affidavit call`` prints) said so for every such
call; the embedded MCP backend already did not (tests/mcp/test_embedded_failures.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

import affidavit.engine.invocation as invocation
from affidavit.api.broker import Broker
from affidavit.api.client import Client
from affidavit.api.wire import ApiError
from affidavit.engine import CallNotRecorded
from affidavit.journal import JournalError, JournalReplaced, JournalUnavailable, ReadFailed
from tests.broker.helpers import TOKEN_ENV, http_target, open_broker, write_config
from tests.http.hostile import Reply, scripts

from .kit import WAIT, action, in_process

KEYED = "this request sent nothing; an earlier call under its idempotency_key may have run"
UNKEYED = "accepted: nothing was sent"


async def _away(*args: Any, **kwargs: Any) -> Any:
    """The engine's call, its journal away before anything was written (nothing named)."""
    raise JournalUnavailable("the journal's database is away")


def ending(exc: JournalError) -> Any:
    async def call(self: Broker, *args: Any, **kwargs: Any) -> Any:
        raise exc

    return call


@pytest.mark.parametrize("key", [None, "K1"], ids=["unkeyed", "keyed"])
@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (JournalReplaced("the journal's file was replaced"), "JOURNAL_REPLACED"),
        (ReadFailed("a statement timeout"), "JOURNAL_READ_DECLINED"),
        (None, "JOURNAL_UNAVAILABLE"),  # through the engine: ``CallNotRecorded(None)``
    ],
    ids=["replaced", "read_declined", "unavailable"],
)
async def test_the_daemon_says_nothing_was_sent_only_for_an_unkeyed_call(
    tmp_path: Path,
    token: str,
    monkeypatch: pytest.MonkeyPatch,
    exc: JournalError | None,
    code: str,
    key: str | None,
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)
    async with in_process(tmp_path, scripts.serve(Reply(200, body=b"done"))) as (srv, socket):
        with trio.fail_after(WAIT):
            async with Client.open(socket) as client:
                with monkeypatch.context() as patched:
                    if exc is None:
                        patched.setattr(invocation, "start", _away)
                    else:
                        patched.setattr(Broker, "call", ending(exc))
                    with pytest.raises(ApiError) as caught:
                        await client.call(action(idempotency_key=key))
    said = str(caught.value)
    assert (caught.value.status, caught.value.code) == (503, code), said
    assert (KEYED if key else UNKEYED) in said, said
    assert ("nothing was sent" in said) is (key is None), said
    assert not srv.requests


@pytest.mark.parametrize("key", [None, "K1"], ids=["unkeyed", "keyed"])
async def test_call_not_recorded_says_nothing_was_sent_only_for_an_unkeyed_call(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, key: str | None
) -> None:
    """What ``Engine.call`` raises, and ``affidavit call`` prints (``journal_refusal``: its
    words), when the journal went away before the call named an invocation."""
    monkeypatch.setenv(TOKEN_ENV, token)
    cfg = write_config(tmp_path, {"api": http_target("http://127.0.0.1:9")})
    async with open_broker(cfg) as broker:
        monkeypatch.setattr(invocation, "start", _away)
        with trio.fail_after(WAIT), pytest.raises(CallNotRecorded) as caught:
            await broker.call(action(idempotency_key=key))
    said = str(caught.value)
    assert caught.value.invocation_id is None
    assert (KEYED if key else UNKEYED) in said, said
    assert ("nothing was sent" in said) is (key is None), said
