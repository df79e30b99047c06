"""``Retry-After`` on the daemon's journal answers, by code (``engine.READ_RETRY``): a read -- a
record, a stored result -- the journal could not answer this once says when to read again:
``JOURNAL_READ_DECLINED`` after 1 s, ``JOURNAL_UNAVAILABLE`` (a shared journal's database away
beyond ``[journal] reconnect``) after 5 s; a read changes nothing, so reading again is safe.  A
call's answer never carries one, whatever its code: the call may have been sent, and a timer
inviting the same request again would resend it (the record tells; the caller decides).
``JOURNAL_REPLACED`` never does either (``test_journal_replaced``): only a restart mends it.

The daemon runs in this process so that its reads can fail on cue; the caller is on its real
socket."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.engine import READ_RETRY_AFTER, UNAVAILABLE_RETRY_AFTER
from affidavit.journal import JournalReader, JournalUnavailable, ReadFailed
from affidavit.journal.store import Journal
from tests.broker.helpers import TOKEN_ENV
from tests.http.hostile import Reply, scripts

from .kit import WAIT, ask, in_process
from .test_journal_replaced import ACTION

FAILURES = {
    "JOURNAL_UNAVAILABLE": lambda: JournalUnavailable(
        "journal x: the connection was lost and no new one could be made within 10s"
    ),
    "JOURNAL_READ_DECLINED": lambda: ReadFailed(
        "journal x: canceling statement due to statement timeout"
    ),
}


@pytest.mark.parametrize("code", sorted(FAILURES))
async def test_reads_say_when_to_read_again_and_calls_never_do(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, code: str
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)

    def failing(self: Any, invocation_id: str, now: Any = None, **kw: Any) -> Any:
        raise FAILURES[code]()

    async with in_process(tmp_path, scripts.serve(Reply(200, body=b"ok"))) as (_, socket):
        with trio.fail_after(WAIT):
            status, _, body = await ask(socket, "POST", "/v1/calls", ACTION)
            assert status == 200, body
            iid = json.loads(body)["invocation_id"]
            with monkeypatch.context() as m:  # the views' readers and the broker's own
                m.setattr(JournalReader, "record", failing)
                m.setattr(Journal, "record", failing)
                record = await ask(socket, "GET", f"/v1/invocations/{iid}")
                result = await ask(socket, "GET", f"/v1/invocations/{iid}/result")
                call = await ask(socket, "POST", "/v1/calls", ACTION)
    after = {"JOURNAL_UNAVAILABLE": UNAVAILABLE_RETRY_AFTER, "JOURNAL_READ_DECLINED": 1}[code]
    assert READ_RETRY_AFTER == 1
    for what, (status, headers, body) in (("record", record), ("result", result)):
        assert status == 503, (what, status, body)
        assert json.loads(body)["api_error"]["code"] == code, (what, body)
        assert headers.get("retry-after") == str(after), (what, headers)
    status, headers, body = call
    assert status == 503, call
    assert json.loads(body)["api_error"]["code"] == code, body
    assert "retry-after" not in headers, headers
