"""The approval's view shows the code the record's views show: none of the attempt before a
retry that holds its lease.

An approved POST is sent and its connection closes unanswered: the record rests ``unknown`` /
REMOTE_OUTCOME_UNKNOWN, and the approval's view (``affidavit approvals show``, the daemon's
approval route, the console's page: ``approvals.approval_view``) shows that code.  A retry takes
the next lease (``retry_pending``): the record's views show no code -- the running attempt has
produced none (``statemachine.current_code``) -- but the approval's view still showed the earlier
attempt's, beside a record that says ``fetch_result``.  Once the retry ends, its own code."""

from __future__ import annotations

import json
from pathlib import Path

from affidavit.statemachine import Event, EventKind
from affidavit.views import record_to_json
from tests.http.hostile import HostileServer, scripts

from .approvalkit import OPS, approval_config
from .helpers import affidavit_cli, open_broker

E = EventKind
CHARGE = {"target": "api", "method": "POST", "path": "/v1/charges", "body": '{"amount": 5}'}


async def test_the_approval_of_a_running_retry_shows_no_earlier_code(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.apply_then_close()) as srv:
        cfg = approval_config(tmp_path, srv.url)
        async with open_broker(cfg) as b:
            env = await b.call(CHARGE)
            assert env["error"]["code"] == "APPROVAL_PENDING"
            iid = env["invocation_id"]
            await b.approve(iid, operator=OPS)
            sent = await b.dispatch_approved(iid)
            assert sent is not None and sent["error"]["code"] == "REMOTE_OUTCOME_UNKNOWN", sent

            async def shown() -> list[dict]:
                cli = await affidavit_cli("approvals", "show", iid, "--config", str(cfg))
                assert cli.returncode == 0, cli.stderr
                return [b.approval(iid), json.loads(cli.stdout)]

            for view in await shown():  # at rest: the attempt's own code
                assert view["approval"] == "granted", view
                assert view["code"] == "REMOTE_OUTCOME_UNKNOWN", view
            lease = await b.journal.acquire_lease(iid, "worker-2", 60.0)
            rec = b.record(iid)
            assert rec is not None and rec.state == "retry_pending"
            assert record_to_json(rec)["code"] is None
            for view in await shown():  # a retry holds its lease: no code yet
                assert view["state"] == "retry_pending", view
                assert "code" not in view, view
            started = {"generation": lease.generation}
            await b.journal.append(Event(E.DISPATCH_STARTED, iid, started))
            ended = {"code": "REMOTE_RESULT_INCOMPLETE", "generation": lease.generation}
            await b.journal.append(Event(E.ATTEMPT_INTERRUPTED, iid, ended))
            for view in await shown():  # the retry ended: its own code
                assert view["code"] == "REMOTE_RESULT_INCOMPLETE", view
    assert len(srv.requests) == 1
