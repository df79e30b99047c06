"""A DISPATCH_STARTED whose commit landed but whose answer was lost (``CommitUnknown``) is a
dispatch as far as the record goes: the broker sends nothing (it could not confirm the barrier),
yet the answer must never be ``not_attempted`` -- the journal holds DISPATCH_STARTED, and seed:
"The broker never moves it back to not_attempted."  The gate reads the record again to learn
which it was (``attempt.py``, the gate's ``except BaseException``); no other test made that read
matter.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.journal import CommitUnknown
from affidavit.statemachine import EventKind
from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import event_kinds, http_target, open_broker, write_config

E = EventKind
LIMIT = 10
POST = {"target": "api", "method": "POST", "path": "/charge", "body": "{}"}


async def test_a_landed_dispatch_barrier_whose_answer_was_lost_stays_unknown(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as broker:
            journal = broker.journal
            real_append = journal.append

            async def append(event: Any, *args: Any, **kwargs: Any) -> Any:
                out = await real_append(event, *args, **kwargs)
                if event.kind is E.DISPATCH_STARTED:
                    raise CommitUnknown("the commit's answer was lost")
                return out

            monkeypatch.setattr(journal, "append", append)
            with trio.fail_after(LIMIT):
                env = await broker.call(POST)
            monkeypatch.undo()
            iid = env["invocation_id"]
            assert E.DISPATCH_STARTED in event_kinds(broker, iid)
            assert env["error"]["outcome"] == "unknown", env
            assert env["error"]["phase"] == "remote_execution", env
            assert env["error"]["retry"] != "backoff"
            rec = broker.journal.record(iid)
            assert rec is not None and rec.outcome.value == "unknown"
        # The barrier was not confirmed, so nothing was handed to the transport.
        assert srv.requests == []
