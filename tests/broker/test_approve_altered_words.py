"""A request whose sealed view was altered in place is called altered by every surface that
reads it with the journal's own key: the broker's own writing journal (an embedded
``Broker.approval``, the REQUEST_UNREADABLE refusal of ``approve``) as well as a view reader
(the daemon's approval route).  The writing journal bound the key file as the journal's own
(``connect.bind_keys``), so a sealed payload that does not open with it is an altered row
(``AlteredRow``: JOURNAL_UNREADABLE), not a key this broker may lack."""

from __future__ import annotations

from pathlib import Path

import pytest

from affidavit.approvals import OperatorError
from affidavit.approvals.service import ALTERED
from affidavit.journal import AlteredRow, JournalReader
from tests.daemon.test_approval_unplaced import _alter_sealed_request
from tests.http.hostile import HostileServer, Reply, scripts

from .approvalkit import OPS, approval_config
from .helpers import open_broker

CHARGE = {"target": "api", "method": "POST", "path": "/v1/charges", "body": '{"amount": 5}'}


async def test_an_altered_sealed_request_is_called_altered_by_the_writing_journal_too(
    tmp_path: Path, token: str
) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"{}"))) as srv:
        cfg = approval_config(tmp_path, srv.url)
        db = tmp_path / "journal.db"
        async with open_broker(cfg) as b:
            env = await b.call(CHARGE)
            assert env["error"]["code"] == "APPROVAL_PENDING", env
            iid = env["invocation_id"]
        _alter_sealed_request(db, iid, tmp_path / "journal.db.signing.key")
        async with open_broker(cfg) as b:
            requested = next(e for e in b.events(iid) if e.kind.value == "APPROVAL_REQUESTED")
            assert requested.seq is not None
            key_file = tmp_path / "journal.db.key"
            with JournalReader.open(db, key_file=key_file) as r, pytest.raises(AlteredRow):
                r.payload(requested.seq)
            with pytest.raises(AlteredRow):  # the broker's own journal: the same words
                b.journal.payload(requested.seq)
            assert b.approval(iid)["request_unreadable"] == ALTERED
            with pytest.raises(OperatorError) as refused:
                await b.approve(iid, operator=OPS)
            assert (refused.value.code, refused.value.field) == ("REQUEST_UNREADABLE", "blind")
            assert ALTERED in refused.value.message, refused.value.message
    assert srv.requests == []
