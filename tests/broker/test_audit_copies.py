"""``[journal] auditor_public_key`` end to end (issue 9, item 3): a real call through the broker
leaves sealed auditor copies of the accepted action and of the stored result; the auditor opens
them with its private key (``affidavit journal audit-open``), they hold no credential, and the
broker's own key opens none of them."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import trio

from affidavit.cli import main as cli_main
from affidavit.journal import JournalError, generate_auditor_keypair
from affidavit.journal.sealing import BrokerKey, payload_aad
from affidavit.statemachine import EventKind
from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import assert_ok, http_target, open_broker, write_config

LIMIT = 10


async def test_the_auditor_gets_the_action_and_the_result_and_the_broker_cannot_open_them(
    tmp_path: Path, token: str, capsys: pytest.CaptureFixture[str]
) -> None:
    auditor_host = tmp_path / "auditor"
    auditor_host.mkdir()
    priv, pub = auditor_host / "auditor.pem", tmp_path / "auditor.pub"
    generate_auditor_keypair(priv, pub)
    action = {"target": "api", "method": "POST", "path": "/charges", "body": '{"amount":5}'}
    async with HostileServer.running(scripts.serve(Reply(201, body=b'{"id":"ch_1"}'))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        text = cfg.read_text().replace("[journal]\n", f'[journal]\nauditor_public_key = "{pub}"\n')
        cfg.write_text(text)
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                env = await broker.call(action)
            assert_ok(broker, env)
            iid = env["invocation_id"]
            accepted = next(e for e in broker.events(iid) if e.kind is EventKind.ACTION_ACCEPTED)
    db = tmp_path / "journal.db"
    conn = sqlite3.connect(db)
    (copies,) = conn.execute("SELECT sum(audit IS NOT NULL) FROM events").fetchone()
    (sealed,) = conn.execute("SELECT audit FROM events WHERE seq = ?", (accepted.seq,)).fetchone()
    conn.close()
    assert copies >= 1  # the query answered 0 before

    journal_pub = tmp_path / "journal.pub"
    assert cli_main(["journal", "public-key", "--config", str(cfg), "--out", str(journal_pub)]) == 0
    base = ["journal", "audit-open", "--journal", str(db), "--key", str(priv)]
    base += ["--public-key", str(journal_pub)]
    capsys.readouterr()
    assert cli_main([*base, "--seq", str(accepted.seq)]) == 0
    opened = capsys.readouterr().out
    assert json.loads(opened) == {"action": action}
    assert cli_main([*base, "--result", iid]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["body"] == '{"id":"ch_1"}' and result["status"] == 201
    assert token not in opened  # the action is sealed as sent: no credential is in it yet

    # The broker's key opens neither copy.
    with pytest.raises(JournalError):
        BrokerKey.load(f"{db}.key").open(bytes(sealed), payload_aad(iid, "ACTION_ACCEPTED"))
