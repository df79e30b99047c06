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


async def test_a_grant_this_broker_cannot_send_is_left_then_closed_stale_at_its_expiry(
    pg: Cluster, tmp_path: Path, token: str, caplog: pytest.LogCaptureFixture
) -> None:
    BrokerKey.create(tmp_path / "shared.key")
    url = pg.database()

    def config(name: str, total: int) -> Path:
        journal = {
            "url": url,
            "key_file": str(tmp_path / "shared.key"),
            "signing_key": str(tmp_path / f"{name}.signing.key"),
        }
        timeout = {"connect": 2, "total": total}
        return approval_config(
            tmp_path,
            srv.url,
            approval=POLICY,
            name=f"{name}.toml",
            journal=journal,
            timeout=timeout,
        )

    async with HostileServer.running(scripts.serve(Reply(200, body=b"{}"))) as srv:
        with trio.fail_after(LIMIT):
            async with open_broker(config("one", 5)) as one, open_broker(config("two", 6)) as two:
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
