"""The console, as the daemon and MCP (tests/daemon/test_fetch_read_declined.py): a stored result
whose read the database declined this once (``ReadFailed``: a statement timeout, a lock not
granted) is 503 JOURNAL_READ_DECLINED, "try again" -- never a 500 page saying the stored result
does not verify, which nothing in the journal backs -- with ``Retry-After: 1``, as the daemon's
reads (``READ_RETRY``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.broker.helpers import http_target, open_broker
from tests.http.hostile import HostileServer, Reply, scripts
from tests.journal.helpers import alter_record, decline_record_once, flip_stored_byte

from .kit import WAIT, get, log_in_to, operator_config, served


async def test_a_result_whose_read_is_declined_once_is_read_declined_not_unverified(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"stored"))) as srv:
        path = operator_config(tmp_path, monkeypatch, {"api": http_target(srv.url)})
        with trio.fail_after(WAIT):
            async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
                env = await b.call({"target": "api", "method": "GET", "path": "/r"})
                iid = env["invocation_id"]
                cookie, _csrf = await log_in_to(console, origin)
                declined = decline_record_once(monkeypatch, iid)
                url = f"{origin}/invocations/{iid}/result.json"
                status, headers, page = await get(url, cookie=cookie)
                again, _, body = await get(url, cookie=cookie)
    assert declined == [iid]
    assert status == 503, page
    assert headers.get("retry-after") == "1", headers  # as the daemon's reads (READ_RETRY)
    assert b"JOURNAL_READ_DECLINED" in page and b"try again" in page, page
    assert b"does not verify" not in page
    assert again == 200 and b'"stored"' in body
    assert len(srv.requests) == 1


async def test_a_result_that_meets_an_altered_row_is_unreadable_as_a_call_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row altered in place: 500 JOURNAL_UNREADABLE with the journal's own words
    (``read_failure``), as the daemon and MCP answer it -- never "does not verify"."""
    words = b"the event row at seq 2 was altered: its payload"
    async with HostileServer.running(scripts.serve(Reply(200, body=b"stored"))) as srv:
        path = operator_config(tmp_path, monkeypatch, {"api": http_target(srv.url)})
        with trio.fail_after(WAIT):
            async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
                env = await b.call({"target": "api", "method": "GET", "path": "/r"})
                iid = env["invocation_id"]
                cookie, _csrf = await log_in_to(console, origin)
                alter_record(monkeypatch, iid, words.decode())
                url = f"{origin}/invocations/{iid}/result.json"
                status, headers, page = await get(url, cookie=cookie)
    assert status == 500, page
    assert "retry-after" not in headers, headers  # the same read meets it again
    assert b"JOURNAL_UNREADABLE" in page and words in page, page
    assert b"does not verify" not in page
    assert len(srv.requests) == 1


async def test_a_result_that_fails_verification_is_result_unverified_as_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A corrupted stored chunk: the invocation page and the download are 500 with the code the
    daemon, MCP and ``affidavit result`` give (RESULT_UNVERIFIED, ``result_failure``), naming
    the chunk -- never its bytes, and never a page without the code."""
    body = b"secret-free stored body " * 40
    async with HostileServer.running(scripts.serve(Reply(200, body=body))) as srv:
        path = operator_config(tmp_path, monkeypatch, {"api": http_target(srv.url)})
        with trio.fail_after(WAIT):
            async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
                env = await b.call({"target": "api", "method": "GET", "path": "/r"})
                iid = env["invocation_id"]
                cookie, _csrf = await log_in_to(console, origin)
                flip_stored_byte(tmp_path / "journal.db", iid, "body", 0, at=0)
                pages = [
                    await get(f"{origin}/invocations/{iid}{tail}", cookie=cookie)
                    for tail in ("/result.json", "")
                ]
    for status, _, page in pages:
        assert status == 500, page
        assert b"RESULT_UNVERIFIED" in page and b"chunk 0" in page, page
        assert b"stored body" not in page
    assert len(srv.requests) == 1
