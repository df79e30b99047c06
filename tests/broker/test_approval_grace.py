"""The courtesy wait counts from the grant, not from the request (apprfix50b #2, apprfix50c #4).

A request asked through another broker on a shared journal may have its caller waiting there:
a dispatcher leaves its grant to that caller for ``GRACE`` after it learns of the grant.  Here
on trio's ``MockClock`` (advanced by hand, never by the machine's speed): the request learnt,
the clock taken well past ``GRACE``, then the grant learnt -- the sweep returns nothing just
before ``GRACE`` and the invocation at it.  Counted from the request (before apprfix50b) it was
returned at once."""

from __future__ import annotations

from pathlib import Path

from trio.testing import MockClock

from affidavit.engine.approval import GRACE
from affidavit.journal.sealing import BrokerKey
from tests.http.hostile import HostileServer, Reply, scripts
from tests.postgres import Cluster

from .approvalkit import OPS, approval_config
from .helpers import open_broker

CHARGE = {"target": "api", "method": "POST", "path": "/v1/charges", "body": '{"amount": 5}'}
POLICY = {"methods": ["POST"], "ttl": "1h", "wait": "0s"}


async def test_a_grant_learnt_is_left_for_grace_after_the_grant_not_the_request(
    pg: Cluster, tmp_path: Path, token: str, mock_clock: MockClock
) -> None:
    BrokerKey.create(tmp_path / "shared.key")
    url = pg.database()

    def config(name: str) -> Path:
        journal = {
            "url": url,
            "key_file": str(tmp_path / "shared.key"),
            "signing_key": str(tmp_path / f"{name}.signing.key"),
        }
        return approval_config(
            tmp_path, srv.url, approval=POLICY, name=f"{name}.toml", journal=journal
        )

    async with (
        HostileServer.running(scripts.serve(Reply(200, body=b"{}"))) as srv,
        open_broker(config("asker")) as asker,
        open_broker(config("other")) as other,
    ):
        other.watch_approvals()
        env = await asker.call(CHARGE)
        assert env["error"]["code"] == "APPROVAL_PENDING"
        iid = str(env["invocation_id"])
        assert await other.approvals_ready() == []  # the request learnt: awaiting
        mock_clock.jump(10 * GRACE)  # well past the wait since the request was learnt
        await asker.approve(iid, operator=OPS)  # granted elsewhere: learnt by a sweep
        assert await other.approvals_ready() == []  # the grant learnt now
        mock_clock.jump(GRACE - 0.01)
        assert await other.approvals_ready() == []
        mock_clock.jump(0.01)
        assert await other.approvals_ready() == [iid]
    assert srv.requests == []
