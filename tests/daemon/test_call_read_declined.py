"""A call whose journal read the database declines (``ReadFailed``: a statement timeout -- the
reader's bound, ``[journal] reconnect`` -- a lock not granted) ends without an envelope: there is
no record read to render one from.  Through the daemon it answers 503 JOURNAL_READ_DECLINED with
the journal's words and where the record tells whether anything was sent -- never
JOURNAL_UNAVAILABLE (the journal is not away: reading again may succeed), never a 500, never the
token.  The daemon runs in this process so that the reads can be declined; the caller is on
its real socket."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.client import Client
from affidavit.api.wire import ApiError
from affidavit.journal import ReadFailed
from affidavit.journal.store import Journal
from tests.broker.helpers import TOKEN_ENV
from tests.http.hostile import Reply, scripts

from .kit import WAIT, in_process


async def test_a_call_whose_record_read_is_declined_is_read_declined(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)
    declined: list[str] = []

    def record(self: Journal, invocation_id: str, now: Any = None, **kw: Any) -> Any:
        declined.append(invocation_id)
        raise ReadFailed(
            "journal x: the record cannot be read: canceling statement due to statement timeout"
        )

    async with in_process(tmp_path, scripts.serve(Reply(200, body=b"ok"))) as (srv, socket):
        with trio.fail_after(WAIT):
            async with Client.open(socket) as client:
                monkeypatch.setattr(Journal, "record", record)
                with pytest.raises(ApiError) as caught:
                    await client.call({"target": "api", "method": "GET", "path": "/r"})
                monkeypatch.undo()
                monkeypatch.setenv(TOKEN_ENV, token)
                iid = declined[0]
                # The record, read again, tells what happened.
                again = await client.fetch_result(iid)
    assert (caught.value.status, caught.value.code) == (503, "JOURNAL_READ_DECLINED"), caught.value
    message = str(caught.value)
    assert "statement timeout" in message and f"affidavit result {iid}" in message, message
    assert token not in message
    assert again is not None and again["result"]["status"] == 200, again
    assert len(srv.requests) == 1
