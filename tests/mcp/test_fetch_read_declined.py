"""Embedded, as through the daemon (tests/daemon/test_fetch_read_declined.py): a fetch whose read
the database declined this once (``ReadFailed``) answers JOURNAL_READ_DECLINED ("try again"),
never RESULT_UNVERIFIED -- a claim that the stored result failed verification that nothing in
the journal backs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.journal import AlteredRow, ReadFailed
from affidavit.journal.store import Journal
from affidavit.mcp.backends import Embedded, Exchange
from tests.broker.helpers import TOKEN_ENV

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
            real = Journal.record
            declined: list[str] = []

            def record(self: Journal, invocation_id: str, now: Any = None) -> Any:
                if invocation_id == iid and not declined:
                    declined.append(invocation_id)
                    raise ReadFailed("canceling statement due to statement timeout")
                return real(self, invocation_id, now)

            monkeypatch.setattr(Journal, "record", record)
            answer = await backend.fetch_result(iid, 0, Exchange())
            again = await backend.fetch_result(iid, 0, Exchange())
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
            real = Journal.record

            def record(self: Journal, invocation_id: str, now: Any = None) -> Any:
                if invocation_id == iid:
                    return self._read(_altered(words), f"the record of invocation {iid}")
                return real(self, invocation_id, now)

            monkeypatch.setattr(Journal, "record", record)
            answer = await backend.fetch_result(iid, 0, Exchange())
    assert answer["api_error"]["code"] == "JOURNAL_UNREADABLE", answer
    assert words in answer["api_error"]["message"]
    assert token not in str(answer)


def _altered(words: str) -> Any:
    """A read of the tables meeting a row altered in place (``AlteredRow``), as
    ``tests/journal/test_altered_rows.py`` alters one: run through the journal's own ``_read``,
    which words it as every read does."""

    def read(_tables: Any) -> Any:
        raise AlteredRow(words)

    return read
