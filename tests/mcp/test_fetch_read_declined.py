"""Embedded, as through the daemon (tests/daemon/test_fetch_read_declined.py): a fetch whose read
the database declined this once (``ReadFailed``) answers JOURNAL_READ_DECLINED ("try again"),
never RESULT_UNVERIFIED -- a claim that the stored result failed verification that nothing in
the journal backs."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from affidavit.mcp.backends import Embedded, Exchange
from tests.broker.helpers import TOKEN_ENV
from tests.journal.helpers import alter_record, decline_record_once

from .conftest import Remotes
from .kit import WAIT


async def test_an_embedded_fetch_whose_read_is_declined_once_is_read_declined(
    tmp_path: Path, remotes: Remotes, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)
    with trio.fail_after(WAIT):
        async with Embedded.open(str(remotes.config(tmp_path))) as backend:
            called = await backend.call({"target": "ok", "method": "GET", "path": "/"}, Exchange())
            iid = called["invocation_id"]
            declined = decline_record_once(monkeypatch, iid)
            answer = await backend.fetch_result(iid, 0, None, Exchange())
            again = await backend.fetch_result(iid, 0, None, Exchange())
    assert declined == [iid]
    assert answer["api_error"]["code"] == "JOURNAL_READ_DECLINED", answer
    assert "try again" in answer["api_error"]["message"]
    assert again["invocation_id"] == iid and "resume" in again["result"], again


async def test_an_embedded_fetch_that_meets_an_altered_row_is_unreadable_as_a_call_is(
    tmp_path: Path, remotes: Remotes, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As through the daemon: a row altered in place answers JOURNAL_UNREADABLE with the
    journal's own words (``read_failure``), never RESULT_UNVERIFIED, never the token."""
    monkeypatch.setenv(TOKEN_ENV, token)
    words = "the event row at seq 2 was altered: its payload"
    with trio.fail_after(WAIT):
        async with Embedded.open(str(remotes.config(tmp_path))) as backend:
            called = await backend.call({"target": "ok", "method": "GET", "path": "/"}, Exchange())
            iid = called["invocation_id"]
            alter_record(monkeypatch, iid, words)
            answer = await backend.fetch_result(iid, 0, None, Exchange())
    assert answer["api_error"]["code"] == "JOURNAL_UNREADABLE", answer
    assert words in answer["api_error"]["message"]
    assert token not in str(answer)
