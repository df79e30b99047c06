"""A fetch that meets a row altered in place reads it as ``AlteredRow`` -- the journal's own
words, naming the row and never its value -- which every surface answers JOURNAL_UNREADABLE
(``read_failure``; tests/daemon/test_fetch_read_declined.py), never as a stored result that
failed verification.  The journal's reads used to turn it into a plain ``JournalError``."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from affidavit.engine import read_failure
from affidavit.journal import AlteredRow, JournalError
from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import TOKEN_ENV, http_target, open_broker, write_config


def _alter_first_event(db: Path, iid: str) -> None:
    """As someone with write access and no key would: the append-only triggers dropped, the
    invocation's first event (not the journal's last row) given a kind no broker writes."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        triggers = conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")
        for (name,) in triggers.fetchall():
            conn.execute(f"DROP TRIGGER {name}")
        conn.execute(
            "UPDATE events SET kind = 'NOT_A_KIND' WHERE seq = "
            "(SELECT min(seq) FROM events WHERE invocation_id = ?)",
            (iid,),
        )
    finally:
        conn.close()


async def test_a_fetch_that_meets_an_altered_row_raises_altered_row(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)
    async with HostileServer.running(scripts.serve(Reply(200, body=b"stored"))) as srv:
        path = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(path) as b:
            env = await b.call({"target": "api", "method": "GET", "path": "/r"})
        iid = env["invocation_id"]
        _alter_first_event(tmp_path / "journal.db", iid)
        async with open_broker(path) as b:
            with pytest.raises(JournalError) as caught:
                await b.fetch_result(iid)
    assert isinstance(caught.value, AlteredRow), repr(caught.value)
    assert "the event row at seq" in str(caught.value) and "NOT_A_KIND" not in str(caught.value)
    status, code, message = read_failure(caught.value, f"the result of {iid}")
    assert (status, code) == (500, "JOURNAL_UNREADABLE")
    assert token not in message
    assert len(srv.requests) == 1
