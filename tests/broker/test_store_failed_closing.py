"""A result store the journal refused, then both small follow-up events refused too
(``engine.delivery._store_failed``): the answer is rendered as the closing recovery will write
(``recovery.closing_event``).  Recovery comes in two ways, both checked against that answer on
``helpers.CLOSING_AGREES`` (code, phase, outcome, retry -- the message differs, and says so):
the daemon's start-up (``recover_orphans``, tests/broker/test_journal_faults.py and
test_store_failed_enospc.py) and, here, an embedded broker's read once the call's lease lapsed
(``recover_stale``, "lease_lapsed").  And when recovery would write nothing over the record,
nothing is rendered as if it would (audit 53b r2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

import affidavit.engine.delivery as delivery
from affidavit.api.broker import Broker
from affidavit.config import load_config
from affidavit.engine import CallNotRecorded, EngineSettings
from affidavit.engine.recovery import _AFTER_DISPATCH, closing_event
from affidavit.journal import JournalWriteError
from affidavit.statemachine import Event, EventKind
from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import (
    assert_closed_as_rendered,
    assert_unknown_after_dispatch,
    http_target,
    until_lease_lapsed,
    write_config,
)
from .test_journal_faults import BIG, POST, DiskFull

LIMIT = 30


async def test_an_embedded_read_after_the_lease_lapsed_closes_it_as_answered(
    tmp_path: Path, token: str
) -> None:
    """The disk is full from the first result chunk on, then free again; the embedded broker
    stays up, and once the call's lease lapsed a read closes the record (``recover_stale``,
    ATTEMPT_INTERRUPTED "lease_lapsed") with the code, phase, outcome and retry the call was
    answered -- its message the lease's, the call's the journal's."""
    async with HostileServer.running(scripts.serve(Reply(201, body=BIG))) as srv:
        target = http_target(srv.url, timeout={"connect": 1, "total": 1})
        cfg = load_config(write_config(tmp_path, {"api": target}))
        with trio.fail_after(LIMIT):
            async with Broker.open(config=cfg, settings=EngineSettings(lease_margin=0.0)) as b:
                full = DiskFull(b.journal, lambda kinds, chunks: chunks > 0, stays_full=True)
                b.journal.before_commit = full
                env = await b.call(POST)
                assert_unknown_after_dispatch(env)  # its message the journal's
                iid = env["invocation_id"]
                b.journal.before_commit = None  # the disk is free again
                assert full.failed >= 2  # the chunks, then the first small event
                (accepted,) = [e for e in b.events(iid) if e.kind is EventKind.ACTION_ACCEPTED]
                await until_lease_lapsed(accepted)
                recovered = await b.fetch_result(iid)
                assert recovered is not None
                closing = b.events(iid)[-1]
                assert closing.kind is EventKind.ATTEMPT_INTERRUPTED
                assert recovered["error"]["message"] == _AFTER_DISPATCH["lease_lapsed"]
                assert_closed_as_rendered(env, recovered)
        assert len(srv.requests) == 1


async def test_a_record_recovery_would_not_close_is_not_rendered_closed(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``closing_event`` finds nothing to close (the record moved on, or rests where recovery
    writes nothing): the call is not recorded (``CallNotRecorded``: its record, read once the
    journal takes writes, says what it proves) -- no RESULT_STORE_FAILED, retry never, rendered
    over a record recovery never gives one (audit 53b r2: the leftover fallback did)."""
    monkeypatch.setattr(delivery, "closing_event", lambda record, stage: None)
    async with HostileServer.running(scripts.serve(Reply(201, body=BIG))) as srv:
        cfg = load_config(write_config(tmp_path, {"api": http_target(srv.url)}))
        with trio.fail_after(LIMIT):
            async with Broker.open(config=cfg) as b:
                full = DiskFull(b.journal, lambda kinds, chunks: chunks > 0, stays_full=True)
                b.journal.before_commit = full
                with pytest.raises(CallNotRecorded) as info:
                    await b.call(POST)
                iid = info.value.invocation_id
                assert iid is not None
                b.journal.before_commit = None
                kinds = [e.kind for e in b.events(iid)]
                assert EventKind.RESULT_STORE_FAILED not in kinds, kinds
        assert len(srv.requests) == 1


@pytest.mark.parametrize("still_full", [True, False], ids=["disk-full", "disk-free"])
async def test_a_record_closed_before_the_re_read_is_a_lost_lease(
    tmp_path: Path, token: str, still_full: bool
) -> None:
    """Recovery closes the record (ATTEMPT_INTERRUPTED, "lease_lapsed") after the store
    failure's first read, as its first small follow-up event is refused: the re-read finds it
    final, and the call is answered as the lost lease it is (``ImpossibleEvent``): LEASE_LOST
    recorded when the disk is free again, the record as recovery closed it while it is still
    full -- never a closing this call would render over it (audit 53b r2, r3)."""
    async with HostileServer.running(scripts.serve(Reply(201, body=BIG))) as srv:
        cfg = load_config(write_config(tmp_path, {"api": http_target(srv.url)}))
        with trio.fail_after(LIMIT):
            async with Broker.open(config=cfg) as b:
                recorder = b._engine.recorder
                real = recorder.append
                full = DiskFull(b.journal, lambda kinds, chunks: chunks > 0, stays_full=True)
                b.journal.before_commit = full
                closed: list[Event] = []

                async def append(event: Event, **kwargs: Any) -> Any:
                    follow_up = (EventKind.REMOTE_RESPONSE_COMPLETE, EventKind.RESULT_STORE_FAILED)
                    if event.kind in follow_up and not closed:
                        b.journal.before_commit = None
                        closing = closing_event(
                            await recorder.record(event.invocation_id), "lease_lapsed"
                        )
                        assert closing is not None
                        closed.append(closing)
                        await real(closing, barrier=True)
                        if still_full:
                            b.journal.before_commit = full
                        raise JournalWriteError("database or disk is full")
                    return await real(event, **kwargs)

                recorder.append = append  # type: ignore[method-assign]
                env = await b.call(POST)
                b.journal.before_commit = None
                kinds = [e.kind for e in b.events(env["invocation_id"])]
        assert closed and closed[0].kind is EventKind.ATTEMPT_INTERRUPTED
        assert EventKind.RESULT_STORE_FAILED not in kinds, kinds
        err = env["error"]
        assert (err["phase"], err["outcome"]) == ("remote_execution", "unknown"), err
        if still_full:  # nothing more recorded: answered as the record recovery closed
            assert err["code"] == "REMOTE_OUTCOME_UNKNOWN", err
            assert err["message"] == _AFTER_DISPATCH["lease_lapsed"]
            assert kinds[-1] is EventKind.ATTEMPT_INTERRUPTED, kinds
        else:  # the lost lease recorded over it
            assert err["code"] == "LEASE_LOST" and kinds[-1] is EventKind.LEASE_LOST, (err, kinds)
        assert len(srv.requests) == 1
