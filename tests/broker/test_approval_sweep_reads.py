"""The daemon's sweep (``engine.approval.ready``, every second) does not re-read an approval
that awaits a decision (apprfix50b #6): it keeps the approval's ``expires_at`` on the board
(``ApprovalBoard.pending``) and reads the record again only once a grant of it is learnt or
its window has passed -- every open approval of a shared journal, pending ones included, was
read (record and lease) at every sweep.  The count is of the journal's reads of that record,
through a wrapper around the real journal (no behaviour replaced)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from affidavit.api.broker import Broker
from tests.http.hostile import HostileServer, Reply, scripts

from .approvalkit import OPS, approval_config
from .helpers import open_broker

CHARGE = {"target": "api", "method": "POST", "path": "/v1/charges", "body": '{"amount": 5}'}


def _count_reads(broker: Broker, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    journal = broker._engine.journal
    reads: dict[str, int] = {}
    record, lease = journal.record, journal.lease

    def counted_record(iid: str, *a: object, **k: object) -> object:
        reads[iid] = reads.get(iid, 0) + 1
        return record(iid, *a, **k)  # type: ignore[arg-type]

    def counted_lease(iid: str) -> object:
        reads[iid] = reads.get(iid, 0) + 1
        return lease(iid)

    monkeypatch.setattr(journal, "record", counted_record)
    monkeypatch.setattr(journal, "lease", counted_lease)
    return reads


async def test_a_pending_approval_is_read_again_only_once_granted(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"{}"))) as srv:
        cfg = approval_config(tmp_path, srv.url)
        async with open_broker(cfg) as b:
            b.watch_approvals()
            env = await b.call(CHARGE)
            assert env["error"]["code"] == "APPROVAL_PENDING"
            iid = str(env["invocation_id"])
            reads = _count_reads(b, monkeypatch)
            assert await b.approvals_ready() == []  # read once: pending, until its expiry
            first = reads.get(iid, 0)
            assert first >= 1
            for _ in range(5):
                assert await b.approvals_ready() == []
            assert reads.get(iid, 0) == first  # five sweeps: not read again
            await b.approve(iid, operator=OPS)
            with trio.fail_after(10):
                ready = await b.approvals_ready()
            assert ready == [iid]  # the grant learnt: read again, and dispatched
