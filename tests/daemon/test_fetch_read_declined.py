"""A fetch whose read the database declined this once (``ReadFailed``: a statement timeout, a
lock not granted) is unread, not unverified: 503 JOURNAL_READ_DECLINED ("try again"), as every
other read answers it (``read_failure``) -- never 500 RESULT_UNVERIFIED, a claim that the stored
result failed verification that nothing in the journal backs.  The same fetch then answers the
stored envelope: nothing was wrong with it.

The daemon runs in this process (``Daemon.run``, as ``affidavit serve`` runs it) so that the
journal's read can be declined once; the caller is on its real socket."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.client import Client
from affidavit.api.wire import ApiError
from affidavit.config import load_config
from affidavit.daemon.server import Daemon
from affidavit.journal import AlteredRow, ReadFailed
from affidavit.journal.store import Journal
from tests.broker.helpers import TOKEN_ENV
from tests.http.hostile import HostileServer, Reply, scripts

from .kit import WAIT, api_target, write_daemon_config


async def test_a_fetch_whose_read_is_declined_once_is_read_declined_not_unverified(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)
    socket = tmp_path / "affidavit.sock"
    async with (
        HostileServer.running(scripts.serve(Reply(200, body=b"stored"))) as srv,
        trio.open_nursery() as nursery,
    ):
        config = write_daemon_config(tmp_path, api_target(srv.url), socket=socket)
        daemon = Daemon(load_config(config))
        await nursery.start(daemon.run)
        with trio.fail_after(WAIT):
            async with Client.open(socket) as client:
                envelope = await client.call({"target": "api", "method": "GET", "path": "/r"})
                iid = envelope["invocation_id"]
                real = Journal.record
                declined: list[str] = []

                def record(self: Journal, invocation_id: str, now: Any = None) -> Any:
                    if invocation_id == iid and not declined:
                        declined.append(invocation_id)
                        raise ReadFailed("canceling statement due to statement timeout")
                    return real(self, invocation_id, now)

                monkeypatch.setattr(Journal, "record", record)
                with pytest.raises(ApiError) as caught:
                    await client.fetch_result(iid)
                again = await client.fetch_result(iid)
        daemon.shutdown.set()
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
    socket = tmp_path / "affidavit.sock"
    words = "the event row at seq 2 was altered: its payload"
    async with (
        HostileServer.running(scripts.serve(Reply(200, body=b"stored"))) as srv,
        trio.open_nursery() as nursery,
    ):
        config = write_daemon_config(tmp_path, api_target(srv.url), socket=socket)
        daemon = Daemon(load_config(config))
        await nursery.start(daemon.run)
        with trio.fail_after(WAIT):
            async with Client.open(socket) as client:
                envelope = await client.call({"target": "api", "method": "GET", "path": "/r"})
                iid = envelope["invocation_id"]
                real = Journal.record

                def record(self: Journal, invocation_id: str, now: Any = None) -> Any:
                    if invocation_id == iid:
                        return self._read(_altered(words), f"the record of invocation {iid}")
                    return real(self, invocation_id, now)

                monkeypatch.setattr(Journal, "record", record)
                with pytest.raises(ApiError) as caught:
                    await client.fetch_result(iid)
        daemon.shutdown.set()
    assert (caught.value.status, caught.value.code) == (500, "JOURNAL_UNREADABLE")
    assert words in str(caught.value)
    assert token not in str(caught.value)
    assert len(srv.requests) == 1


def _altered(words: str) -> Any:
    """A read of the tables meeting a row altered in place (``AlteredRow``), as
    ``tests/journal/test_altered_rows.py`` alters one: run through the journal's own ``_read``,
    which words it as every read does."""

    def read(_tables: Any) -> Any:
        raise AlteredRow(words)

    return read
