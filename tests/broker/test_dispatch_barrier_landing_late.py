"""A DISPATCH_STARTED whose commit was lost (``CommitUnknown``) and which lands only *after*
the gate read the record again: on a shared journal the lost session can still hold the chain
head with its COMMIT on its way when the writer's bounded wait for it runs out (``commit.
_reconnect_and_check``).  The gate's re-read then finds no DISPATCH_STARTED -- yet it may land
a moment later, before the call's closing event (which waits for the head).  The answer must
never be ``not_attempted`` over a record that holds DISPATCH_STARTED (seed: "The broker never
moves it back to not_attempted"), and nothing is sent (the barrier was not confirmed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.journal import CommitUnknown, JournalUnavailable
from affidavit.statemachine import EventKind
from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import event_kinds, http_target, open_broker, write_config

E = EventKind
LIMIT = 10
POST = {"target": "api", "method": "POST", "path": "/charge", "body": "{}"}


async def test_a_dispatch_barrier_landing_after_the_gates_reread_is_never_not_attempted(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as broker:
            journal = broker.journal
            real_append = journal.append
            held: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []

            async def append(event: Any, *args: Any, **kwargs: Any) -> Any:
                if held:
                    # The lost COMMIT lands as the head is next taken (before this write).
                    ghost, gargs, gkwargs = held.pop()
                    await real_append(ghost, *gargs, **gkwargs)
                elif event.kind is E.DISPATCH_STARTED:
                    held.append((event, args, kwargs))
                    raise CommitUnknown("the commit's answer was lost; the head still held")
                return await real_append(event, *args, **kwargs)

            monkeypatch.setattr(journal, "append", append)
            with trio.fail_after(LIMIT):
                env = await broker.call(POST)
            monkeypatch.undo()
            iid = env["invocation_id"]
            kinds = event_kinds(broker, iid)
            assert E.DISPATCH_STARTED in kinds, kinds
            assert env["error"]["outcome"] == "unknown", (env, kinds)
            assert env["error"]["phase"] == "remote_execution", env
            assert env["error"]["retry"] != "backoff", env
            rec = broker.journal.record(iid)
            assert rec is not None and rec.outcome.value == "unknown", kinds
        assert srv.requests == []


async def test_a_lost_dispatch_barrier_that_never_lands_is_closed_by_what_the_record_proves(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other way: the lost COMMIT never lands, and the gate could not read the record
    (the journal away a moment) -- it stays entered, never not_attempted on a guess, so the
    attempt's ending is ATTEMPT_INTERRUPTED.  The record has no DISPATCH_STARTED to interrupt
    once that write holds the head: the ending is the record's (not_attempted, nothing was
    sent) -- not a traceback."""
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as broker:
            journal = broker.journal
            real_append, real_record = journal.append, journal.record
            lost: list[Any] = []

            async def append(event: Any, *args: Any, **kwargs: Any) -> Any:
                if event.kind is E.DISPATCH_STARTED:
                    lost.append(event)
                    raise CommitUnknown("the commit's answer was lost")
                return await real_append(event, *args, **kwargs)

            def record(iid: str, *args: Any, **kwargs: Any) -> Any:
                if len(lost) == 1:
                    lost.append(None)  # once: the gate's re-read
                    raise JournalUnavailable("the journal is away")
                return real_record(iid, *args, **kwargs)

            monkeypatch.setattr(journal, "append", append)
            monkeypatch.setattr(journal, "record", record)
            with trio.fail_after(LIMIT):
                env = await broker.call(POST)
            monkeypatch.undo()
            iid = env["invocation_id"]
            kinds = event_kinds(broker, iid)
            assert len(lost) == 2 and E.DISPATCH_STARTED not in kinds, kinds
            assert env["error"]["outcome"] == "not_attempted", (env, kinds)
            rec = broker.journal.record(iid)
            assert rec is not None and rec.final and rec.outcome.value == "not_attempted"
        assert srv.requests == []
