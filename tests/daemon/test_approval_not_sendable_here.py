"""A grant is left to a daemon that can send it (apprfix50b #1).

On a shared journal every daemon learns every approval (``engine.approval.refresh``).  One
whose configuration lacks the approved request's target, or binds it to another snapshot (a
rolling config change), cannot send it as approved: it must not take the dispatch lease and
end it APPROVAL_STALE under the caller waiting elsewhere (``approval.unsendable``) -- it
writes nothing, and the daemon that can send it does.

Real ``affidavit serve`` processes, a real PostgreSQL, the scripted remote counting what it
received; every wait bounded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.client import Client
from affidavit.journal.sealing import BrokerKey
from tests.http.hostile import HostileServer, Reply, scripts
from tests.postgres import Cluster

from .kit import api_target, start_daemon, start_sharing, stop, wait_until
from .test_approvals_shared import IDEM, SETTLE, _asked_then_stopped, _kinds

SERVICE = {"allow_self_approval": True, "lease_margin": 1, "operator_uids": [0]}
POLICY = {"methods": ["POST"], "ttl": "60s"}


def _variant(remote: str, how: str) -> dict[str, Any]:
    """d2's targets: ``api`` missing, or ``api`` bound to another snapshot (a longer total)."""
    if how == "missing":
        return {"other": api_target(remote)["api"]}
    longer = {"connect": 2, "total": 6}
    return api_target(remote, idempotency=IDEM, approval=POLICY, timeout=longer)


@pytest.mark.parametrize("how", ["missing", "differs"])
async def test_a_daemon_that_cannot_send_a_grant_leaves_it_to_one_that_can(
    pg: Cluster, tmp_path: Path, token: str, how: str
) -> None:
    BrokerKey.create(tmp_path / "shared.key")
    async with HostileServer.running(scripts.serve(Reply(200, body=b"{}"))) as srv:
        own = api_target(srv.url, idempotency=IDEM, approval=POLICY)
        url, procs = pg.database(), []
        try:
            for name, targets in (("d1", own), ("d2", _variant(srv.url, how))):
                procs.append(await start_sharing(tmp_path, name, url, targets, token, SERVICE))
            d1, d2 = procs
            iid = await _asked_then_stopped(d1)
            async with Client.open(d2.socket) as c:
                await c.approve(iid, note="on d2, which cannot send it")
            # d2's dispatcher says it leaves it, once it has (apprfix50c #5: no sleep to beat).
            left = f"approved {iid} is left unsent here: targets.api changed since"
            await wait_until(lambda: left in d2.log_text(), "d2 leaves the grant", 10)
            assert srv.requests == []
            # The asking daemon, back, sends it (found open at its start): d2 left it approved,
            # no lease taken, nothing written (it ended APPROVAL_STALE before the fix).
            d1 = await start_daemon(d1.config, d1.socket, d1.log, token)
            procs.append(d1)
            await wait_until(lambda: len(srv.requests) >= 1, "d1 sends the grant", 10)
            await trio.sleep(SETTLE)
            kinds = await _kinds(d1, iid)
            assert len(srv.requests) == 1
            assert "PREFLIGHT_FAILED" not in kinds, kinds
            assert kinds.count("DISPATCH_LEASE_ACQUIRED") == 1, kinds
            assert kinds.count("REQUEST_SENT") == 1
            assert "RESULT_COMMITTED" in kinds
        finally:
            for p in procs:
                stop(p)
