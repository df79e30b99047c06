"""Property over every write a call waits for: the ``n``-th one's commit is lost
(``CommitUnknown``) while its session still holds the chain head, so every later write of the
call waits for the head in vain (``JournalWriteError``, not committed); then the lost COMMIT
lands.  Whatever the call answered must not be contradicted by the record the journal ends up
with: ``not_attempted`` only over a record without DISPATCH_STARTED and with nothing sent; a
complete result only if the record holds it.  ``settled``: what the call queued before the
lost write is committed first (as an approved or retried call's first events are), so there is
a durable record to answer from; else it rides in the lost transaction.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.engine import CallNotRecorded
from affidavit.journal import CommitUnknown, JournalError, JournalWriteError
from affidavit.statemachine import Event, EventKind, ImpossibleEvent
from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import event_kinds, http_target, open_broker, write_config

E = EventKind
LIMIT = 10
POST = {"target": "api", "method": "POST", "path": "/charge", "body": "{}"}
WRITES = 2  # the writes a plain call waits for (asserted below): each one lost in turn


@pytest.mark.parametrize("settled", [False, True], ids=["riding", "settled"])
@pytest.mark.parametrize("n", range(WRITES))
async def test_a_lost_commit_at_any_write_never_yields_an_answer_the_record_contradicts(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, n: int, settled: bool
) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as broker:
            writer = broker.journal._writer
            real_submit = writer.submit
            seen: list[int] = []
            held: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
            iids: list[str] = []
            real_append = broker.journal.append

            async def append(event: Any, *args: Any, **kwargs: Any) -> Any:
                iids.append(event.invocation_id)
                return await real_append(event, *args, **kwargs)

            async def submit(*args: Any, **kwargs: Any) -> Any:
                seen.append(len(seen))
                if held:
                    raise JournalWriteError("the chain head is still held: not committed")
                if len(seen) - 1 == n:
                    if settled and iids:
                        diag = Event(E.PROTOCOL_OBSERVED, iids[0], {"state": "x"})
                        await real_append(diag, barrier=True)
                    held.append((args, kwargs))
                    raise CommitUnknown("the commit's answer was lost; the head still held")
                return await real_submit(*args, **kwargs)

            monkeypatch.setattr(broker.journal, "append", append)
            monkeypatch.setattr(writer, "submit", submit)
            env: dict[str, Any] | None = None
            with trio.fail_after(LIMIT), contextlib.suppress(CallNotRecorded, JournalWriteError):
                env = await broker.call(POST)
            monkeypatch.undo()
            assert len(seen) > n, f"the call waited for {len(seen)} writes: no case {n}"
            if held:  # the lost COMMIT lands (unless it could not have committed anyway)
                gargs, gkwargs = held.pop()
                with contextlib.suppress(ImpossibleEvent, JournalError):
                    await real_submit(*gargs, **gkwargs)
            if env is None:
                return  # not recorded: its record tells, once read
            kinds = event_kinds(broker, env["invocation_id"])
            err = env.get("error")
            if err is not None and err["outcome"] == "not_attempted":
                assert E.DISPATCH_STARTED not in kinds, (n, env, kinds)
                assert srv.requests == [], (n, env)
            if err is None:  # a complete result: the record holds it
                assert E.RESULT_COMMITTED in kinds, (n, env, kinds)
