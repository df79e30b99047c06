"""A DISPATCH_STARTED whose commit was lost (``CommitUnknown``) while the lost session still
holds the chain head, its COMMIT on its way: every later write of the call waits for the head
at most ``[journal] reconnect`` (``commit._transaction``) and fails, not committed
(``JournalWriteError``), before the lost session ends.  The call's closing event did not land,
so nothing the writer read under the head says whether DISPATCH_STARTED is durable; a read
without the head finds none -- and it may land a moment later.  The answer must not be
``not_attempted`` (seed: "The broker never moves it back to not_attempted"): the call is not
recorded, and ``affidavit result`` tells once the journal is back (``CallNotRecorded``).
Nothing is sent (the barrier was not confirmed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.engine import CallNotRecorded
from affidavit.journal import CommitUnknown, JournalWriteError
from affidavit.statemachine import Event, EventKind
from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import event_kinds, http_target, open_broker, write_config

E = EventKind
LIMIT = 10
POST = {"target": "api", "method": "POST", "path": "/charge", "body": "{}"}


async def test_a_lost_dispatch_barrier_with_the_head_still_held_is_never_not_attempted(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as broker:
            journal = broker.journal
            real_append = journal.append
            held: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
            refused: list[EventKind] = []

            async def append(event: Any, *args: Any, **kwargs: Any) -> Any:
                if held:
                    # The lost session holds the head: the wait for it runs out.
                    refused.append(event.kind)
                    raise JournalWriteError("canceling statement due to lock timeout")
                if event.kind is E.DISPATCH_STARTED:
                    # The call's earlier events are durable (as an approved or retried call's
                    # are before its dispatch): commit what rides with this barrier first.
                    diag = Event(E.PROTOCOL_OBSERVED, event.invocation_id, {"state": "gate"})
                    await real_append(diag, barrier=True)
                    held.append((event, args, kwargs))
                    raise CommitUnknown("the commit's answer was lost; the head still held")
                return await real_append(event, *args, **kwargs)

            monkeypatch.setattr(journal, "append", append)
            env: dict[str, Any] | None = None
            error: BaseException | None = None
            with trio.fail_after(LIMIT):
                try:
                    env = await broker.call(POST)
                except CallNotRecorded as exc:
                    error = exc
            monkeypatch.undo()
            # The lost COMMIT arrives: DISPATCH_STARTED is durable after all.
            ghost, gargs, gkwargs = held.pop()
            await real_append(ghost, *gargs, **gkwargs)
            iid = ghost.invocation_id
            assert refused, "no write of the call waited for the held head"
            assert E.DISPATCH_STARTED in event_kinds(broker, iid)
            if env is not None:
                # Whatever it says, never what the record now contradicts.
                assert env["error"]["outcome"] != "not_attempted", env
            else:
                assert isinstance(error, CallNotRecorded) and error.invocation_id == iid
                # Its cause is the journal's own words (the daemon logs them), not itself again.
                assert isinstance(error.__cause__, JournalWriteError), repr(error.__cause__)
                assert not isinstance(error.__cause__, CallNotRecorded)
            rec = broker.journal.record(iid)
            assert rec is not None and rec.outcome.value == "unknown"
        assert srv.requests == []
