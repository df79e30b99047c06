"""A blind approval authorises the request that was sealed, and no other.  The operator's
view of it sealed to a key this broker lacks (so the view's ``request`` is None) and the
accepted action swapped for another body (what the dispatcher would read back): approving it is
refused REQUEST_UNREADABLE (field ``blind``) until the operator says ``blind``; the blind grant
names the fingerprint APPROVAL_REQUESTED recorded, and the dispatch gate, re-checking it
against the action it is about to send, answers APPROVAL_STALE -- nothing is sent."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from affidavit.approvals import OperatorError
from affidavit.journal.chain import canonical_json
from affidavit.journal.sealing import BrokerKey, payload_aad
from tests.http.hostile import HostileServer, Reply, scripts
from tests.journal.test_tamper import _rechain_from, _sql

from .approvalkit import OPS, approval_config, reseal_accepted
from .helpers import event_kinds, open_broker

CHARGE = {"target": "api", "method": "POST", "path": "/v1/charges", "body": '{"amount": 5}'}


def _seal_view_away(journal: Path, iid: str, key: BrokerKey) -> None:
    """APPROVAL_REQUESTED's payload (the operator's view) sealed with ``key`` instead, the
    rows re-chained, the checkpoints and signing key gone and the schema set back to 1 (as
    ``test_approval_unplaced``): a forger with write access and no key, who passes the journal
    off as one from before signing; the broker adopts the journal anew."""
    conn = sqlite3.connect(journal)
    try:
        (seq,) = conn.execute(
            "SELECT seq FROM events WHERE invocation_id = ? AND kind = 'APPROVAL_REQUESTED'",
            (iid,),
        ).fetchone()
        conn.execute("DROP TRIGGER IF EXISTS events_no_update")
        view = {"target": "api", "kind": "http", "credential": "env:X", "request": {}}
        sealed = key.seal(canonical_json(view).encode(), payload_aad(iid, "APPROVAL_REQUESTED"))
        conn.execute("UPDATE events SET payload = ? WHERE seq = ?", (sealed, seq))
        conn.commit()
    finally:
        conn.close()
    _sql(
        journal,
        ("DELETE FROM checkpoints", ()),
        ("DELETE FROM meta WHERE name IN ('signing_key_id', 'signing_public_key')", ()),
        ("UPDATE meta SET value = '1' WHERE name = 'schema'", ()),  # passed off as pre-signing
    )
    _rechain_from(journal, 1)
    for signing in journal.parent.glob("*sign*"):
        signing.unlink()


async def test_a_blind_grant_cannot_send_another_request_than_the_one_sealed(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"{}"))) as srv:
        cfg = approval_config(tmp_path, srv.url)
        journal = tmp_path / "journal.db"
        async with open_broker(cfg) as b:
            env = await b.call(CHARGE)
            assert env["error"]["code"] == "APPROVAL_PENDING", env
            iid = env["invocation_id"]
        mine = BrokerKey.load(Path(f"{journal}.key"))
        reseal_accepted(journal, iid, {**CHARGE, "body": '{"amount": 5000}'}, mine)
        _seal_view_away(journal, iid, BrokerKey.create(tmp_path / "another.key"))
        async with open_broker(cfg) as b:
            assert b.approval(iid)["request"] is None
            with pytest.raises(OperatorError) as refused:
                await b.approve(iid, operator=OPS)
            assert (refused.value.code, refused.value.field) == ("REQUEST_UNREADABLE", "blind")
            assert b.approval(iid)["approval"] == "pending"  # nothing recorded
            view = await b.approve(iid, operator=OPS, blind=True, note="looked on the remote")
            assert view["approval"] == "granted" and view["blind"] is True, view
            record = b.record(iid)
            assert record is not None and record.evidence["approval"]["blind"] is True
            b.watch_approvals()
            assert await b.approvals_ready() == [iid]
            await b.dispatch_approved(iid)
            record = b.record(iid)
            assert record is not None and record.code is not None
            assert record.code.value == "APPROVAL_STALE", record
            assert "DISPATCH_STARTED" not in {k.value for k in event_kinds(b, iid)}
    assert srv.requests == []
