"""A fetch whose read the database declined this once (``ReadFailed``: a statement timeout, a
lock not granted) is unread, not unverified: 503 JOURNAL_READ_DECLINED ("try again"), as every
other read answers it (``read_failure``) -- never 500 RESULT_UNVERIFIED, a claim that the stored
result failed verification that nothing in the journal backs.  The same fetch then answers the
stored envelope: nothing was wrong with it.

The daemon runs in this process (``Daemon.run``, as ``affidavit serve`` runs it) so that the
journal's read can be declined once; the caller is on its real socket."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from affidavit.api.client import Client
from affidavit.api.wire import ApiError
from tests.broker.helpers import TOKEN_ENV
from tests.http.hostile import Reply, scripts
from tests.journal.helpers import alter_record, decline_record_once

from .kit import WAIT, in_process


async def test_a_fetch_whose_read_is_declined_once_is_read_declined_not_unverified(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)
    async with in_process(tmp_path, scripts.serve(Reply(200, body=b"stored"))) as (srv, socket):
        with trio.fail_after(WAIT):
            async with Client.open(socket) as client:
                envelope = await client.call({"target": "api", "method": "GET", "path": "/r"})
                iid = envelope["invocation_id"]
                declined = decline_record_once(monkeypatch, iid)
                with pytest.raises(ApiError) as caught:
                    await client.fetch_result(iid)
                again = await client.fetch_result(iid)
    assert declined == [iid]
    assert (caught.value.status, caught.value.code) == (503, "JOURNAL_READ_DECLINED")
    assert "try again" in str(caught.value)
    assert again is not None and again["result"]["body"] == "stored"
    assert len(srv.requests) == 1


async def test_a_fetch_that_meets_an_altered_row_is_unreadable_as_a_call_is(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row altered in place (``AlteredRow``) is no stored result that failed verification:
    the fetch answers as a call meeting it does -- 500 JOURNAL_UNREADABLE with the journal's own
    words (``read_failure``), never RESULT_UNVERIFIED, never the token."""
    monkeypatch.setenv(TOKEN_ENV, token)
    words = "the event row at seq 2 was altered: its payload"
    async with in_process(tmp_path, scripts.serve(Reply(200, body=b"stored"))) as (srv, socket):
        with trio.fail_after(WAIT):
            async with Client.open(socket) as client:
                envelope = await client.call({"target": "api", "method": "GET", "path": "/r"})
                iid = envelope["invocation_id"]
                alter_record(monkeypatch, iid, words)
                with pytest.raises(ApiError) as caught:
                    await client.fetch_result(iid)
    assert (caught.value.status, caught.value.code) == (500, "JOURNAL_UNREADABLE")
    assert words in str(caught.value)
    assert token not in str(caught.value)
    assert len(srv.requests) == 1
