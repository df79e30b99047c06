"""A grant records what admitted its operator, and the dispatch gate re-checks that, with no
user-database lookup (apprfix50b #3).

The decision takes the caller's kernel credentials (``OperatorPolicy.is_operator``): a group
the kernel gave it (``sg``/``newgrp``, a container, a host sharing the journal that does not
know the uid) need not be one NSS knows.  APPROVAL_GRANTED's ``operator.admitted`` says which
uid or gid admitted the operator; ``Grant.disowned`` checks that against ``[service]
operator_uids`` / ``operator_gids`` as they are at the dispatch -- a group removed since
disowns the grant (APPROVAL_STALE at approval.operator), a group still listed sends it.
"""

from __future__ import annotations

import pwd
from pathlib import Path

from affidavit.approvals import Operator
from affidavit.statemachine import EventKind
from tests.http.hostile import HostileServer, Reply, scripts

from .approvalkit import approval_config, dispatched_stale, verify_ok
from .helpers import assert_ok, open_broker

E = EventKind
OK = Reply(200, body=b'{"ok": true}')
CHARGE = {"target": "api", "method": "POST", "path": "/v1/charges", "body": '{"amount": 5}'}
GID = 64987
"""A group only the kernel's credentials give the operator: no user database entry names it,
nor its uid."""
UID = 64986
OPERATOR = Operator(UID, GID, (), None, "socket")


def _unknown_to_nss() -> None:
    try:
        pwd.getpwuid(UID)
    except KeyError:
        return
    raise AssertionError(f"uid {UID} is in this host's user database: pick another")


async def _approved_by_group(cfg: Path) -> str:
    async with open_broker(cfg) as b:
        env = await b.call(CHARGE)
        assert env["error"]["code"] == "APPROVAL_PENDING", env
        iid = str(env["invocation_id"])
        await b.approve(iid, operator=OPERATOR)
        granted = next(e for e in b.journal.events(iid) if e.kind is E.APPROVAL_GRANTED)
        assert granted.attrs["operator"]["admitted"] == {"gid": GID}
        return iid


async def test_a_grant_admitted_by_a_group_nss_does_not_know_is_sent(
    tmp_path: Path, token: str
) -> None:
    _unknown_to_nss()
    async with HostileServer.running(scripts.serve(OK)) as srv:
        cfg = approval_config(tmp_path, srv.url, service={"operator_gids": [GID]})
        iid = await _approved_by_group(cfg)
        async with open_broker(cfg) as b:  # the caller gone: the daemon's dispatcher sends it
            await b.dispatch_approved(iid)
            assert_ok(b, await b.fetch_result(iid) or {})
            verify_ok(b)
    assert len(srv.requests) == 1


async def test_a_grant_whose_admitting_group_was_removed_is_approval_stale(
    tmp_path: Path, token: str
) -> None:
    _unknown_to_nss()
    async with HostileServer.running(scripts.serve(OK)) as srv:
        cfg = approval_config(tmp_path, srv.url, service={"operator_gids": [GID]})
        iid = await _approved_by_group(cfg)
        cfg.write_text(cfg.read_text().replace(f"operator_gids = [{GID}]", "operator_gids = [1]"))
        async with open_broker(cfg) as b:
            rec = await dispatched_stale(b, iid)
            assert rec.field == "approval.operator"
            assert f"uid {UID}" in (rec.message or "")
            verify_ok(b)
    assert srv.requests == []
