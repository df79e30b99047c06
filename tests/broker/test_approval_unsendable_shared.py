"""A grant on a shared journal that this broker's configuration cannot send (apprfix50c #1, #5).

Two brokers on one PostgreSQL journal, their ``api`` targets bound to different snapshots (a
rolling config change): the one that cannot send the grant as approved writes nothing -- the
other may still send it -- logs it once, and at the approval's expiry closes it APPROVAL_STALE
naming the target's settings (the change is why it was not sent), not APPROVAL_EXPIRED.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio
from trio.testing import MockClock

from affidavit.engine.approval import GRACE
from affidavit.journal.sealing import BrokerKey
from affidavit.statemachine import EventKind
from tests.http.hostile import HostileServer, Reply, scripts
from tests.postgres import Cluster

from .approvalkit import OPS, approval_config, verify_ok
from .helpers import assert_error, open_broker

E = EventKind
CHARGE = {"target": "api", "method": "POST", "path": "/v1/charges", "body": '{"amount": 5}'}
POLICY = {"methods": ["POST"], "ttl": "4s", "wait": "0s"}
LIMIT = 20


def _config(tmp: Path, url: str, remote: str, name: str, total: int, ttl: str) -> Path:
    """Target ``api`` on the shared journal at ``url``; ``total``: its timeout (another
    total: another snapshot)."""
    journal = {
        "url": url,
        "key_file": str(tmp / "shared.key"),
        "signing_key": str(tmp / f"{name}.signing.key"),
    }
    return approval_config(
        tmp,
        remote,
        approval={**POLICY, "ttl": ttl},
        name=f"{name}.toml",
        journal=journal,
        timeout={"connect": 2, "total": total},
    )


async def test_a_grant_this_broker_cannot_send_is_left_then_closed_stale_at_its_expiry(
    pg: Cluster, tmp_path: Path, token: str, caplog: pytest.LogCaptureFixture
) -> None:
    BrokerKey.create(tmp_path / "shared.key")
    url = pg.database()

    async with HostileServer.running(scripts.serve(Reply(200, body=b"{}"))) as srv:
        with trio.fail_after(LIMIT):
            async with (
                open_broker(_config(tmp_path, url, srv.url, "one", 5, "4s")) as one,
                open_broker(_config(tmp_path, url, srv.url, "two", 6, "4s")) as two,
            ):
                env = await one.call(CHARGE)
                assert env["error"]["code"] == "APPROVAL_PENDING"
                iid = str(env["invocation_id"])
                await two.approve(iid, operator=OPS)
                events = len(two.events(iid))
                with caplog.at_level(logging.WARNING, logger="affidavit"):
                    assert await two.dispatch_approved(iid) is None
                    assert await two.dispatch_approved(iid) is None
                # Nothing written: ``one`` can still send it.
                assert len(two.events(iid)) == events
                assert two.record(iid).state == "approved"  # type: ignore[union-attr]
                left = [r for r in caplog.records if "left unsent here" in r.getMessage()]
                assert len(left) == 1, left  # once per invocation
                assert "targets.api" in left[0].getMessage()
                while two.record(iid).state == "approved":  # type: ignore[union-attr]
                    await trio.sleep(0.1)  # the approval's 4 s run out
                    await two.dispatch_approved(iid)
                rec = assert_error(
                    two,
                    await two.fetch_result(iid) or {},
                    phase="validation",
                    outcome="not_attempted",
                    retry="after_correction",
                    code="APPROVAL_STALE",
                )
                assert rec.field == "targets.api"
                assert E.DISPATCH_LEASE_ACQUIRED not in [e.kind for e in two.events(iid)]
                verify_ok(two)
    assert srv.requests == []


async def test_a_grant_left_unsent_here_is_not_read_again_by_each_sweep(
    pg: Cluster, tmp_path: Path, token: str, mock_clock: MockClock
) -> None:
    """apprfix50c #6: once left (``ApprovalBoard.unsendable``, keyed by its expiry), the sweep
    neither re-reads it nor hands it to the dispatcher again every second."""
    BrokerKey.create(tmp_path / "shared.key")
    url = pg.database()
    async with HostileServer.running(scripts.serve(Reply(200, body=b"{}"))) as srv:
        one_cfg = _config(tmp_path, url, srv.url, "one", 5, "1h")
        two_cfg = _config(tmp_path, url, srv.url, "two", 6, "1h")
        async with open_broker(one_cfg) as one, open_broker(two_cfg) as two:
            two.watch_approvals()
            env = await one.call(CHARGE)
            iid = str(env["invocation_id"])
            await one.approve(iid, operator=OPS)
            assert await two.approvals_ready() == []  # the grant learnt: its grace
            mock_clock.jump(GRACE)
            assert await two.approvals_ready() == [iid]
            assert await two.dispatch_approved(iid) is None  # left: not sendable here
            journal, reads = two._engine.journal, []
            record = journal.record

            def counted(i: str, *a: object, **k: object) -> object:
                reads.append(i)
                return record(i, *a, **k)  # type: ignore[arg-type]

            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(journal, "record", counted)
                for _ in range(3):
                    mock_clock.jump(1.0)
                    assert await two.approvals_ready() == []
            assert iid not in reads
    assert srv.requests == []
