"""The dispatch gate of an approved request reads the database's clock (``approval_now``: an
approval's expiry is judged by the clock it is recorded in).  On a shared journal that read may
be declined (``ReadFailed``: a statement timeout, a lock not granted).  Nothing was sent then,
and the gate never wrote DISPATCH_STARTED: the call answers an honest envelope -- not_attempted,
JOURNAL_READ_DECLINED -- never a traceback, and never sends.  The approval stays dispatchable:
the same dispatch, once the read is answered, sends the request once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

import affidavit.engine.attempt as attempt
from affidavit.journal import ReadFailed
from affidavit.journal.reader import JournalReader
from affidavit.statemachine import EventKind
from tests.http.hostile import HostileServer, Reply, scripts
from tests.postgres import Cluster

from .awaykit import state_of
from .test_journal_away_approved_dispatch import _approved
from .test_journal_away_mid_call import LIMIT


def _decline_gate_clock(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The database declines the gate's read of its clock, once (the read itself raises, as
    ``JournalReader._read`` words a statement timeout); every other read is answered."""
    real_now = attempt.approval_now
    real_db = JournalReader.database_now
    at_gate: list[bool] = []
    declined: list[str] = []

    async def gate_now(recorder: Any) -> float:
        at_gate.append(True)
        try:
            return await real_now(recorder)
        finally:
            at_gate.pop()

    def database_now(self: JournalReader, purpose: str | None = None) -> float | None:
        if at_gate and not declined:
            declined.append("gate")
            raise ReadFailed("canceling statement due to statement timeout")
        return real_db(self, purpose)

    monkeypatch.setattr(attempt, "approval_now", gate_now)
    monkeypatch.setattr(JournalReader, "database_now", database_now)
    return declined


async def test_a_declined_clock_read_at_the_gate_is_not_attempted(
    tmp_path: Path, token: str, pg: Cluster, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with HostileServer.running(scripts.serve(Reply(201, body=b"{}"))) as srv:
        with trio.fail_after(LIMIT):
            async with _approved(tmp_path, srv.url, pg_url) as (broker, iid):
                declined = _decline_gate_clock(monkeypatch)
                env = await broker.dispatch_approved(iid)
                assert declined == ["gate"]
                assert env is not None, env
                err = env["error"]
                assert (err["phase"], err["outcome"], err["code"]) == (
                    "connection_setup",
                    "not_attempted",
                    "SETUP_FAILED",
                ), env
                # The journal stopped it, never a transport that did not fail.
                assert "transport" not in err["message"], err
                assert err["message"].startswith("The journal could not answer a read"), err
                assert env["evidence"]["dispatch_started"] is False, env
                assert srv.requests == []  # nothing was sent
                kinds = [e.kind for e in broker.events(iid)]
                assert EventKind.DISPATCH_STARTED not in kinds, kinds
                # The approval was spent on an attempt that sent nothing; it is not sent later.
                assert state_of(pg_url, iid) == "setup_failed"
                assert await broker.dispatch_approved(iid) is None
    assert len(srv.requests) == 0
