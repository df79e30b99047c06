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
from .helpers import http_target, open_broker, write_config

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


@pytest.mark.parametrize("approving", [False, True])
async def test_an_idle_sweep_reads_the_journal_only_with_a_target_needing_approval(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, approving: bool
) -> None:
    """apprfix50c #9: the sweep's ``refresh`` read the journal every second in every daemon --
    with a shared journal frozen, that read held the loop before a client's own read was
    sent.  With no target needing approval and nothing open, it reads nothing."""
    async with HostileServer.running(scripts.serve(Reply(200, body=b"{}"))) as srv:
        if approving:
            cfg = approval_config(tmp_path, srv.url)
        else:
            cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as b:
            b.watch_approvals()
            journal, reads = b._engine.journal, []
            after = journal.approvals_after

            def counted(*a: object, **k: object) -> object:
                reads.append(a)
                return after(*a, **k)  # type: ignore[arg-type]

            monkeypatch.setattr(journal, "approvals_after", counted)
            for _ in range(3):
                assert await b.approvals_ready() == []
            assert len(reads) == (3 if approving else 0)
