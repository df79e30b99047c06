"""A DISPATCH_STARTED whose COMMIT raised on SQLite -- its WAL sync failed (EIO) -- is a write
whose fate is unknown (``CommitUnknown``): no connection reads it, yet a crash before the
journal's next commit brings it back (tests/journal/test_commit_sync_failure.py, with a real
failing sync).  The call sends nothing either way.  Its answer may be ``not_attempted`` only
once its closing event has committed (written over what the failed COMMIT left in the -wal);
if that commit fails too, a read that misses DISPATCH_STARTED proves nothing: the call is not
recorded (``CallNotRecorded``, the daemon's 503 JOURNAL_UNAVAILABLE), never ``not_attempted``.

The failure is injected where this process meets it: the backend's COMMIT raises SQLite's
``disk I/O error`` instead of committing (what a failed sync leaves visible here).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.engine import CallNotRecorded
from affidavit.journal import CommitUnknown
from affidavit.statemachine import Event, EventKind
from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import event_kinds, http_target, open_broker, write_config

E = EventKind
LIMIT = 10
POST = {"target": "api", "method": "POST", "path": "/charge", "body": "{}"}
SQLITE_IOERR_FSYNC = 10 | (4 << 8)


@pytest.mark.parametrize("failing", [1, 1000], ids=["close-commits", "disk-stays-bad"])
async def test_a_dispatch_barrier_whose_commit_failed_is_not_attempted_only_once_closed(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, failing: int
) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as broker:
            journal = broker.journal
            backend, real_append = journal.backend, journal.append
            assert backend.kind == "sqlite"
            real_commit, left = backend.commit, [0]

            def commit(conn: Any) -> None:
                if left[0] > 0:
                    left[0] -= 1
                    exc = sqlite3.OperationalError("disk I/O error")
                    exc.sqlite_errorcode = SQLITE_IOERR_FSYNC  # type: ignore[attr-defined]
                    raise exc
                real_commit(conn)

            async def append(event: Any, *args: Any, **kwargs: Any) -> Any:
                if event.kind is E.DISPATCH_STARTED:
                    # The call's earlier events are durable (as an approved or retried call's
                    # are before its dispatch): commit what rides with this barrier first.
                    diag = Event(E.PROTOCOL_OBSERVED, event.invocation_id, {"state": "gate"})
                    await real_append(diag, barrier=True)
                    left[0] = failing  # its COMMIT fails (and, 1000, every one after it)
                return await real_append(event, *args, **kwargs)

            monkeypatch.setattr(backend, "commit", commit)
            monkeypatch.setattr(journal, "append", append)
            env: dict[str, Any] | None = None
            error: CallNotRecorded | None = None
            with trio.fail_after(LIMIT):
                try:
                    env = await broker.call(POST)
                except CallNotRecorded as exc:
                    error = exc
            monkeypatch.undo()
            if failing == 1:
                # The close committed over the failed COMMIT's frames: nothing can bring
                # DISPATCH_STARTED back, so not_attempted is what the record proves.
                assert env is not None and env["error"]["outcome"] == "not_attempted", env
                iid = env["invocation_id"]
                assert event_kinds(broker, iid)[-1] is E.SETUP_FAILED
            else:
                assert error is not None, env  # never not_attempted
                assert isinstance(error.__cause__, CommitUnknown), repr(error.__cause__)
                iid = error.invocation_id
                rec = broker.journal.record(iid)
                assert rec is not None and not rec.final
            assert E.DISPATCH_STARTED not in event_kinds(broker, iid)
        assert srv.requests == []
